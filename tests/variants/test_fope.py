"""FoPE (rotary.variants.fope) against a float64 form written from the paper's definition and vLLM's
FourierRotaryEmbedding, with GQA, both pairings, gradients to the coefficients, and its errors."""

from __future__ import annotations

import math

import pytest
import torch

from rotary import RoPE
from rotary.errors import ConfigError, InputError
from rotary.variants import FoPE, fope_kept_frequencies

D, HKV, HQ, N = 16, 2, 4, 64  # 3 of the 8 frequencies of base 10000 turn within 64 positions


def reference(fope: FoPE, x: torch.Tensor, positions: torch.Tensor, query: bool) -> torch.Tensor:
    """x [B, H, S, D] (bhsd), float64, element by element: pair d of head h at position n times C + iS."""
    x = x.double()
    out = x.clone()
    theta = [float(t) for t in fope.inv_freq.double()]  # the kept frequencies (fp32 values, as the model holds)
    cos_coef, sin_coef = fope.cos_coef.detach().double(), fope.sin_coef.detach().double()
    heads = x.shape[1]
    group = heads // fope.num_key_value_heads if query else 1
    for b in range(x.shape[0]):
        for h in range(heads):
            c = (h // group) if fope.separate_heads else 0
            for s in range(x.shape[2]):
                n = int(positions[b, s] if positions.dim() == 2 else positions[s])
                for d in range(D // 2):
                    if d < len(theta):
                        cos = sum(math.cos(theta[f] * n) * float(cos_coef[c, f, d]) for f in range(len(theta)))
                        sin = sum(math.sin(theta[f] * n) * float(sin_coef[c, f, d]) for f in range(len(theta)))
                    else:  # a clipped frequency: 0, the pair does not turn
                        cos, sin = 1.0, 0.0
                    i, j = (2 * d, 2 * d + 1) if fope.interleaved else (d, d + D // 2)
                    x1, x2 = x[b, h, s, i], x[b, h, s, j]
                    out[b, h, s, i], out[b, h, s, j] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("separate_heads", [True, False])
def test_matches_float64_form(interleaved, separate_heads):
    g = torch.Generator().manual_seed(0)
    fope = FoPE(
        D,
        num_key_value_heads=HKV,
        max_position_embeddings=N,
        init_std=0.3,
        interleaved=interleaved,
        separate_heads=separate_heads,
        generator=g,
    )
    assert fope.inv_freq.shape == (3,) and fope.cos_coef.shape == (HKV if separate_heads else 1, 3, 3)
    positions = torch.tensor([[0, 1, 7, 100], [3, 64, 65, 4000]])  # past the training length too
    q, k = torch.randn(2, HQ, 4, D, generator=g), torch.randn(2, HKV, 4, D, generator=g)
    got_q, got_k = fope(q, k, position_ids=positions)
    torch.testing.assert_close(got_q.double(), reference(fope, q, positions, True), rtol=0, atol=1e-5)
    torch.testing.assert_close(got_k.double(), reference(fope, k, positions, False), rtol=0, atol=1e-5)
    # bshd layout: the same numbers
    bq, bk = fope(q.transpose(1, 2), k.transpose(1, 2), position_ids=positions, layout="bshd")
    torch.testing.assert_close(bq.transpose(1, 2), got_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(bk.transpose(1, 2), got_k, rtol=0, atol=1e-6)


def test_identity_coefficients_without_clipping_is_rope():
    fope = FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N, num_inv_freq=D // 2)
    q, k = torch.randn(1, HQ, 9, D), torch.randn(1, HKV, 9, D)
    want_q, want_k = RoPE(D)(q, k)
    got_q, got_k = fope(q, k)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-6)


def test_clipped_pairs_pass_through():
    """Identity coefficients: the clipped pairs' channels are untouched, the kept ones are RoPE's."""
    fope = FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N)
    kept = fope.inv_freq.shape[0]
    q, k = torch.randn(1, HKV, 6, D), torch.randn(1, HKV, 6, D)
    got_q, _ = fope(q, k, position_ids=torch.arange(100, 106))
    clipped = [c for d in range(kept, D // 2) for c in (d, d + D // 2)]
    assert torch.equal(got_q[..., clipped], q[..., clipped])
    rope_q, _ = RoPE(D)(q, k, position_ids=torch.arange(100, 106))
    turning = [c for d in range(kept) for c in (d, d + D // 2)]
    torch.testing.assert_close(got_q[..., turning], rope_q[..., turning], rtol=0, atol=1e-5)


def test_tables_are_vllms():
    """vLLM builds cos = cos(t θ) @ cos_coef[h] (fp32), padded with 1, and sin likewise padded with 0."""
    g = torch.Generator().manual_seed(1)
    fope = FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N, init_std=0.5, generator=g)
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float) / D))
    inv = inv[inv > 2.0 * torch.pi / N]
    t = torch.arange(N, dtype=torch.float)
    freqs = torch.einsum("j,i -> ji", t, inv)
    cos = torch.einsum("htD, hDd -> thd", freqs.cos().expand(HKV, -1, -1), fope.cos_coef.detach())
    sin = torch.einsum("htD, hDd -> thd", freqs.sin().expand(HKV, -1, -1), fope.sin_coef.detach())
    cos = torch.nn.functional.pad(cos, (0, D // 2 - cos.shape[-1]), value=1)
    sin = torch.nn.functional.pad(sin, (0, D // 2 - sin.shape[-1]), value=0)
    tables = fope.tables(torch.arange(N))
    assert torch.equal(fope.inv_freq, inv)
    torch.testing.assert_close(tables.cos, torch.cat((cos, cos), -1), rtol=0, atol=2e-5)
    torch.testing.assert_close(tables.sin, torch.cat((sin, sin), -1), rtol=0, atol=2e-5)


def test_gradients_reach_the_coefficients():
    g = torch.Generator().manual_seed(2)
    fope = FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N, init_std=0.2, generator=g)
    q, k = torch.randn(1, HQ, 5, D, generator=g), torch.randn(1, HKV, 5, D, generator=g)
    got_q, got_k = fope(q, k)
    (got_q.square().sum() + got_k.sum()).backward()

    # the same loss from the tables applied by hand (float64 autograd)
    cos_coef = fope.cos_coef.detach().double().requires_grad_()
    sin_coef = fope.sin_coef.detach().double().requires_grad_()
    theta = torch.arange(5, dtype=torch.float64)[:, None] * fope.inv_freq.double()
    c = (theta.cos()[None, :, :, None] * cos_coef[:, None]).sum(-2)  # [H, S, F]
    s = (theta.sin()[None, :, :, None] * sin_coef[:, None]).sum(-2)
    pad = D // 2 - c.shape[-1]
    c = torch.cat((c, torch.ones(HKV, 5, pad, dtype=torch.float64)), -1)
    s = torch.cat((s, torch.zeros(HKV, 5, pad, dtype=torch.float64)), -1)

    def apply(x, heads):
        cc, ss = c.repeat_interleave(heads // HKV, 0)[None], s.repeat_interleave(heads // HKV, 0)[None]
        x1, x2 = x.double()[..., : D // 2], x.double()[..., D // 2 :]
        return torch.cat((x1 * cc - x2 * ss, x2 * cc + x1 * ss), -1)

    (apply(q, HQ).square().sum() + apply(k, HKV).sum()).backward()
    torch.testing.assert_close(fope.cos_coef.grad.double(), cos_coef.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fope.sin_coef.grad.double(), sin_coef.grad, rtol=1e-4, atol=1e-4)


def test_set_coefficients_and_errors():
    fope = FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N)
    a, b = torch.randn(HKV, 3, 3), torch.randn(HKV, 3, 3)
    fope.set_coefficients(a, b)
    assert torch.equal(fope.cos_coef.detach(), a) and torch.equal(fope.sin_coef.detach(), b)
    with pytest.raises(InputError, match=r"cos_coef must be a tensor of shape \(2, 3, 3\)"):
        fope.set_coefficients(torch.randn(1, 3, 3), b)
    with pytest.raises(InputError, match="3 heads"):
        fope(torch.randn(1, 4, 5, D), torch.randn(1, 3, 5, D))
    with pytest.raises(ConfigError, match="num_inv_freq"):
        FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N, num_inv_freq=9)
    with pytest.raises(ConfigError, match="clips them all"):
        fope_kept_frequencies(torch.tensor([0.01, 0.001]), 10)
    with pytest.raises(InputError, match="init_std"):
        FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N, init_std=-1.0)


def test_as_the_rope_of_rotary_attention():
    """MHA layer: RotaryAttention hands FoPE its Positions and rotates q and k with the per-head tables."""
    from rotary.nn import RotaryAttention

    torch.manual_seed(3)
    fope = FoPE(D, num_key_value_heads=HKV, max_position_embeddings=N, init_std=0.2)
    attn = RotaryAttention(D * HKV, HKV, rope=fope, causal=True).eval()
    x = torch.randn(1, 7, D * HKV)
    q = attn.q_proj(x).view(1, 7, HKV, D).transpose(1, 2)
    k = attn.k_proj(x).view(1, 7, HKV, D).transpose(1, 2)
    v = attn.v_proj(x).view(1, 7, HKV, D).transpose(1, 2)
    q, k = fope(q, k)
    want = attn.o_proj(
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
    )
    with torch.no_grad():
        torch.testing.assert_close(attn(x), want, rtol=1e-5, atol=1e-5)


INTERN = {
    "model_type": "interns1_pro",
    "text_config": {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                    "rope_theta": 5000000.0, "max_position_embeddings": 262144,
                    "rope_scaling": {"rope_type": "default", "fope_init_factor": 0.5, "fope_sep_head": True,
                                     "num_inv_freq": None}},
}  # fmt: skip


def test_from_hf_config_as_vllm_reads_it():
    fope = FoPE.from_hf_config(INTERN)
    # vLLM: inv_freq of rope_theta, kept where it exceeds 2π / max_position_embeddings (the config's)
    inv = 1.0 / (5000000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64))
    assert torch.equal(fope.inv_freq, inv[inv > 2.0 * torch.pi / 262144])
    assert fope.cos_coef.shape == (2, len(fope.inv_freq), len(fope.inv_freq)) and fope.separate_heads
    shared = FoPE.from_hf_config({**INTERN["text_config"], "rope_scaling": {"fope_sep_head": False, "num_inv_freq": 8}})
    assert not shared.separate_heads and shared.inv_freq.shape == (8,) and shared.cos_coef.shape == (1, 8, 8)
    a, b = torch.randn(2, 8, 8), torch.randn(2, 8, 8)
    shared.set_coefficients(a, b)  # a checkpoint's per-head shape: the first matrix, as vLLM reads cos_coef[0]
    assert torch.equal(shared.cos_coef.detach()[0], a[0]) and torch.equal(shared.sin_coef.detach()[0], b[0])
    with pytest.raises(ConfigError, match="none of FoPE's keys"):
        FoPE.from_hf_config({**INTERN["text_config"], "rope_scaling": {"rope_type": "default"}})
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        FoPE.from_hf_config({**INTERN["text_config"], "num_key_value_heads": 0})


def test_plain_rope_refuses_fope_keys_by_name():
    from rotary import RoPE

    d = {"model_type": "qwen3_moe", **INTERN["text_config"]}
    with pytest.raises(ConfigError, match="'fope_init_factor'"):
        RoPE.from_hf_config(d)
