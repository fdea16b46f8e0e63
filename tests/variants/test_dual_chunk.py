"""Dual-chunk RoPE (rotary.variants.dual_chunk) against a float64 form written from vLLM's and SGLang's rule,
a Qwen2 config with dual_chunk_attention_config, and the dense reference attention."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from rotary import ConfigError, RoPE
from rotary.variants import DualChunkRoPE, dual_chunk_attention

transformers.logging.set_verbosity_error()

CHUNK, LOCAL = 10, 4  # chunk length L = 6


def rule(p: int, table: str, chunk_size: int = CHUNK, local_size: int = LOCAL) -> int:
    """The position each table rotates a token at p, as vLLM's caches index it (plain ints)."""
    length = chunk_size - local_size
    return {
        "intra": p % length,
        "key": p % length,
        "successor": min(p % length + length, chunk_size),
        "inter": min(length - 1 + length, chunk_size),
        "successor_critical": p % length + length,
        "inter_critical": p % length + chunk_size,
    }[table]


def vllm_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def rotate_float64(x: torch.Tensor, positions: list[int], inv_freq: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [B, H, S, D] rotated pair by pair as complex numbers, in float64 (all D channels rotate)."""
    x = x.double()
    d = x.shape[-1]
    if interleaved:
        z = torch.complex(x[..., 0::2], x[..., 1::2])
    else:
        z = torch.complex(x[..., : d // 2], x[..., d // 2 :])
    angle = torch.tensor(positions, dtype=torch.float64)[:, None] * inv_freq.double()
    z = z * torch.polar(torch.ones_like(angle), angle)
    if interleaved:
        return torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    return torch.cat((z.real, z.imag), dim=-1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_tables_and_rotations_follow_the_rule(interleaved):
    torch.manual_seed(0)
    dc = DualChunkRoPE(16, chunk_size=CHUNK, local_size=LOCAL, base=10000.0, interleaved=interleaved)
    assert torch.equal(dc.freqs.inv_freq, vllm_inv_freq(10000.0, 16))  # vLLM's and SGLang's frequencies
    positions = [0, 1, 5, 6, 7, 11, 12, 13, 29, 40]
    pos = torch.tensor(positions)
    tables = dc.tables(pos)
    q, k = torch.randn(1, 4, len(positions), 16), torch.randn(1, 2, len(positions), 16)
    rotated = dc(q, k, position_ids=pos)
    for name in ("intra", "successor", "inter", "successor_critical", "inter_critical", "key"):
        want = [rule(p, name) for p in positions]
        assert dc.positions(pos)[name].tolist() == want, name
        angle = torch.tensor(want, dtype=torch.float64)[:, None] * dc.freqs.inv_freq.double()
        cos = getattr(tables, name).cos.double()
        half = cos[:, 0::2] if interleaved else cos[:, :8]
        torch.testing.assert_close(half, torch.cos(angle), rtol=0, atol=1e-6)
        x = k if name == "key" else q
        torch.testing.assert_close(
            rotated[name].double(), rotate_float64(x, want, dc.freqs.inv_freq, interleaved), rtol=0, atol=1e-5
        )


def test_batched_positions_and_errors():
    dc = DualChunkRoPE(8, chunk_size=CHUNK, local_size=LOCAL)
    batch = torch.tensor([[0, 1, 2], [13, 14, 15]])
    t = dc.tables(batch)
    assert t.successor.cos.shape == (2, 3, 8) and t.key.addressing == "per_token"
    assert dc.positions(batch)["successor"].tolist() == [[6, 7, 8], [7, 8, 9]]
    with pytest.raises(ConfigError, match="chunk_size=4 must exceed local_size=4"):
        DualChunkRoPE(8, chunk_size=4, local_size=4)
    with pytest.raises(ConfigError, match="local_size"):
        DualChunkRoPE(8, chunk_size=4, local_size=-1)
    with pytest.raises(ValueError, match="position_ids must be >= 0"):
        dc.tables(torch.tensor([-1, 0]))
    with pytest.raises(TypeError, match="position_ids"):
        dc.tables(torch.tensor([0.0, 1.0]))


QWEN_1M = {
    "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rope_theta": 10000000.0, "max_position_embeddings": 1010000,
    "dual_chunk_attention_config": {"chunk_size": 262144, "local_size": 8192,
                                    "original_max_position_embeddings": 262144},
}  # fmt: skip


def test_from_hf_config():
    for source in (QWEN_1M, transformers.AutoConfig.for_model(**QWEN_1M)):
        dc = DualChunkRoPE.from_hf_config(source)
        assert (dc.chunk_size, dc.local_size, dc.chunk_len, dc.head_dim) == (262144, 8192, 253952, 16)
        assert dc.original_max_position_embeddings == 262144 and not dc.interleaved
        assert torch.equal(dc.freqs.inv_freq, vllm_inv_freq(1e7, 16))
        # transformers ignores the block: RoPE.from_hf_config stays the model's plain RoPE
        assert torch.equal(RoPE.from_hf_config(source).inv_freq, dc.freqs.inv_freq)
    assert dc.query_scale(262144) == 1.0
    assert math.isclose(dc.query_scale(1_000_000), 0.1 * math.log(1_000_000 / 262144) + 1)
    p = dc.positions(torch.tensor([300000]))
    assert p["intra"].item() == 300000 - 253952 and p["inter"].item() == 262144


def test_from_hf_config_errors():
    with pytest.raises(ConfigError, match="no dual_chunk_attention_config"):
        DualChunkRoPE.from_hf_config({k: v for k, v in QWEN_1M.items() if k != "dual_chunk_attention_config"})
    with pytest.raises(ConfigError, match=r"\['local_size'\]"):
        DualChunkRoPE.from_hf_config({**QWEN_1M, "dual_chunk_attention_config": {"chunk_size": 8}})
    scaled = {
        **QWEN_1M,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    with pytest.raises(ConfigError, match="yarn.*vLLM"):
        DualChunkRoPE.from_hf_config(scaled)
    with pytest.warns(UserWarning, match="ignored because strict=False"):
        dc = DualChunkRoPE.from_hf_config(scaled, strict=False)
    assert torch.equal(dc.freqs.inv_freq, vllm_inv_freq(1e7, 16))


def attention_float64(dc: DualChunkRoPE, q, k, v, positions: list[int]) -> torch.Tensor:
    """Score by score: the query rotation each (query, key) pair takes, chosen by their chunks; float64."""
    length = dc.chunk_len
    inv = dc.freqs.inv_freq
    scale = dc.query_scale(max(positions) + 1) / math.sqrt(q.shape[-1])
    k_rot = rotate_float64(k, [rule(p, "key", dc.chunk_size, dc.local_size) for p in positions], inv, False)
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for h in range(q.shape[1]):
        kh = h // (q.shape[1] // k.shape[1])
        for i, p in enumerate(positions):
            logits = []
            for j, pj in enumerate(positions):
                if pj > p:
                    logits.append(-math.inf)
                    continue
                behind = p // length - pj // length
                name = "intra" if behind == 0 else "successor" if behind == 1 else "inter"
                qi = rotate_float64(
                    q[:, h : h + 1, i : i + 1], [rule(p, name, dc.chunk_size, dc.local_size)], inv, False
                )
                logits.append(float((qi[0, 0, 0] * k_rot[0, kh, j]).sum()) * scale)
            weights = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=0)
            out[0, h, i] = weights @ v[0, kh].double()
    return out


def test_attention_against_float64_form():
    torch.manual_seed(1)
    dc = DualChunkRoPE(8, chunk_size=CHUNK, local_size=LOCAL, original_max_position_embeddings=8)
    positions = list(range(20))  # chunks 0..3: intra, successor and inter scores all appear
    q, k, v = torch.randn(1, 2, 20, 8), torch.randn(1, 1, 20, 8), torch.randn(1, 1, 20, 8)
    got = dual_chunk_attention(dc, q, k, v, position_ids=torch.tensor(positions))
    torch.testing.assert_close(got.double(), attention_float64(dc, q, k, v, positions), rtol=0, atol=2e-5)


def test_attention_within_one_chunk_is_plain_rope_attention():
    torch.manual_seed(2)
    dc = DualChunkRoPE(8, chunk_size=16, local_size=4)  # L = 12
    q, k, v = torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    qr, kr = RoPE(8)(q, k)
    want = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, is_causal=True)
    torch.testing.assert_close(dual_chunk_attention(dc, q, k, v), want, rtol=1e-5, atol=1e-5)
