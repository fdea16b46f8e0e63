"""The fused CPU kernel of this tree against the same kernel of an earlier commit: an A/B of two builds.

Builds the kernel's sources (``src/rotary/kernels/cpu``) as they were at ``--against`` (a git revision) into a scratch
directory, with the flags the library builds with, loads it beside this tree's build and times their
``rmsnorm_rope`` (the C++ entry of :func:`rotary.rmsnorm_rotate`, called directly: no Python dispatch) on
the same inputs, interleaved in one process as ``rotary bench`` samples them
(:func:`rotary.tools.bench.time_interleaved`), for fp32, bf16 and fp16, both pairings, Qwen3's weight
convention. Before timing, the two builds' outputs are compared: they must be equal bit for bit (a change
to the kernel's speed must not change its results). Shapes: ``BxS`` with q ``Hq`` and k ``Hk`` heads of
``D`` channels (default: the fused suites' 64x1, 1x512 and 4x256 with 32/8 heads of 128).

    PYTHONPATH=src python benchmarks/cpu_kernel_ab.py --against 01b918b [--threads 2] [--repeats 9]
        [--shapes 64x1,1x512] [--heads 32,8] [--head-dim 128]

The first run for a revision compiles it (about a minute for a tree before the split into two units, else half a
minute); later runs reuse the build.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rotary.kernels import extension  # noqa: E402
from rotary.tables import cos_sin_table  # noqa: E402
from rotary.tools.bench import time_interleaved  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_at(revision: str):
    """The extension built from the kernel's sources as they were at ``revision`` (``rotary.cpp`` alone in
    earlier trees; the files :data:`rotary.kernels.extension.UNITS` and ``HEADERS`` since the build was split)."""
    folder = extension.SOURCE.parent.relative_to(ROOT).as_posix()
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{revision}:{folder}"], capture_output=True, text=True
    )
    main = f"{folder}/{extension.SOURCE.name}"
    if listing.returncode != 0 or extension.SOURCE.name not in listing.stdout.split():
        reason = listing.stderr.strip() or f"no {extension.SOURCE.name} there"
        raise SystemExit(f"cpu_kernel_ab: cannot read {main} at {revision!r}: {reason}")
    names = [n for n in listing.stdout.split() if n.endswith((".cpp", ".h"))]
    files = {}
    for name in names:
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{folder}/{name}"], capture_output=True)
        if done.returncode != 0:
            raise SystemExit(
                f"cpu_kernel_ab: cannot read {folder}/{name} at {revision!r}: {done.stderr.decode().strip()}"
            )
        files[name] = done.stdout
    digest = hashlib.sha256(b"".join(n.encode() + b + b"\0" for n, b in sorted(files.items())))
    digest.update(" ".join(extension.CFLAGS).encode())
    directory = Path(tempfile.gettempdir()) / f"rotary_ab_{digest.hexdigest()[:12]}"
    directory.mkdir(exist_ok=True)
    for name, data in files.items():
        if not (directory / name).is_file() or (directory / name).read_bytes() != data:
            (directory / name).write_bytes(data)
    from torch.utils import cpp_extension

    return cpp_extension.load(
        name=directory.name,
        sources=[str(directory / n) for n in names if n.endswith(".cpp")],
        extra_cflags=list(extension.CFLAGS),
        extra_ldflags=list(extension.LDFLAGS),
        build_directory=str(directory),
        verbose=False,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision whose kernel is the baseline")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--shapes", default="64x1,1x512,4x256", help="BxS, comma-separated")
    parser.add_argument("--heads", default="32,8", help="q heads, k heads")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    new, old = extension.load_cpu_extension(), build_at(args.against)
    if new is None:
        raise SystemExit(f"cpu_kernel_ab: this tree's kernel is not available: {extension.cpu_extension_error()}")
    hq, hk = (int(h) for h in args.heads.split(","))
    D = args.head_dim
    print(f"rmsnorm_rope of this tree against {args.against}; {args.threads} threads, median of {args.repeats}")
    print("| shape | dtype | pairing | before µs | after µs | after / before |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for text in args.shapes.split(","):
        B, S = (int(v) for v in text.lower().split("x"))
        for name, dtype in DTYPES.items():
            for interleaved in (False, True):
                g = torch.Generator().manual_seed(0)
                q = torch.randn(B, S, hq, D, generator=g).to(dtype) * 3
                k = torch.randn(B, S, hk, D, generator=g).to(dtype) * 3
                inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
                cos, sin = cos_sin_table(torch.arange(2048), inv.float(), interleaved=interleaved)
                positions = torch.randint(0, 2048, (B, S), generator=g)
                weight = torch.rand(D, generator=g)
                results = {}
                for label, ext in (("before", old), ("after", new)):
                    outs = [torch.empty_like(q), torch.empty_like(k)]
                    rstds = [
                        q.new_empty(q.shape[:3], dtype=torch.float32),
                        k.new_empty(k.shape[:3], dtype=torch.float32),
                    ]
                    call_args = (
                        [q, k],
                        outs,
                        rstds,
                        [weight, weight],
                        [cos, cos],
                        [sin, sin],
                        positions,
                        0,
                        interleaved,
                        True,
                        1e-6,
                        None,  # frequencies: the rows come from the tables
                    )
                    results[label] = (ext, call_args, outs)
                for ext, call_args, _ in results.values():
                    ext.rmsnorm_rope(*call_args)
                before, after = results["before"][2], results["after"][2]
                bits = lambda t: t.view(torch.int32 if t.element_size() == 4 else torch.int16)  # noqa: E731  (-0 too)
                if not all(torch.equal(bits(a), bits(b)) for a, b in zip(after, before)):
                    raise SystemExit(f"cpu_kernel_ab: the builds differ at {text} {name} interleaved={interleaved}")
                calls = {
                    label: (lambda e=ext, a=call_args: e.rmsnorm_rope(*a))
                    for label, (ext, call_args, _) in results.items()
                }
                times = time_interleaved(calls, args.repeats)
                pairing = "interleaved" if interleaved else "half"
                b_us, a_us = times["before"] * 1e6, times["after"] * 1e6
                print(
                    f"| {text} ({hq}/{hk} heads, D {D}) | {name} | {pairing} | {b_us:.1f} | "
                    f"{a_us:.1f} | {a_us / b_us:.2f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
