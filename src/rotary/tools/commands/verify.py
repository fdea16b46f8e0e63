"""``rotary verify``: check RoPE's defining properties for a configuration; exit 1 on failure.

A Hugging Face config of a model with multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) is checked as
M-RoPE (:func:`rotary.analysis.verify_mrope`), never as the 1-D RoPE of its text positions;
``--axial PRESET`` and ``--mixed`` check axial RoPE and RoPE-Mixed (:func:`rotary.analysis.verify_axial`).
"""

from __future__ import annotations

import argparse

import torch

from rotary.analysis import Check, verify, verify_axial, verify_mrope

from ...errors import InputError
from .argument_types import count, seed, seq_len_count
from .configuration import PRESET_REPLACES, add_config_arguments, check_heads_need_mixed, every_layer_type, flags_given
from .output import add_output_argument
from .printing import console, print_json

__all__ = ["register", "render"]


def render(checks: list[Check], title: str) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ["", "check", "worst error", "tolerance"]:
        table.add_column(col, justify="left" if col in ("", "check") else "right")
    for c in checks:
        table.add_row(
            "[green]PASS[/]" if c.passed else "[bold red]FAIL[/]", c.name, f"{c.worst_error:.2e}", f"{c.tolerance:.1e}"
        )
    out = console()
    out.print(table)
    failed = sum(not c.passed for c in checks)
    out.print("all checks passed" if not failed else f"[bold red]{failed} check(s) FAILED[/]")


def _verify(args: argparse.Namespace) -> int:
    check_heads_need_mixed(args)
    if args.axial or args.mixed:
        label, checks = _verify_vision(args)
        results = [(None, label, checks)]
    else:  # a config with one RoPE block per layer type (Gemma-3): every layer type, unless --layer-type picks one
        results = []
        for c in every_layer_type(args):
            if c.mrope is not None:  # Qwen-VL: the 1-D RoPE is right for text positions only
                checks = verify_mrope(c.mrope, seq_len=args.seq_len, shift=c.context, seed=args.seed)
                results.append((c.layer_type, repr(c.mrope), checks))
            else:
                checks = verify(c.rope, seq_len=args.seq_len, offset=c.context, seed=args.seed)
                results.append((c.layer_type, repr(c.rope), checks))
    ok = all(c.passed for _, _, checks in results for c in checks)
    as_dict = [
        {
            "layer_type": layer_type,
            "rope": label,
            "passed": all(c.passed for c in checks),
            "checks": [c.to_dict() for c in checks],
        }
        for layer_type, label, checks in results
    ]
    if args.json:
        print_json(
            as_dict[0] if len(results) == 1 else {"passed": ok, "layer_types": {d["layer_type"]: d for d in as_dict}}
        )
    else:
        for j, (layer_type, label, checks) in enumerate(results):
            if j:
                print()
            render(checks, (f"layer type {layer_type}: " if layer_type else "") + f"verify {label}")
    return 0 if ok else 1


def _verify_vision(args: argparse.Namespace) -> tuple[str, list[Check]]:
    """The N-D checks of ``--axial PRESET`` and/or ``--mixed`` (with both, each check names its module)."""
    from rotary.variants import AxialRoPE, RoPEMixed

    given = flags_given(args, PRESET_REPLACES)
    if getattr(args, "config", None) is not None or given:
        what = " and ".join(
            filter(None, (f"--axial {args.axial}" if args.axial else "", "--mixed" if args.mixed else ""))
        )
        whose = {
            (True, False): "the preset's",
            (False, True): "RoPE-Mixed's",
            (True, True): "the preset's and RoPE-Mixed's",
        }
        raise InputError(
            f"{what} takes {whose[bool(args.axial), args.mixed]} configuration; drop {', '.join(given) or 'CONFIG'} "
            "(--head-dim may change)"
        )
    modules = []
    if args.axial:
        modules.append((f"axial {args.axial}", AxialRoPE.preset(args.axial, args.head_dim)))
    if args.mixed:
        heads = 4 if args.heads is None else args.heads
        generator = torch.Generator().manual_seed(args.seed)  # the per-head angles, as `rotary plot axial --mixed`
        modules.append(("RoPE-Mixed", RoPEMixed(args.head_dim or 64, heads, generator=generator)))
    checks = []
    for name, module in modules:
        for check in verify_axial(module, seed=args.seed):
            checks.append(
                Check(f"{name}: {check.name}", check.worst_error, check.tolerance) if len(modules) > 1 else check
            )
    return " and ".join(repr(m) for _, m in modules), checks


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check norms, the relative property, matrix/complex/fast forms and table pairing",
        description="Runs the configuration through the fast path and compares it with the block-diagonal matrix "
        "and complex references; exit status 1 when any check fails. A Qwen2-VL / Qwen2.5-VL / Qwen3-VL config "
        "is checked as multimodal RoPE (M-RoPE): the relative property along t, h and w and jointly, fast == "
        "the block-diagonal N-D matrix, text ids == 1-D RoPE. A config with one RoPE block per layer type "
        "(Gemma-3) is checked for every layer type, one table each, unless --layer-type picks one.",
    )
    add_config_arguments(p)
    p.add_argument("--seq-len", type=seq_len_count, default=64, help="positions to check (default 64)")
    from rotary.variants import PRESETS

    p.add_argument(
        "--axial",
        metavar="PRESET",
        choices=list(PRESETS),
        help=f"check an axial RoPE preset instead ({', '.join(PRESETS)}): the N-D relative property per axis, "
        "fast == block-diagonal N-D matrix, identity tokens",
    )
    p.add_argument(
        "--mixed",
        action="store_true",
        help='check a RoPE-Mixed ("Rotary Position Embedding for Vision Transformer") with random per-head angles '
        "(seeded by --seed): the same N-D checks, per head",
    )
    p.add_argument(
        "--heads", type=count(16, "each head is checked"), help="heads of the RoPE-Mixed (default 4; needs --mixed)"
    )
    p.add_argument(
        "--seed", type=seed, default=0, help="seed of the random q, k and of RoPE-Mixed's angles (default 0)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_output_argument(p, "file", None, "write the output to this file")
    p.set_defaults(func=_verify)
