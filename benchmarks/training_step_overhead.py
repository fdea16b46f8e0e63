"""Where the time of an in-place RoPE training step goes: autograd, the passes over memory, the rotation.

Times one forward + backward of three in-place steps on the same freshly prepared inputs (non-leaf q
and k, output gradients nothing else holds, made before every call as ``rotary bench``'s
training-step rows make them, outside the timed region):

- ``autograd only``: an ``autograd.Function`` that marks q and k dirty and does nothing;
- ``mul_ passes under autograd``: the same Function, making one ``mul_(1.0)`` pass over q and k in
  the forward and over the two gradients in the backward (what an ideal in-place rotation costs);
- ``rope(q, k, inplace=True)``: rotary's in-place training path.

Prints the median of each and the ratio of the last to the second. Interleaved samples, one process.

    PYTHONPATH=src python benchmarks/training_step_overhead.py [--shape 8,12,512,64] [--dtype fp32] [--repeats 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rotary import RoPE
from rotary.bench import head_shape
from rotary.bench.methods import _Fresh, _Source

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, S, D, generator=g).to(dtype), torch.randn(B, H, S, D, generator=g).to(dtype)
    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    rope = RoPE(D)
    q_leaf, k_leaf = q.clone().requires_grad_(), k.clone().requires_grad_()

    def prepare():
        q_leaf.grad = k_leaf.grad = None
        return _Source.apply(q_leaf), _Source.apply(k_leaf), [grad_q.clone()], [grad_k.clone()]

    def step(rotate):
        def call(inputs) -> None:
            qq, kk, box_q, box_k = inputs
            qr, kr = rotate(qq, kk)
            torch.autograd.backward((_Fresh.apply(qr, box_q), _Fresh.apply(kr, box_k)), (grad_q, grad_k))

        return call

    steps = {
        "autograd only": step(_DoNothing.apply),
        "mul_ passes under autograd": step(_Passes.apply),
        "rope(q, k, inplace=True)": step(lambda a, b: rope(a, b, inplace=True)),
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(repeats + 2):  # two warm-up rounds
        for name, call in steps.items():
            inputs = prepare()
            start = time.perf_counter()
            call(inputs)
            if round_ >= 2:
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=head_shape, default="8,12,512,64", help="B,H,S,D of q and k (default 8,12,512,64)")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's setting)")
    args = parser.parse_args(argv)
    shape = args.shape
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    medians = measure(shape, DTYPES[args.dtype], args.repeats)  # type: ignore[arg-type]
    for name, seconds in medians.items():
        print(f"{name:28s} {seconds * 1e3:8.3f} ms")
    ratio = medians["rope(q, k, inplace=True)"] / medians["mul_ passes under autograd"]
    print(f"rope / mul_ passes under autograd: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
