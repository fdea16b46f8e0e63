"""``rotary bench``: time RoPE application against Hugging Face and the memory-traffic limit (see
:mod:`rotary.tools.bench`); with ``--device cuda`` the GPU groups and suites are timed as
:mod:`rotary.tools.bench.cuda` says.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict
from typing import Any

from rotary.tools.bench import format_table, run

from .argument_types import count
from .output import add_output_argument

__all__ = ["register"]


def _finite(value: Any) -> Any:
    """NaN (the times of a row that failed) as ``None``: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def _bench(args: argparse.Namespace) -> int:
    if args.repeats is None:
        args.repeats = 3 if args.quick else 9
    machine, results = run(args)
    if args.json:
        print(json.dumps({"machine": machine, "results": [_finite(asdict(r)) for r in results]}, indent=1))
    else:
        print(format_table(machine, results, markdown=args.markdown))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time RoPE application against Hugging Face and the memory-traffic limit")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cpu (default), or cuda: the GPU groups, GPU time under CUDA-graph replay and host time per call",
    )
    p.add_argument("--quick", action="store_true", help="small shapes, 3 repeats, no torch.compile baseline")
    output = p.add_mutually_exclusive_group()  # one format: neither silently wins
    output.add_argument("--json", action="store_true", help="print machine-readable results")
    output.add_argument("--markdown", action="store_true", help="print markdown tables (docs/benchmarks.md)")
    p.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated: fp32, bf16, fp16 (default fp32,bf16; with --device cuda each group's own: bf16, "
        "training also fp32; the generation suite keeps its model's dtype)",
    )
    p.add_argument(
        "--shapes",
        default=None,
        help="comma-separated shape names, each once (default: all; none, alone: no RoPE group, only the suites)",
    )
    p.add_argument(
        "--repeats",
        type=count(100, "each sample of each method lasts about 2 ms; the median settles long before"),
        default=None,
        help="interleaved samples per method, at most 100 (default 9; quick 3)",
    )
    threads = max(64, 4 * (os.cpu_count() or 1))  # torch crashes on absurd counts (10**6 segfaults)
    p.add_argument(
        "--threads",
        type=count(threads, f"4 x the {os.cpu_count()} logical CPUs, at least 64"),
        default=None,
        help="torch threads (default: torch's current setting)",
    )
    compiled = p.add_mutually_exclusive_group()
    compiled.add_argument("--compile", action="store_true", help="with --quick: keep the torch.compile baseline")
    compiled.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument("--cases", action="append", help="a .py file registering extra methods or suites (repeatable)")
    p.add_argument(
        "--suites",
        default=None,
        help="comma-separated suites to run, each once (default: all that run on the device; none, alone: no suite; "
        "not both --shapes none and --suites none). Built in: "
        "decode (cpu), rotate_and_cache, rmsnorm_rotate, generation (cpu and cuda)",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="print each group's line (on a GPU, its table) and each suite's tables to stderr as they finish",
    )
    add_output_argument(p, "file", None, "write the table (or JSON) to this file")
    p.set_defaults(func=_bench)
