"""HunYuan's NTK with ``alpha`` (rope_type ``ntk_alpha``): against a float64 form, transformers' HunYuan
models built from configs (tiny, random weights) and vLLM's rule, and its errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import transformers

from rotary import ConfigError, RoPE, frequencies
from rotary.hf.config import read_hf_config

transformers.logging.set_verbosity_error()

#: HunYuan-A13B-Instruct's published block (4.x ``rope_scaling``): "dynamic" with alpha, YaRN keys beside it
HUNYUAN_BLOCK = {
    "alpha": 1000.0,
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "type": "dynamic",
}


def reference_inv_freq(base: float, alpha: float, rotary_dim: int) -> torch.Tensor:
    """float64: base' = base * alpha ** (d / (d - 2)); theta_i = base' ** (-2i / d)."""
    stretched = base * alpha ** (rotary_dim / (rotary_dim - 2))
    return torch.tensor([stretched ** (-2 * i / rotary_dim) for i in range(rotary_dim // 2)], dtype=torch.float64)


@pytest.mark.parametrize("rotary_dim, base, alpha", [(128, 10000.0, 1000.0), (64, 500000.0, 4.0), (8, 10000.0, 50.0)])
def test_frequencies_match_float64_form(rotary_dim, base, alpha):
    f = frequencies(rotary_dim, base=base, scaling={"rope_type": "ntk_alpha", "alpha": alpha})
    ref = reference_inv_freq(base, alpha, rotary_dim)
    assert f.rope_type == "ntk_alpha" and f.attention_scaling == 1.0
    torch.testing.assert_close(f.inv_freq.double(), ref, rtol=2e-6, atol=0)
    # the lowest frequency is divided by exactly alpha, the highest is untouched (the NTK property)
    plain = frequencies(rotary_dim, base=base).inv_freq.double()
    assert math.isclose(float(plain[-1] / f.inv_freq[-1].double()), alpha, rel_tol=1e-5)
    assert float(f.inv_freq[0]) == 1.0


def test_dynamic_with_alpha_is_static_ntk_alpha():
    """A "dynamic" block with alpha (HunYuan's label) is ntk_alpha: static, alpha alone, as transformers and vLLM."""
    block = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "max_position_embeddings": 32}
    f = frequencies(64, scaling=block)
    assert f.rope_type == "ntk_alpha"
    torch.testing.assert_close(f.inv_freq.double(), reference_inv_freq(10000.0, 1000.0, 64), rtol=2e-6, atol=0)
    rope = RoPE(64, scaling=block)
    short = rope.cos_sin(torch.arange(8))
    rope.cos_sin(torch.arange(500))  # far past max_position_embeddings: dynamic NTK would grow its base here
    again = rope.cos_sin(torch.arange(8))
    assert all(torch.equal(a, b) for a, b in zip(short, again))
    assert torch.equal(rope.inv_freq, f.inv_freq)


def test_alpha_errors_name_the_value():
    with pytest.raises(ConfigError, match="alpha"):
        frequencies(64, scaling={"rope_type": "ntk_alpha", "alpha": -2.0})
    with pytest.raises(ConfigError, match="alpha"):
        frequencies(64, scaling={"rope_type": "ntk_alpha", "alpha": "1000"})
    with pytest.raises(ConfigError, match="alpha"):
        frequencies(64, scaling={"rope_type": "ntk_alpha", "alpha": 1e300})
    with pytest.raises(ConfigError, match=r"factor=4\.0.*alpha"):
        frequencies(64, scaling={"rope_type": "dynamic", "alpha": 1000.0, "factor": 4.0})
    with pytest.warns(UserWarning, match="factor=4.0"):
        f = frequencies(64, scaling={"rope_type": "dynamic", "alpha": 1000.0, "factor": 4.0}, strict=False)
    torch.testing.assert_close(f.inv_freq.double(), reference_inv_freq(10000.0, 1000.0, 64), rtol=2e-6, atol=0)
    # alpha on a type that does not read it is named, never dropped
    with pytest.raises(ConfigError, match="alpha"):
        frequencies(64, scaling={"rope_type": "linear", "factor": 2.0, "alpha": 1000.0})


def _tiny(model_type: str, block: dict) -> transformers.PretrainedConfig:
    sizes = dict(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=64,
        max_position_embeddings=64,
        num_experts=2,
        moe_topk=1,
    )
    return transformers.AutoConfig.for_model(model_type, rope_scaling=dict(block), **sizes)


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_hunyuan_model_matches(model_type):
    """The model's own rotary embedding and apply function, on a tiny model from a config with alpha."""
    torch.manual_seed(0)
    cfg = _tiny(model_type, HUNYUAN_BLOCK)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    rope = RoPE.from_hf_config(cfg)
    assert rope.freqs.rope_type == "ntk_alpha" and dict(rope.freqs.scaling) == {
        "rope_type": "ntk_alpha",
        "alpha": 1000.0,
        "factor": 1.0,
        "max_position_embeddings": 64,
    }
    hf_rotary = model.model.rotary_emb
    assert hf_rotary.rope_type == "ntk_alpha"
    assert torch.equal(rope.inv_freq, hf_rotary.inv_freq)  # bit-identical
    positions = torch.tensor([0, 1, 5, 17, 63, 200])  # past max_position_embeddings: still static
    hf_cos, hf_sin = hf_rotary(torch.zeros(1), positions[None])
    assert torch.equal(hf_rotary.inv_freq, rope.inv_freq)  # transformers did not grow it either
    cos, sin = rope.cos_sin(positions)
    torch.testing.assert_close(cos, hf_cos[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(sin, hf_sin[0], rtol=0, atol=2e-6)

    # the model's own apply function on its tables, against rotary's rotation
    apply = __import__(type(model).__module__, fromlist=["apply_rotary_pos_emb"]).apply_rotary_pos_emb
    q, k = torch.randn(1, 4, len(positions), 16), torch.randn(1, 2, len(positions), 16)
    expected_q, expected_k = apply(q, k, hf_cos, hf_sin)
    got_q, got_k = rope(q, k, position_ids=positions)
    torch.testing.assert_close(got_q, expected_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_k, expected_k, rtol=0, atol=1e-5)


def test_read_hf_config_drops_yarn_keys_of_alpha_blocks_only():
    d = {
        "model_type": "hunyuan_v1_dense",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rope_scaling": dict(HUNYUAN_BLOCK),
    }
    s = read_hf_config(d)
    assert s.scaling == {"rope_type": "ntk_alpha", "alpha": 1000.0, "factor": 1.0, "max_position_embeddings": 64}
    # the same keys on a plain dynamic block (no alpha) are refused by name, not dropped
    d["rope_scaling"] = {k: v for k, v in HUNYUAN_BLOCK.items() if k != "alpha"}
    with pytest.raises(ConfigError, match="beta_fast"):
        RoPE.from_hf_config(d)


def test_vllm_rule_is_the_same_frequencies():
    """vLLM's DynamicNTKAlphaRotaryEmbedding: base * alpha ** (rotary_dim / (rotary_dim - 2)), in fp32 powers."""
    rotary_dim, base, alpha = 128, 10000.0, 1000.0
    stretched = base * alpha ** (rotary_dim / (rotary_dim - 2))
    vllm_inv_freq = 1.0 / (stretched ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    assert torch.equal(
        frequencies(rotary_dim, base=base, scaling={"rope_type": "ntk_alpha", "alpha": alpha}).inv_freq, vllm_inv_freq
    )
