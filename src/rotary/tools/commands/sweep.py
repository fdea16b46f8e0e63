"""``rotary sweep``: perplexity and passkey retrieval of a pretrained causal LM at a list of lengths,
with each RoPE scaling its family admits, each model built by transformers from the edited config.

Results stream into --out DIR (perplexity.csv, passkey.csv, sweep.json, then report.md and figures/);
the same command into the same DIR resumes. The protocol and the traps it avoids: docs/sweep.md.
"""

from __future__ import annotations

import argparse
import sys

from ...errors import InputError
from .argument_types import count, positive_int
from .output import add_output_argument
from .printing import print_json

__all__ = ["register"]


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated integers such as 2048,4096,8192, got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be positive integers, got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated numbers in [0, 1] such as 0,0.5,1, got {text!r}"
        ) from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be numbers in [0, 1], got {text!r}")
    return values


def _names(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _sweep(args: argparse.Namespace) -> int:
    import torch

    from rotary.tools.sweep import SweepSettings, run_sweep

    if not args.model.strip():  # an empty MODEL would name the current directory
        raise InputError(f"MODEL {args.model!r} names no checkpoint; give a transformers checkpoint directory")
    device = args.device
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise InputError(f"--device {device!r} is not a device; give cpu, cuda or cuda:N") from None
    if kind not in ("cpu", "cuda") or (kind == "cuda" and not torch.cuda.is_available()):
        raise InputError(
            f"--device {device}: not available here; give cpu{' or cuda' if torch.cuda.is_available() else ''}"
        )
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = SweepSettings(
        model=args.model,
        lengths=args.lengths,
        scalings=args.scalings,
        data=args.data,
        documents=args.documents,
        stride=args.stride,
        max_windows=args.max_windows,
        depths=args.depths,
        trials=0 if args.no_passkey else args.trials,
        original_length=args.original_length,
        patch=args.patch,
        full_attention=args.full_attention,
        device=device,
        dtype=args.dtype,
        device_map=args.device_map,
    )
    state = run_sweep(settings, args.out)
    if args.json:
        print_json({"out": args.out, "summary": state["summary"], "perplexity": state["perplexity"]})
    else:
        print(f"wrote {args.out}/report.md, perplexity.csv, passkey.csv, sweep.json", file=sys.stderr)
        for scaling, s in state["summary"].items():
            longest = s["longest_passkey_length"]
            found = "none of the lengths measured" if longest is None else f"{longest} tokens"
            print(f"{scaling:<9} longest passkey length at >= 80%: {found}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="how far a pretrained model's context stretches with each RoPE scaling: perplexity and passkey by length",
        description=__doc__,
    )
    p.add_argument("model", metavar="MODEL", help="a transformers checkpoint directory (or a hub id, network allowing)")
    p.add_argument(
        "--lengths",
        type=_ints,
        help="comma-separated lengths in tokens (default: powers of two from half the original context to 8x it)",
    )
    p.add_argument(
        "--scalings",
        type=_names,
        help="comma-separated: none, linear, ntk, dynamic, yarn, llama3, longrope "
        "(default: every one the checkpoint admits)",
    )
    p.add_argument(
        "--original-length",
        type=positive_int,
        help="the context the factors are measured from (default: "
        "original_max_position_embeddings, else max_position_embeddings)",
    )
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="text files, directories or globs, one document per file "
        "(default: the largest files of the Python standard library, offline)",
    )
    p.add_argument("--documents", type=positive_int, default=4, help="documents at most (default 4)")
    p.add_argument(
        "--stride",
        type=positive_int,
        help="tokens each sliding window scores, fewer than the shortest length (default: length / 4)",
    )
    p.add_argument("--max-windows", type=positive_int, default=4, help="sliding windows per document (default 4)")
    p.add_argument("--depths", type=_floats, default=[0.0, 0.25, 0.5, 0.75, 1.0], help="passkey depths in [0, 1]")
    p.add_argument(
        "--trials",
        type=count(10000, "a passkey interval is narrow long before"),
        default=4,
        help="passkey prompts per length and depth (default 4)",
    )
    p.add_argument("--no-passkey", action="store_true", help="measure perplexity only")
    p.add_argument("--patch", action="store_true", help="run every model through rotary.hf.patch (the same numbers)")
    p.add_argument(
        "--full-attention", action="store_true", help="switch sliding-window attention off (the RoPE's own reach)"
    )
    p.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when there is one)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32", help="weights' dtype")
    p.add_argument(
        "--threads",
        type=count(1024, "more than any CPU has"),
        help="torch CPU threads (default torch's; on a busy machine 1 is often faster for small models)",
    )
    p.add_argument("--device-map", choices=("auto",), help="auto: spread a model larger than one device (accelerate)")
    p.add_argument("--json", action="store_true", help="print the summary and perplexities as JSON")
    add_output_argument(p, "dir", "sweep", "directory for the results")
    p.set_defaults(func=_sweep)
