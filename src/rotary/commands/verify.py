"""``rotary verify``: check RoPE's defining properties for a configuration; exit 1 on failure."""

from __future__ import annotations

import argparse

from rotary.analysis import Check, verify, verify_axial

from .common import (
    add_config_arguments,
    add_output_argument,
    console,
    every_layer_type,
    print_json,
    seed,
    seq_len_count,
)

__all__ = ["register", "render"]


def render(checks: list[Check], title: str) -> None:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ["", "check", "worst error", "tolerance"]:
        table.add_column(col, justify="left" if col in ("", "check") else "right")
    for c in checks:
        table.add_row("[green]PASS[/]" if c.passed else "[bold red]FAIL[/]", c.name, f"{c.worst_error:.2e}", f"{c.tolerance:.1e}")
    out = console()
    out.print(table)
    failed = sum(not c.passed for c in checks)
    out.print("all checks passed" if not failed else f"[bold red]{failed} check(s) FAILED[/]")


def _verify(args: argparse.Namespace) -> int:
    if args.axial:
        rope, checks = _verify_axial(args)
        results = [(None, rope, checks)]
    else:  # a config with one RoPE block per layer type (Gemma-3): every layer type, unless --layer-type picks one
        results = [
            (c.layer_type, c.rope, verify(c.rope, seq_len=args.seq_len, offset=c.context, seed=args.seed))
            for c in every_layer_type(args)
        ]
    ok = all(c.passed for _, _, checks in results for c in checks)
    as_dict = [
        {"layer_type": layer_type, "rope": repr(rope), "passed": all(c.passed for c in checks), "checks": [c.to_dict() for c in checks]}
        for layer_type, rope, checks in results
    ]
    if args.json:
        print_json(as_dict[0] if len(results) == 1 else {"passed": ok, "layer_types": {d["layer_type"]: d for d in as_dict}})
    else:
        for j, (layer_type, rope, checks) in enumerate(results):
            if j:
                print()
            render(checks, (f"layer type {layer_type}: " if layer_type else "") + f"verify {rope}")
    return 0 if ok else 1


def _verify_axial(args: argparse.Namespace):
    """``--axial PRESET``: the N-D checks of an axial preset (``--head-dim`` overrides the model's)."""
    from rotary.variants import AxialRoPE

    keys = ("base", "rotary_dim", "scaling", "max_position", "pairing", "interleaved", "layer_type")
    given = [f"--{k.replace('_', '-')}" for k in keys if getattr(args, k, None) is not None]
    if getattr(args, "config", None) is not None or given:
        raise ValueError(f"--axial {args.axial} takes the preset's configuration; drop {', '.join(given) or 'CONFIG'} (--head-dim may change)")
    rope = AxialRoPE.preset(args.axial, args.head_dim)
    return rope, verify_axial(rope, seed=args.seed)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check norms, the relative property, matrix/complex/fast forms and table pairing",
        description="Runs the configuration through the fast path and compares it with the block-diagonal matrix "
        "and complex references; exit status 1 when any check fails. A config with one RoPE block per layer type "
        "(Gemma-3) is checked for every layer type, one table each, unless --layer-type picks one.",
    )
    add_config_arguments(p)
    p.add_argument("--seq-len", type=seq_len_count, default=64, help="positions to check (default 64)")
    from rotary.variants import PRESETS

    p.add_argument(
        "--axial", metavar="PRESET", choices=list(PRESETS),
        help=f"check an axial RoPE preset instead ({', '.join(PRESETS)}): the N-D relative property per axis, "
        "fast == block-diagonal N-D matrix, identity tokens",
    )
    p.add_argument("--seed", type=seed, default=0, help="seed of the random q, k (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_output_argument(p, "file", None, "write the output to this file")
    p.set_defaults(func=_verify)
