"""rotary.rotate_and_cache against the plain-torch composition (eager and compiled by Inductor), per call, and the traffic limit.

Rows, on the same q, k, v, KV cache and tables (built before timing; the cache rows are overwritten by
every call, so each call does the same work):

- ``fused``: :func:`rotary.rotate_and_cache` with vLLM's form (per-token ``positions`` and a
  ``cos_sin_cache``): one Triton launch on CUDA, the pure-torch path on the CPU;
- ``torch composition``: what a serving engine's native path writes (vLLM's ``forward_native``): gather
  the cos/sin rows of each token's position, rotate q and k in fp32 (``rotate_half``), round once,
  write k and v into the cache rows of their slots with ``index_put_``;
- ``compiled composition``: that function compiled by Inductor (``torch.compile``, compilation
  excluded): what every user gets for free;
- ``traffic limit``: the bytes the op must move (q, k and v read; q and k written; the k and v cache
  rows written; the cos/sin rows read) over the measured copy bandwidth.

Timing as in ``benchmarks/rmsnorm_rotate.py``: CUDA-graph replays of 20 calls on CUDA, interleaved
samples on the CPU; µs per call. Shapes ``BxS`` with q 32 heads, k and v 8 heads of 128 channels
(``--heads``, ``--kv-heads``, ``--head-dim``), bf16 by default; decoding rows (S = 1) at per-sequence
positions after 1000 cached tokens, prefill rows from position 0.

    PYTHONPATH=src python benchmarks/rotate_and_cache.py --device cuda           # 64x1, 1x4096, 8x2048
    PYTHONPATH=src python benchmarks/rotate_and_cache.py --device cpu            # 64x1, 1x512, 4x256
"""

from __future__ import annotations

import argparse

import torch

import rotary
from rmsnorm_rotate import DTYPES, fused_op_cli, time_call


def torch_composition(q, k, v, k_cache, v_cache, slots, positions, cos_sin_cache):
    """RoPE at ``positions`` and the KV-cache write in plain torch: ``q``, ``k``, ``v`` ``[B, S, H, D]``,
    caches ``[B, T, Hk, D]``, ``slots`` and ``positions`` int64 ``[B, S]``, ``cos_sin_cache`` fp32 ``[P, D]``."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [B, S, D/2] each
    cos, sin = torch.cat((cos, cos), dim=-1)[:, :, None], torch.cat((sin, sin), dim=-1)[:, :, None]

    def rotate(x):
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)

    q_rot, k_rot = rotate(q), rotate(k)
    rows = torch.arange(q.shape[0], device=q.device)[:, None].expand_as(slots)
    k_cache.index_put_((rows, slots), k_rot)
    v_cache.index_put_((rows, slots), v)
    return q_rot, k_rot


def traffic_bytes(batch: int, seq: int, hq: int, hk: int, head_dim: int, dtype: torch.dtype) -> int:
    """q, k, v read; q, k written; k and v cache rows written; cos and sin of each token read (fp32)."""
    tokens = batch * seq
    element = torch.finfo(dtype).bits // 8
    return tokens * element * head_dim * (2 * hq + 2 * hk + hk + 2 * hk) + tokens * head_dim * 4


def run_shape(args: argparse.Namespace, text: str, device: torch.device, bandwidth: float) -> list[tuple[str, float]]:
    batch, seq = (int(v) for v in text.lower().split("x"))
    dtype, hq, hk, head_dim = DTYPES[args.dtype], args.heads, args.kv_heads, args.head_dim
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(batch, seq, hq, head_dim, generator=g, device=device).to(dtype)
    k = torch.randn(batch, seq, hk, head_dim, generator=g, device=device).to(dtype)
    v = torch.randn(batch, seq, hk, head_dim, generator=g, device=device).to(dtype)
    start = 1000 if seq == 1 else 0
    capacity = start + batch + seq
    k_cache = torch.zeros(batch, capacity, hk, head_dim, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.arange(seq, device=device).expand(batch, seq)
    if seq == 1:  # decoding: each sequence at its own position
        positions = positions + start + torch.arange(batch, device=device)[:, None]
    positions = positions.contiguous()
    rope = rotary.RoPE(head_dim, base=1e6, max_position=capacity)
    angles = torch.outer(torch.arange(capacity, dtype=torch.float64), rope.inv_freq.double())
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)  # vLLM's [P, D]

    def fused():
        return rotary.rotate_and_cache(
            q, k, v, k_cache, v_cache, positions, positions=positions, cos_sin_cache=cos_sin_cache
        )

    def composition():
        return torch_composition(q, k, v, k_cache, v_cache, positions, positions, cos_sin_cache)

    calls = {"fused": fused, "torch composition": composition}
    if not args.no_compile:
        torch._dynamo.reset()
        compiled = torch.compile(torch_composition, dynamic=False)
        calls["compiled composition"] = lambda: compiled(q, k, v, k_cache, v_cache, positions, positions, cos_sin_cache)
    q_ref, k_ref = composition()
    q_got, k_got = fused()
    if not (torch.equal(q_got, q_ref) and torch.equal(k_got, k_ref)):
        diff = max(
            (q_got.float() - q_ref.float()).abs().max().item(), (k_got.float() - k_ref.float()).abs().max().item()
        )
        print(f"{text}: fused and composition differ by up to {diff:.3g} (rounding order; both fp32, rounded once)")
    rows = [(name, time_call(call, device, args.repeats)) for name, call in calls.items()]
    rows.append(("traffic limit", traffic_bytes(batch, seq, hq, hk, head_dim, dtype) / bandwidth))
    return rows


def main(argv: list[str] | None = None) -> int:
    return fused_op_cli(argv, __doc__.splitlines()[0], "rotate_and_cache", "k and v", run_shape)


if __name__ == "__main__":
    raise SystemExit(main())
