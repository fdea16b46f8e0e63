"""``rotary build``: compile the fused CPU kernel ahead of time and say where it lives.

The library compiles the kernel on first use (about half a minute, once per machine, torch and source);
running ``rotary build`` in a Docker image or a CI cache step moves that time out of the first
``rope(q, k)``. Exit status 1, with the reason, when the kernel cannot be built.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .output import add_output_argument
from .printing import print_json

__all__ = ["register"]


def _build(args: argparse.Namespace) -> int:
    from rotary.kernels.extension import build_cpu_extension, cpu_extension_path

    cached = cpu_extension_path().is_file()
    start = time.perf_counter()
    try:
        path = build_cpu_extension()
    except RuntimeError as exc:
        print(
            f"{args._parser.prog}: error: the fused CPU kernel cannot be built ({exc}); it needs a C++ compiler "
            "and ninja (pip install ninja). Without it rotary runs its pure-torch path.",
            file=sys.stderr,
        )
        return 1
    seconds = time.perf_counter() - start
    disabled = os.environ.get("ROTARY_NO_EXTENSION", "") not in ("", "0")
    note = "ROTARY_NO_EXTENSION is set, so the library will not load it until it is unset" if disabled else ""
    if args.json:
        print_json({"path": str(path), "cached": cached, "seconds": seconds, "note": note})
        return 0
    print(f"fused CPU kernel {'already built' if cached else f'built in {seconds:.0f} s'}: {path}")
    print("(move it with ROTARY_CACHE_DIR; it is compiled for this machine's CPU, torch and Python)")
    if note:
        print(f"note: {note}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build", help="compile the fused CPU kernel ahead of time and print where it lives", description=__doc__
    )
    p.add_argument("--json", action="store_true", help="print the path as JSON")
    add_output_argument(p, "file", None, "write the output to this file")
    p.set_defaults(func=_build)
