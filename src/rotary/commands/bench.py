"""``rotary bench``: time RoPE application against Hugging Face and the memory-traffic limit (see :mod:`rotary.bench`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from rotary.bench import format_table, run

from .common import positive_int

__all__ = ["register"]


def _bench(args: argparse.Namespace) -> int:
    if args.repeats is None:
        args.repeats = 3 if args.quick else 9
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    machine, results = run(args)
    if args.json:
        print(json.dumps({"machine": machine, "results": [asdict(r) for r in results]}, indent=1))
    else:
        print(format_table(machine, results, markdown=args.markdown))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time RoPE application against Hugging Face and the memory-traffic limit")
    p.add_argument("--quick", action="store_true", help="two small shapes, 3 repeats, no torch.compile baseline")
    p.add_argument("--json", action="store_true", help="print machine-readable results")
    p.add_argument("--markdown", action="store_true", help="print markdown tables (docs/benchmarks.md)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16 (default fp32,bf16)")
    p.add_argument("--shapes", default=None, help="comma-separated shape names (default: all)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved samples per method (default 9; quick 3)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's current setting)")
    p.add_argument("--compile", action="store_true", help="with --quick: keep the torch.compile baseline")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--cases", action="append", help="a .py file registering extra methods or suites (repeatable)")
    p.add_argument("--suites", default=None, help="comma-separated registered suites to run (default: all)")
    p.add_argument("--progress", action="store_true", help="print a line as each group finishes")
    p.set_defaults(func=_bench)
