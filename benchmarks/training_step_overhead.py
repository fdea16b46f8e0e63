"""Where the time of an in-place RoPE training step goes: autograd, the passes over memory, the rotation.

Times one forward + backward of three in-place steps, each prepared as ``rotary bench``'s
training-step rows prepare theirs (fresh non-leaf q and k, output gradients nothing else holds, made
before every call, outside the timed region), interleaved in one process:

- ``autograd only``: an ``autograd.Function`` that marks q and k dirty and does nothing;
- ``mul_ passes under autograd``: the same Function, making one ``mul_(1.0)`` pass over q and k in
  the forward and over the two gradients in the backward (what an ideal in-place rotation costs);
- ``rope(q, k, inplace=True)``: rotary's in-place training path.

Prints the median of each and the ratio of the last to the second.

    PYTHONPATH=src python benchmarks/training_step_overhead.py [--shape 8,12,512,64] [--dtype fp32] [--repeats 40]
"""

from __future__ import annotations

import argparse

import torch

from rotary.tools.bench import DTYPE_NAMES, Shape, head_shape, make_inputs, time_interleaved
from rotary.tools.bench.methods import _training_step


class _DoNothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k):  # type: ignore[override]
        ctx.mark_dirty(q, k)
        return q, k

    @staticmethod
    def backward(ctx, gq, gk):  # type: ignore[override]
        return gq, gk


class _Passes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k):  # type: ignore[override]
        q.mul_(1.0)
        k.mul_(1.0)
        ctx.mark_dirty(q, k)
        return q, k

    @staticmethod
    def backward(ctx, gq, gk):  # type: ignore[override]
        return gq.mul_(1.0), gk.mul_(1.0)


def measure(shape: tuple[int, int, int, int], dtype: torch.dtype, repeats: int) -> dict[str, float]:
    """Median seconds of each step, keyed by its name (see the module docstring)."""
    B, H, S, D = shape
    inp = make_inputs(Shape("step", B, H, H, S, D), dtype)
    return time_interleaved(
        {
            "autograd only": _training_step(inp, _DoNothing.apply),
            "mul_ passes under autograd": _training_step(inp, _Passes.apply),
            "rope(q, k, inplace=True)": _training_step(inp, lambda q, k: inp.rope(q, k, inplace=True)),
        },
        repeats,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shape", type=head_shape, default="8,12,512,64", help="B,H,S,D of q and k (default 8,12,512,64)"
    )
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_NAMES))
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's setting)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    medians = measure(args.shape, DTYPE_NAMES[args.dtype], args.repeats)
    for name, seconds in medians.items():
        print(f"{name:28s} {seconds * 1e3:8.3f} ms")
    ratio = medians["rope(q, k, inplace=True)"] / medians["mul_ passes under autograd"]
    print(f"rope / mul_ passes under autograd: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
