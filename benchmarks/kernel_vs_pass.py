"""The fused CPU kernel called directly (no Python dispatch, no autograd) against one pass over q and k.

Times, interleaved in one process, on the same q and k (in cache after the first call when they fit):

- ``mul_ pass``: ``q.mul_(1.0); k.mul_(1.0)``, the one-pass limit of ``rotary bench``;
- ``half, in place`` / ``half, out of place``: the kernel on q and k in one call, half pairing;
- ``interleaved, in place``: the same with the interleaved pairing.

Sampled as ``rotary bench`` samples (:func:`rotary.tools.bench.time_interleaved`); the median of ``--repeats``
samples is printed, and its ratio to the pass. With ``--fresh``, every call gets new copies of q and
k, made before it and not timed (as a training step's q and k arrive fresh from a projection).
Needs the compiled extension (it is built on first use).

    PYTHONPATH=src python benchmarks/kernel_vs_pass.py [--shape 1,32,2048,128] [--dtype bf16] [--threads 2] [--fresh]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from rotary import RoPE
from rotary.kernels.extension import cpu_extension_error, load_cpu_extension
from rotary.tools.bench import DTYPE_NAMES, Prepared, head_shape, time_interleaved


def calls(
    shape: tuple[int, int, int, int], dtype: torch.dtype, layout: str, fresh: bool = False
) -> dict[str, Callable[[], object]]:
    """The timed calls, keyed by name (see the module docstring); :class:`~rotary.tools.bench.Prepared`
    with ``fresh``."""
    ext = load_cpu_extension()
    if ext is None:
        raise SystemExit(f"kernel_vs_pass: the fused CPU kernel is not available: {cpu_extension_error()}")
    B, H, S, D = shape
    g = torch.Generator().manual_seed(0)
    if layout == "bhsd":  # the kernel's [B, S, H, D] view of [B, H, S, D] storage
        q0, k0 = (torch.randn(B, H, S, D, generator=g).to(dtype).transpose(1, 2) for _ in range(2))
    else:
        q0, k0 = (torch.randn(B, S, H, D, generator=g).to(dtype) for _ in range(2))
    cos, sin = RoPE(D).cos_sin(torch.arange(S))  # [S, D]: the half pairing reads the first D/2 columns
    half = D // 2
    cos_i = cos[:, :half].repeat_interleave(2, -1).contiguous()  # per channel, for the interleaved pairing
    sin_i = sin[:, :half].repeat_interleave(2, -1).contiguous()
    q_out, k_out = torch.empty_like(q0), torch.empty_like(k0)

    def timed(body: Callable[[torch.Tensor, torch.Tensor], object]) -> Callable[[], object]:
        if not fresh:
            return lambda: body(q0, k0)

        def prepare() -> Callable[[], object]:
            q, k = (torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t) for t in (q0, k0))
            return lambda: body(q, k)

        return Prepared(prepare)

    return {
        "mul_ pass": timed(lambda q, k: (q.mul_(1.0), k.mul_(1.0))),
        "half, in place": timed(
            lambda q, k: ext.rope([q, k], [q, k], [cos, cos], [sin, sin], None, 0, False, False, None)
        ),
        "half, out of place": timed(
            lambda q, k: ext.rope([q, k], [q_out, k_out], [cos, cos], [sin, sin], None, 0, False, False, None)
        ),
        "interleaved, in place": timed(
            lambda q, k: ext.rope([q, k], [q, k], [cos_i, cos_i], [sin_i, sin_i], None, 0, True, False, None)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape", type=head_shape, default="1,32,2048,128", help="B,H,S,D of q and k (default 1,32,2048,128)"
    )
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_NAMES))
    parser.add_argument("--layout", default="bhsd", choices=["bhsd", "bshd"], help="storage of q and k (default bhsd)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's setting)")
    parser.add_argument("--fresh", action="store_true", help="new copies of q and k before every call (not timed)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    medians = time_interleaved(calls(args.shape, DTYPE_NAMES[args.dtype], args.layout, args.fresh), args.repeats)  # type: ignore[arg-type]
    one_pass = medians["mul_ pass"]
    for name, seconds in medians.items():
        print(f"{name:22s} {seconds * 1e3:8.3f} ms  {seconds / one_pass:5.2f}x the pass")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
