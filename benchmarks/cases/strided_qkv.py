"""Extra `rotary bench` method: q and k rotated in place as views into one fused qkv projection.

Loaded by `make bench` (every file in benchmarks/cases/ is passed as `--cases`). It shows that the
strided views cost no `.contiguous()` copy: compare with "rotary fused, in place" in the same group.
"""

import torch

from rotary.tools import bench


def make(inputs: bench.Inputs):
    s = inputs.shape
    # [B, S, Hq + 2 Hk, D]: the layout a single qkv Linear produces, viewed per head
    qkv = torch.randn(s.batch, s.seq_len, s.q_heads + 2 * s.k_heads, s.head_dim).to(inputs.dtype)
    q, k = qkv[:, :, : s.q_heads], qkv[:, :, s.q_heads : s.q_heads + s.k_heads]
    return lambda: inputs.rope(q, k, layout="bshd", inplace=True)


bench.register_method(bench.Method("rotary fused, in place, q/k views of qkv", make))
