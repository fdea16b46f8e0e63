"""Is RotaryLinearAttention linear in N? Time a forward at N and at 8N and print the ratio.

Quadratic attention would take ~64x longer at 8N; linear attention should take ~8x (the issue asks
for no more than 10x). Also printed: the attention core without the four projections, one
``nn.Linear`` of the same width (how the machine itself scales a linear-cost GEMM from N to 8N,
e.g. when the activations stop fitting in cache), and softmax attention (SDPA) for contrast.

    PYTHONPATH=src python benchmarks/bench_linear_attention.py [--n 1024] [--repeats 10]
"""

from __future__ import annotations

import argparse
import time

import torch

from rotary import RoPE
from rotary.nn import RotaryAttention, RotaryLinearAttention, rotary_linear_attention


def best_times(fns: list, repeats: int) -> list[float]:
    """Best-of-``repeats`` time of each function, measured in alternation so that load from other
    processes on a shared machine hits all of them alike."""
    for fn in fns:
        fn()  # warm-up: table cache, allocator
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024, help="base sequence length N")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadier on a shared machine)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    head_dim = args.hidden // args.heads
    rope = RoPE(head_dim)

    def core(causal: bool):
        """The attention alone, on [1, H, N, D] q/k/v: no projections."""

        def run(x: torch.Tensor) -> torch.Tensor:
            q = k = v = x.view(1, -1, args.heads, head_dim).transpose(1, 2)
            cos, sin = rope.cos_sin(torch.arange(q.shape[2]))
            return rotary_linear_attention(q, k, v, cos, sin, causal=causal, chunk_size=args.chunk)

        return run

    rows = []
    for name, layer in [
        ("linear, causal", RotaryLinearAttention(args.hidden, args.heads, causal=True, chunk_size=args.chunk)),
        ("linear, non-causal", RotaryLinearAttention(args.hidden, args.heads, causal=False)),
        ("  core only, causal", core(True)),
        ("  core only, non-causal", core(False)),
        ("  one nn.Linear (baseline)", torch.nn.Linear(args.hidden, args.hidden)),
        ("softmax (SDPA), causal", RotaryAttention(args.hidden, args.heads, causal=True)),
    ]:
        inputs = [torch.randn(1, n, args.hidden) for n in (args.n, 8 * args.n)]
        t1, t8 = best_times([lambda x=x, layer=layer: layer(x) for x in inputs], args.repeats)
        rows.append((name, t1, t8, t8 / t1))
    print(f"hidden={args.hidden} heads={args.heads} chunk={args.chunk} threads={torch.get_num_threads()}")
    print(f"{'layer':<28} {'t(N) ms':>10} {'t(8N) ms':>10} {'t(8N)/t(N)':>11}")
    for name, t1, t8, ratio in rows:
        print(f"{name:<28} {t1 * 1e3:>10.2f} {t8 * 1e3:>10.2f} {ratio:>11.2f}")


if __name__ == "__main__":
    main()
