"""Extra `rotary bench` method: the interleaved pairing (2i, 2i+1), in place.

Loaded by `make bench` (every file in benchmarks/cases/ is passed as `--cases`). The built-in rows
use the half pairing; this one shows the paper's pairing (RoFormer, GPT-J, Meta LLaMA) costs the
same: compare with "rotary fused, in place" in the same group.
"""

import rotary
from rotary.tools import bench


def make(inputs: bench.Inputs):
    s = inputs.shape
    rope = rotary.RoPE(s.head_dim, interleaved=True, max_position=max(s.seq_len, 1))
    q, k = inputs.q.clone(), inputs.k.clone()
    return lambda: rope(q, k, inplace=True)


bench.register_method(bench.Method("rotary fused, in place, interleaved pairing", make))
