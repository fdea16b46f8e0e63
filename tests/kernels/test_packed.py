"""Variable-length packed sequences (cu_seqlens) and explicit per-token positions, and their errors."""

from __future__ import annotations

import pytest
import torch

import rotary

LENGTHS = [5, 1, 9, 3]


def packed_case(dtype=torch.float32, heads=(4, 2), D=16, r=12, interleaved=False):
    rope = rotary.RoPE(D, rotary_dim=r, interleaved=interleaved)
    total = sum(LENGTHS)
    q, k = (torch.randn(total, h, D).to(dtype) for h in heads)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    return rope, q, k, cu


def per_sequence(rope, x, cu):
    """Rotate each sequence on its own as a [1, S, H, D] batch starting at position 0."""
    parts = [rope.rotate(x[a:b].unsqueeze(0), layout="bshd")[0] for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    return torch.cat(parts)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cu_seqlens_restart_positions(interleaved, dtype):
    rope, q, k, cu = packed_case(dtype, interleaved=interleaved)
    qr, kr = rope(q, k, cu_seqlens=cu)
    assert torch.equal(qr, per_sequence(rope, q, cu))
    assert torch.equal(kr, per_sequence(rope, k, cu))
    cos, sin = rope.cos_sin(torch.arange(16))
    assert torch.equal(rotary.apply_rotary(q, cos, sin, cu_seqlens=cu, max_seqlen=9, interleaved=interleaved), qr)
    q2 = q.clone()
    assert rotary.apply_rotary_(q2, cos, sin, cu_seqlens=cu, interleaved=interleaved) is q2
    assert torch.equal(q2, qr)


def test_explicit_per_token_positions():
    rope, q, k, cu = packed_case()
    pos = torch.cat([torch.arange(n) + 7 for n in LENGTHS])  # every sequence continues at position 7
    qr, _ = rope(q, k, position_ids=pos)
    cos, sin = rope.cos_sin(pos)
    expected = rotary.apply_rotary(q.unsqueeze(0), cos, sin, layout="bshd")[0]
    assert torch.equal(qr, expected)
    assert torch.equal(rope.rotate(q, position_ids=pos), expected)


def test_position_ids_index_tables_without_gathering():
    rope = rotary.RoPE(32)
    x = torch.randn(2, 4, 6, 32)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [9, 8, 7, 6, 5, 4]])
    table_cos, table_sin = rope.cos_sin(torch.arange(10))
    cos, sin = rope.cos_sin(pos)
    assert torch.equal(rotary.apply_rotary(x, table_cos, table_sin, position_ids=pos), rotary.apply_rotary(x, cos, sin))


def test_packed_gradients_match_per_sequence():
    rope, q, k, cu = packed_case(torch.float64)
    q.requires_grad_()
    g = torch.randn_like(q)
    (rope.rotate(q, cu_seqlens=cu) * g).sum().backward()
    grad_fused = q.grad.clone()
    q.grad = None
    (per_sequence(rope, q, cu) * g).sum().backward()
    assert torch.allclose(grad_fused, q.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "cu, message",
    [
        (torch.tensor([0, 5, 6, 15]), "end at the 18 packed tokens"),
        (torch.tensor([1, 5, 6, 15, 18]), "start at 0"),
        (torch.tensor([0, 6, 5, 15, 18]), "never decrease"),
        (torch.tensor([18]), "N >= 1 sequences"),
        (torch.tensor([[0, 18]]), "1-D"),
    ],
)
def test_bad_cu_seqlens(cu, message):
    rope, q, k, _ = packed_case()
    with pytest.raises(ValueError, match=message):
        rope(q, k, cu_seqlens=cu)


def test_packed_errors():
    rope, q, k, cu = packed_case()
    cos, sin = rope.cos_sin(torch.arange(16))
    with pytest.raises(TypeError, match="cu_seqlens must be an integer tensor"):
        rotary.apply_rotary(q, cos, sin, cu_seqlens=cu.float())
    with pytest.raises(ValueError, match="max_seqlen=4 but cu_seqlens holds a sequence of 9"):
        rotary.apply_rotary(q, cos, sin, cu_seqlens=cu, max_seqlen=4)
    with pytest.raises(ValueError, match="only 8 rows"):
        rotary.apply_rotary(q, cos[:8], sin[:8], cu_seqlens=cu)
    with pytest.raises(ValueError, match="position_ids and cu_seqlens each give positions; pass one"):
        rotary.apply_rotary(q, cos, sin, cu_seqlens=cu, position_ids=torch.zeros(18, dtype=torch.long))
    with pytest.raises(ValueError, match="pass cu_seqlens"):
        rotary.apply_rotary(q, cos, sin)
    with pytest.raises(ValueError, match=r"must be \[18\]"):
        rotary.apply_rotary(q, cos, sin, position_ids=torch.zeros(17, dtype=torch.long))
    with pytest.raises(ValueError, match="tables \\[T, r\\]"):
        rotary.apply_rotary(q, cos.unsqueeze(0), sin.unsqueeze(0), cu_seqlens=cu)
    with pytest.raises(ValueError, match="must be 3-D"):
        rotary.apply_rotary(q.unsqueeze(0), cos, sin, cu_seqlens=cu)
    with pytest.raises(ValueError, match="same tokens"):
        rope(q, k[:-1], position_ids=torch.zeros(18, dtype=torch.long))
    with pytest.raises(ValueError, match="need cu_seqlens or per-token position_ids"):
        rope(q, k)
    with pytest.raises(ValueError, match="head_dim 16 but this RoPE was built for head_dim=32"):
        rotary.RoPE(32)(q, k, cu_seqlens=cu)


def test_position_ids_errors_for_4d_inputs():
    rope = rotary.RoPE(16)
    x = torch.randn(2, 3, 5, 16)
    cos, sin = rope.cos_sin(torch.arange(8))
    with pytest.raises(ValueError, match="reach position 9 but the cos/sin tables have only 8 rows"):
        rotary.apply_rotary(x, cos, sin, position_ids=torch.tensor([0, 1, 2, 3, 9]))
    with pytest.raises(ValueError, match="do not fit x"):
        rotary.apply_rotary(x, cos, sin, position_ids=torch.arange(4))
    with pytest.raises(ValueError, match="do not fit x"):
        rotary.apply_rotary(x, cos, sin, position_ids=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="integer dtype"):
        rotary.apply_rotary(x, cos, sin, position_ids=torch.arange(5.0))
    with pytest.raises(ValueError, match="indexed by position"):
        rotary.apply_rotary(x, cos[:5].expand(2, 5, 16), sin[:5].expand(2, 5, 16), position_ids=torch.arange(5))
    with pytest.raises(ValueError, match="q and k must share S"):
        rope(x, torch.randn(2, 3, 5, 16)[:, :, :4])


def test_packed_sequences_follow_dynamic_scaling_like_padded_batches():
    # a dynamic-NTK RoPE past its trained length: the packed path must adapt the frequencies too
    scaling = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8}
    packed_rope = rotary.RoPE(16, scaling=scaling, dynamic="stateless")
    padded_rope = rotary.RoPE(16, scaling=scaling, dynamic="stateless")
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 20, 16, generator=g)
    packed = packed_rope.rotate(x[0].transpose(0, 1).contiguous(), cu_seqlens=torch.tensor([0, 20], dtype=torch.int32))
    want = padded_rope.rotate(x)
    assert not torch.equal(packed_rope.inv_freq, packed_rope.original_freqs.inv_freq)
    assert torch.allclose(packed, want[0].transpose(0, 1), atol=1e-6)
