"""Parity with Hugging Face transformers (pinned test dependency; models from configs, no downloads)."""

import numpy as np
import pytest
import torch

import rotary
from helpers import llama_config

transformers = pytest.importorskip("transformers", minversion="5.0")  # pinned in the dev extra
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402
from transformers.models.roformer.modeling_roformer import (  # noqa: E402
    RoFormerSelfAttention,
    RoFormerSinusoidalPositionalEmbedding,
)


@pytest.mark.parametrize("head_dim, theta", [(64, 10000.0), (128, 500000.0), (96, 1e6), (256, 10000.0)])
def test_llama_rotary_embedding(head_dim, theta):
    hf = LlamaRotaryEmbedding(llama_config(head_dim, theta))
    ours = rotary.RoPE(head_dim, base=theta)
    assert torch.equal(ours.inv_freq, hf.inv_freq)  # bit-identical
    g = torch.Generator().manual_seed(0)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [3, 17, 99, 500, 1000, 1500, 2000, 2047]])
    q = torch.randn(2, 4, 8, head_dim, generator=g)
    k = torch.randn(2, 2, 8, head_dim, generator=g)
    cos_hf, sin_hf = hf(q, position_ids)
    cos, sin = ours.cos_sin(position_ids)
    # HF forms the angle in fp32: its error is at most half an ulp of the angle, plus cos's own rounding
    angle = position_ids[..., None].double() * ours.inv_freq.double().repeat(2)
    bound = angle * 2.0**-24 + 2.0**-23
    assert ((cos - cos_hf).abs().double() <= bound).all() and ((sin - sin_hf).abs().double() <= bound).all()
    # ... and ours is at least as close as HF's to the float64 truth, element by element
    truth_cos = np.cos(angle.numpy())
    assert (np.abs(cos.double().numpy() - truth_cos) <= np.abs(cos_hf.double().numpy() - truth_cos) + 1e-12).all()
    # the application itself: same tables in, same tensors out (to fp32 rounding)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    q_ours, k_ours = ours(q, k, position_ids=position_ids)
    assert torch.allclose(q_ours, q_hf, atol=1e-6, rtol=0) and torch.allclose(k_ours, k_hf, atol=1e-6, rtol=0)
    # end to end at short positions, where fp32 angles are exact enough
    q_hf, _ = apply_rotary_pos_emb(q, k, *hf(q, position_ids[:1].expand(2, -1)))
    assert torch.allclose(ours(q, k, position_ids=position_ids[:1].expand(2, -1))[0], q_hf, atol=1e-5)


def test_llama_bshd_layout_matches_unsqueeze_dim_2():
    ours = rotary.RoPE(32)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 6, 4, 32, generator=g)  # [B, S, H, D]
    pos = torch.arange(6).expand(2, 6)
    cos, sin = ours.cos_sin(pos)
    want, _ = apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=2)
    assert torch.allclose(ours.rotate(q, position_ids=pos, layout="bshd"), want, atol=1e-6, rtol=0)


def test_gptj_interleaved_partial_rotation():
    # GPT-J rotates the first rotary_dim channels with the interleaved pairing (rotate_every_two)
    head_dim, rotary_dim, seq = 32, 16, 20
    table = modeling_gptj.create_sinusoidal_positions(64, rotary_dim)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, seq, 3, head_dim, generator=g)  # GPT-J applies RoPE in [B, S, H, D]
    pos = torch.arange(seq).view(1, seq) + 7
    sin, cos = torch.split(table[pos], rotary_dim // 2, dim=-1)
    rot = modeling_gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos)
    want = torch.cat((rot, x[..., rotary_dim:]), dim=-1)
    ours = rotary.RoPE(head_dim, rotary_dim=rotary_dim, interleaved=True)
    assert torch.allclose(ours.rotate(x, position_ids=pos, layout="bshd"), want, atol=1e-5, rtol=0)


def test_roformer_interleaved_application():
    # RoFormer builds its sinusoidal table with float64 frequencies (NumPy) and applies it interleaved
    from transformers import RoFormerConfig

    head_dim, heads, seq = 16, 2, 40
    config = RoFormerConfig(hidden_size=head_dim * heads, num_attention_heads=heads, max_position_embeddings=64)
    positions = RoFormerSinusoidalPositionalEmbedding(64, head_dim)
    positions.weight.data = positions.create_weight()
    sinusoidal = positions((1, seq))[None, None]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, heads, seq, head_dim, generator=g)
    k = torch.randn(1, heads, seq, head_dim, generator=g)
    assert config.hidden_size == head_dim * heads
    q_hf, k_hf = RoFormerSelfAttention.apply_rotary_position_embeddings(sinusoidal, q, k)
    ours = rotary.RoPE(head_dim, interleaved=True)
    q_o, k_o = ours(q, k)
    # RoFormer's frequencies are float64, ours are Hugging Face's fp32 values: the angle differs by
    # position * |Δinv_freq| (< 40 * 6e-8 here), far below the tolerance
    assert torch.allclose(q_o, q_hf, atol=2e-5, rtol=0) and torch.allclose(k_o, k_hf, atol=2e-5, rtol=0)
