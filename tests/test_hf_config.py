"""RoPE.from_hf_config on real architectures' configs (tests/fixtures) and strict validation."""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import assume, example, given
from hypothesis import strategies as st
from transformers import AutoConfig

import rotary
from helpers import assert_named_error, assert_sound, computes, hf_config, text_config
from rotary import ConfigError, RoPE, frequencies
from rotary.hf import read_hf_layers
from rotary.hf.config import read_hf_config
from rotary.rope_types import ROPE_TYPES
from strategies import NASTY, NUMBERS, PROPERTIES, accepted, frequencies_verdict

transformers.logging.set_verbosity_error()

FIXTURES = Path(__file__).parent / "fixtures"

# fixture -> (RotaryEmbedding class in transformers, head_dim, rotary_dim, interleaved, rope_type)
ARCHITECTURES = {
    "llama2": ("llama.modeling_llama.LlamaRotaryEmbedding", 128, 128, False, "default"),
    "llama3_1": ("llama.modeling_llama.LlamaRotaryEmbedding", 128, 128, False, "llama3"),
    "mistral": ("mistral.modeling_mistral.MistralRotaryEmbedding", 128, 128, False, "default"),
    "qwen2": ("qwen2.modeling_qwen2.Qwen2RotaryEmbedding", 128, 128, False, "yarn"),
    "gpt_neox": ("gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding", 256, 64, False, "default"),
    "phi3_longrope": ("phi3.modeling_phi3.Phi3RotaryEmbedding", 96, 96, False, "longrope"),
    "gpt_oss": ("gpt_oss.modeling_gpt_oss.GptOssRotaryEmbedding", 64, 64, False, "yarn"),
    "deepseek_v3": ("deepseek_v3.modeling_deepseek_v3.DeepseekV3RotaryEmbedding", 64, 64, True, "yarn"),
}


def load(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def hf_class(dotted: str):
    module, cls = dotted.rsplit(".", 1)
    return getattr(__import__(f"transformers.models.{module}", fromlist=[cls]), cls)


def assert_tables_match(hf_module, rope: RoPE, positions: torch.Tensor, **kwargs) -> None:
    hf_cos, hf_sin = hf_module(torch.zeros(1), positions[None], **kwargs)
    cos, sin = rope.cos_sin(positions)
    r = rope.rotary_dim
    if rope.interleaved:  # transformers keeps cat(freqs, freqs); compare per pair
        cos, sin = cos[:, 0::2], sin[:, 0::2]
        hf_cos, hf_sin = hf_cos[..., : r // 2], hf_sin[..., : r // 2]
    elif hf_cos.shape[-1] == r // 2:  # gpt-oss returns one entry per pair
        cos, sin = cos[:, : r // 2], sin[:, : r // 2]
    # transformers rounds each angle to fp32 once (<= |angle| * 2**-24), then a few half-ulps more
    theta = positions.double()[:, None] * rope.inv_freq.double()
    tol = rope.attention_scaling * (theta.abs() + 4) * 2.0**-24
    if cos.shape[-1] == 2 * tol.shape[-1]:
        tol = torch.cat((tol, tol), dim=-1)
    if tol.shape[-1] < cos.shape[-1]:
        tol = torch.cat((tol, tol[:, -1:].expand(-1, cos.shape[-1] - tol.shape[-1])), dim=-1)
    assert bool(((cos.double() - hf_cos[0].double()).abs() <= tol).all())
    assert bool(((sin.double() - hf_sin[0].double()).abs() <= tol).all())


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_fixture_matches_transformers_module(name):
    dotted, head_dim, rotary_dim, interleaved, rope_type = ARCHITECTURES[name]
    d = load(name)
    cfg = hf_config(d)
    hf = hf_class(dotted)(cfg)
    before = copy.deepcopy(d)
    cfg_before = cfg.to_dict()
    for source in (FIXTURES / f"{name}.json", str(FIXTURES / f"{name}.json"), d, cfg):
        rope = RoPE.from_hf_config(source)
        assert (rope.head_dim, rope.rotary_dim, rope.interleaved, rope.freqs.rope_type) == (
            head_dim,
            rotary_dim,
            interleaved,
            rope_type,
        )
        assert torch.equal(rope.inv_freq, hf.inv_freq)
        assert rope.attention_scaling == hf.attention_scaling
    assert d == before, "from_hf_config modified the dict it was given"
    assert cfg.to_dict() == cfg_before, "from_hf_config modified the PretrainedConfig it was given"
    assert_tables_match(hf, rope, torch.arange(0, 300))


def test_llama_outputs_equal_transformers_attention_inputs():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = hf_config(load("llama3_1"))
    hf = LlamaRotaryEmbedding(cfg)
    rope = RoPE.from_hf_config(cfg)
    q, k = torch.randn(2, 4, 24, 128), torch.randn(2, 2, 24, 128)
    cos, sin = hf(q, torch.arange(100, 124)[None])
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    q_rot, k_rot = rope(q, k, offset=100)
    # transformers' fp32 angles at positions <= 123 are off by up to 123 * 2**-24 rad, times |q| <= ~5
    torch.testing.assert_close(q_rot, hf_q, rtol=0, atol=5e-5)
    torch.testing.assert_close(k_rot, hf_k, rtol=0, atol=5e-5)


def test_deepseek_v3_pairs_interleaved_like_transformers():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3RotaryEmbedding,
        apply_rotary_pos_emb_interleave,
    )

    cfg = hf_config(load("deepseek_v3"))
    hf = DeepseekV3RotaryEmbedding(cfg)
    rope = RoPE.from_hf_config(load("deepseek_v3"))
    q, k = torch.randn(1, 3, 20, 64), torch.randn(1, 1, 20, 64)
    cos, sin = hf(q, torch.arange(20)[None])
    hf_q, hf_k = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    q_rot, k_rot = rope(q, k)
    # transformers writes the rotated pairs de-interleaved (the same permutation of q and k, so the same
    # scores); undo it to compare
    torch.testing.assert_close(rotary.to_half(q_rot), hf_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(rotary.to_half(k_rot), hf_k, rtol=0, atol=1e-5)
    assert torch.allclose(q_rot @ k_rot.transpose(-1, -2), hf_q @ hf_k.transpose(-1, -2), atol=1e-4)


def test_gptj_rotary_dim_and_interleaved_pairs():
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    d = load("gptj")
    rope = RoPE.from_hf_config(d)
    assert (rope.head_dim, rope.rotary_dim, rope.interleaved, rope.freqs.base) == (256, 64, True, 10000.0)
    table = create_sinusoidal_positions(2048, 64)
    positions = torch.arange(37, 61)
    sin, cos = torch.split(table[positions][None], 32, dim=-1)
    q = torch.randn(1, 24, 2, 256)  # GPT-J rotates [B, S, H, D]
    hf_rot = apply_rotary_pos_emb(q[..., :64], sin, cos)
    ours = rope.rotate(q, position_ids=positions, layout="bshd")
    torch.testing.assert_close(ours[..., :64], hf_rot, rtol=0, atol=1e-5)
    assert torch.equal(ours[..., 64:], q[..., 64:])


@pytest.mark.parametrize("model_type", ["gptj", "codegen"])
@pytest.mark.parametrize(
    "key, value",
    [
        ("rope_theta", 1e6),
        ("partial_rotary_factor", 0.5),
        ("head_dim", 128),
        ("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
        ("rope_parameters", {"rope_type": "default", "rope_theta": 5e5}),
        ("rope_scaling", "linear"),  # not a block at all
    ],
)
def test_gptj_and_codegen_read_no_other_rope_key(model_type, key, value):
    """GPT-J's and CodeGen's attention build their own tables (``create_sinusoidal_positions``: base 10000 over
    ``rotary_dim`` channels of heads of n_embd / n_head) and read no other RoPE key; rotary read them (a stated
    rope_theta of 1e6 turned the model's queries at another base). Strict: a ConfigError naming the key; lenient: a
    warning and the attention's own tables."""
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    d = {**load("gptj"), "model_type": model_type, key: value}
    with pytest.raises(ConfigError, match=rf"{key}=.*but transformers' '{model_type}' attention never reads it"):
        RoPE.from_hf_config(d)
    with pytest.warns(UserWarning, match="never reads it"):
        rope = RoPE.from_hf_config(d, strict=False)
    assert (rope.head_dim, rope.rotary_dim) == (256, 64)
    sin, cos = create_sinusoidal_positions(40, 64).chunk(2, dim=-1)
    want_cos, want_sin = (t.repeat_interleave(2, dim=-1) for t in (cos, sin))  # GPT-J's pairs (2i, 2i + 1)
    got_cos, got_sin = rope.cos_sin(torch.arange(40))
    torch.testing.assert_close(got_cos, want_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_sin, want_sin, rtol=0, atol=1e-6)
    # the value the attention uses, stated: nothing to say
    used = {"rope_theta": 10000.0, "partial_rotary_factor": 1.0, "head_dim": 256}.get(key, {"rope_type": "default"})
    assert torch.equal(RoPE.from_hf_config({**d, key: used}).inv_freq, rope.inv_freq)


def test_gemma3_nested_blocks_one_rope_per_layer_type():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    d = load("gemma3_nested")
    cfg = hf_config(d)
    hf = Gemma3RotaryEmbedding(cfg)
    local = RoPE.from_hf_config(d, layer_type="sliding_attention")
    global_ = RoPE.from_hf_config(cfg, layer_type="full_attention")
    assert (local.freqs.rope_type, local.freqs.base) == ("default", 10000.0)
    assert (global_.freqs.rope_type, global_.freqs.base, global_.freqs.scaling["factor"]) == ("linear", 1e6, 8.0)
    for layer_type, rope in (("sliding_attention", local), ("full_attention", global_)):
        assert torch.equal(rope.inv_freq, getattr(hf, f"{layer_type}_inv_freq"))
        assert_tables_match(hf, rope, torch.arange(50), layer_type=layer_type)
    with pytest.raises(
        ConfigError, match=r"one RoPE block per layer type \(full_attention, sliding_attention\); pass layer_type="
    ):
        RoPE.from_hf_config(d)
    with pytest.raises(ConfigError, match="'chunked_attention' has no RoPE block"):
        RoPE.from_hf_config(d, layer_type="chunked_attention")


def test_gemma3_4x_layout_reads_like_the_nested_one():
    d = load("gemma3_nested")
    del d["rope_parameters"]
    d.update(rope_theta=1e6, rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0})
    wrapped = {"model_type": "gemma3", "text_config": d}  # multimodal checkpoints nest the text model
    nested = load("gemma3_nested")
    for layer_type in ("sliding_attention", "full_attention"):
        a = RoPE.from_hf_config(wrapped, layer_type=layer_type)
        b = RoPE.from_hf_config(nested, layer_type=layer_type)
        assert torch.equal(a.inv_freq, b.inv_freq) and a.freqs.rope_type == b.freqs.rope_type


def test_dynamic_from_4x_config_gets_the_context_length():
    d = load("llama2")
    d["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    rope = RoPE.from_hf_config(d)
    assert rope.freqs.scaling["max_position_embeddings"] == 4096
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = LlamaRotaryEmbedding(hf_config(d))
    for length in (10, 5000, 4097, 100):
        assert_tables_match(hf, rope, torch.arange(length))
        assert torch.equal(rope.inv_freq, hf.inv_freq)


def test_config_folder_and_bad_sources(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(load("mistral")))
    assert RoPE.from_hf_config(tmp_path).freqs.base == 1e6
    with pytest.raises(FileNotFoundError, match="no config file"):
        RoPE.from_hf_config(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="broken.json is not valid JSON"):
        RoPE.from_hf_config(tmp_path / "broken.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="list.json does not hold a JSON object"):
        RoPE.from_hf_config(tmp_path / "list.json")
    with pytest.raises(TypeError, match="PretrainedConfig, a dict or a path"):
        RoPE.from_hf_config(42)
    # a config of an architecture without defaults must state its head width (transformers' Llama
    # defaults fill it for model_type "llama": see test_published_configs_fill_defaults_like_transformers)
    with pytest.raises(ConfigError, match="head_dim"):
        read_hf_config({"model_type": "my_custom_model", "rope_theta": 1e4}, interleaved=False)


# ---- strict validation: every error, its message, and the strict=False path ---------------------
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}

BAD = [
    # (block, head_dim, message pattern, value error that strict=False only warns about)
    (
        {"rope_type": "yarnn"},
        64,
        r"unknown rope_type 'yarnn'; valid rope_types: default, dynamic, linear, llama3, "
        r"longrope, ntk, ntk_alpha, proportional, yarn",
        False,
    ),
    ({"rope_type": "linear"}, 64, r"rope_type 'linear' needs the key\(s\) \['factor'\]", False),
    (
        {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"},
        64,
        r"needs the key\(s\) \['low_freq_factor'\]",
        False,
    ),
    (
        {"rope_type": "linear", "factor": 2.0, "beta_fast": 32},
        64,
        r"key 'beta_fast' belongs to rope_type yarn, not 'linear'; remove it or set rope_type to 'yarn'",
        True,
    ),
    ({"rope_type": "linear", "factor": 2.0, "facter": 2}, 64, r"unknown key 'facter' for rope_type 'linear'", True),
    ({"rope_type": "linear", "factor": 0.5}, 64, r"factor=0.5 < 1 for rope_type 'linear'.*use factor >= 1", True),
    ({**YARN, "factor": 0.9}, 64, r"factor=0.9 < 1 for rope_type 'yarn'", True),
    ({"rope_type": "dynamic", "factor": 0.5, "max_position_embeddings": 64}, 64, r"factor=0.5 < 1", True),
    ({**YARN, "beta_fast": 1, "beta_slow": 32}, 64, r"beta_fast=1 must be greater than beta_slow=32", True),
    ({**YARN, "beta_fast": 2, "beta_slow": 2}, 64, r"beta_fast=2 must be greater than beta_slow=2", True),
    (
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 31,
            "long_factor": [2.0] * 32,
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
        },
        64,
        r"short_factor has 31 entries but rotary_dim=64 needs 32",
        False,
    ),
    (
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 32,
            "long_factor": [2.0] * 16,
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
        },
        64,
        r"long_factor has 16 entries but rotary_dim=64 needs 32",
        False,
    ),
    (
        {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0},
        64,
        r"low_freq_factor=4.0 must be smaller than high_freq_factor=1.0",
        True,
    ),
    ({**LLAMA3, "low_freq_factor": 2.0, "high_freq_factor": 2.0}, 64, r"low_freq_factor=2.0 must be smaller", True),
    (
        {**LLAMA3, "original_max_position_embeddings": 8192.5},
        64,
        r"original_max_position_embeddings must be a positive int .*got 8192.5",
        True,
    ),
    (
        {**YARN, "original_max_position_embeddings": -4},
        64,
        r"original_max_position_embeddings must be a positive int",
        False,
    ),
    (
        {"rope_type": "default", "partial_rotary_factor": 0.3},
        64,
        r"head_dim=64 \* partial_rotary_factor=0.3 gives an odd rotary dimension 19",
        True,
    ),
    # issue 24: the default type took any key (a factor that scales nothing, a misspelt mrope key)
    (
        {"rope_type": "default", "rope_theta": 1e4, "factor": 8.0},
        64,
        r"key 'factor' belongs to rope_type dynamic / linear / .*, not 'default'; remove it or set rope_type",
        True,
    ),
    (
        {"rope_type": "default", "mrope_sections": True},
        64,
        r"unknown key 'mrope_sections' for rope_type 'default'; valid keys: partial_rotary_factor, rope_theta",
        True,
    ),
    ({"foo_bar": 1}, 64, r"unknown key 'foo_bar' for rope_type 'default'", True),
]


@pytest.mark.parametrize("block, head_dim, message, warns", BAD, ids=[str(i) for i in range(len(BAD))])
def test_each_mistake_is_a_config_error_naming_the_fix(block, head_dim, message, warns):
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ConfigError, match=message):
        frequencies(head_dim, scaling=block)
    with pytest.raises(ValueError, match=message):  # the module checks the same way
        RoPE(head_dim, scaling=block)
    if warns:
        with pytest.warns(UserWarning, match=message):
            f = frequencies(head_dim, scaling=block, strict=False)
        assert f.inv_freq.dtype == torch.float32 and bool(torch.isfinite(f.inv_freq).all())
    else:  # without these the frequencies cannot be computed at all
        with pytest.raises(ConfigError, match=message):
            frequencies(head_dim, scaling=block, strict=False)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("factor", 8.0, r"key 'factor' belongs to rope_type dynamic / linear / .*, not 'default'; remove it"),
        ("mrope_sections", True, r"unknown key 'mrope_sections' for rope_type 'default'; valid keys: "),
        ("foo_bar", 1, r"unknown key 'foo_bar' for rope_type 'default'"),
    ],
)
@pytest.mark.parametrize("where", ["rope_parameters", "rope_scaling"])
def test_a_default_block_from_a_config_names_its_unknown_keys(key, value, message, where):
    """issue 24: a config whose default block carries a key of another type (or none) is refused strictly."""
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "rope_theta": 1e4,
        where: {"rope_type": "default", key: value},
    }
    with pytest.raises(ConfigError, match=message):
        RoPE.from_hf_config(config)
    with pytest.warns(UserWarning, match=message):
        rope = RoPE.from_hf_config(config, strict=False)
    assert torch.equal(rope.inv_freq, frequencies(64, base=1e4).inv_freq)  # the key changes nothing


def test_the_keys_real_configs_put_in_a_default_block_are_accepted_strictly():
    """rope_theta (any model) and partial_rotary_factor (a model that reads it: Phi; one whose transformers model never
    reads it is test_a_partial_rotary_factor_the_model_never_reads_...), mrope_section / mrope_interleaved (Qwen-VL)."""
    phi = {
        "model_type": "phi",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5},
    }
    rope = RoPE.from_hf_config(phi)
    assert rope.rotary_dim == 32 and torch.equal(rope.inv_freq, frequencies(32, base=5e5).inv_freq)
    qwen3_vl = {
        "model_type": "qwen3_vl",
        "text_config": {
            "model_type": "qwen3_vl_text",
            "head_dim": 128,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
        },
    }
    assert read_hf_config(qwen3_vl).scaling == {"rope_type": "default"}  # the mrope keys are read, not passed on
    mrope = rotary.MRoPE.from_hf_config(qwen3_vl)
    assert mrope.mrope_section == (24, 20, 20) and mrope.mrope_interleaved and mrope.freqs.base == 5e6
    qwen2_vl = {
        "model_type": "qwen2_vl",
        "hidden_size": 1536,
        "num_attention_heads": 12,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    }
    mrope = rotary.MRoPE.from_hf_config(qwen2_vl)
    assert mrope.mrope_section == (16, 24, 24) and not mrope.mrope_interleaved


def test_strict_false_follows_transformers_on_an_odd_rotary_dim():
    # transformers rotates ceil(19 / 2) = 10 pairs with exponents over 19; accepted with a warning
    with pytest.warns(UserWarning, match="odd rotary dimension 19"):
        f = frequencies(64, scaling={"rope_type": "default", "partial_rotary_factor": 0.3}, strict=False)
    assert f.rotary_dim == 20
    expected = 1.0 / (10000.0 ** (torch.arange(0, 19, 2, dtype=torch.int64).float() / 19))
    assert torch.equal(f.inv_freq, expected)


def test_from_hf_config_strict_and_lenient():
    d = load("llama3_1")
    d["rope_scaling"]["high_freq_factor"] = 0.5
    with pytest.raises(ConfigError, match="low_freq_factor=1.0 must be smaller than high_freq_factor=0.5"):
        RoPE.from_hf_config(d)
    with pytest.warns(UserWarning, match="must be smaller"):
        RoPE.from_hf_config(d, strict=False)
    # a block that omits its trained length: transformers silently uses max_position_embeddings
    d = load("qwen2")
    del d["rope_scaling"]["original_max_position_embeddings"]
    with pytest.raises(ConfigError, match="no original_max_position_embeddings .* add it"):
        RoPE.from_hf_config(d)
    with pytest.warns(UserWarning, match="transformers would use max_position_embeddings=131072"):
        rope = RoPE.from_hf_config(d, strict=False)
    assert rope.freqs.scaling["original_max_position_embeddings"] == 131072


def test_other_input_errors():
    with pytest.raises(ConfigError, match="partial_rotary_factor must be a number in \\(0, 1\\]"):
        frequencies(64, scaling={"partial_rotary_factor": 1.5})
    with pytest.raises(ConfigError, match="rotary_dim=2; use rotary_dim >= 4"):
        frequencies(64, rotary_dim=2, scaling={"rope_type": "ntk", "factor": 2.0})
    with pytest.raises(ConfigError, match="short_factor must be a list of 32 numbers"):
        frequencies(
            64,
            scaling={
                "rope_type": "longrope",
                "short_factor": "1.0",
                "long_factor": [1.0] * 32,
                "factor": 2.0,
                "original_max_position_embeddings": 64,
            },
        )
    with pytest.raises(ConfigError, match="needs 'factor' or 'max_position_embeddings'"):
        frequencies(
            64,
            scaling={
                "rope_type": "longrope",
                "short_factor": [1.0] * 32,
                "long_factor": [1.0] * 32,
                "original_max_position_embeddings": 64,
            },
        )
    with pytest.raises(ConfigError, match="attention_factor=-1.0 for rope_type .yarn. must be > 0"):
        frequencies(64, scaling={**YARN, "attention_factor": -1.0})
    with pytest.raises(ConfigError, match="truncate of rope_type .yarn. must be true or false, got .no."):
        frequencies(64, scaling={**YARN, "truncate": "no"})
    with pytest.raises(ConfigError, match="scaling block must be a dict"):
        frequencies(64, scaling=[("rope_type", "linear")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a valid block warns about nothing
        frequencies(64, scaling=dict(YARN, beta_fast=32, beta_slow=1, truncate=False, mscale=1.0, mscale_all_dim=1.0))


def test_a_4x_config_object_is_read_through_to_dict_and_left_alone():
    class Legacy:  # what a transformers 4.x PretrainedConfig offers: attributes and a to_dict() copy
        def __init__(self, d):
            self.__dict__.update(d)

        def to_dict(self):
            return copy.deepcopy(self.__dict__)

    d = load("llama3_1")
    legacy = Legacy(d)
    rope = RoPE.from_hf_config(legacy)
    assert torch.equal(rope.inv_freq, RoPE.from_hf_config(d).inv_freq)
    assert legacy.to_dict() == d


def test_length_dependent_recompute_keeps_an_odd_partial_width_like_transformers():
    block = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8, "partial_rotary_factor": 0.3}
    with pytest.warns(UserWarning, match="odd rotary dimension 19"):
        rope = RoPE(64, scaling=block, strict=False)
    rope.cos_sin(torch.arange(40))
    with pytest.warns(UserWarning):
        expected = frequencies(64, scaling=block, seq_len=torch.tensor(40), strict=False)
    assert torch.equal(rope.inv_freq, expected.inv_freq) and rope.rotary_dim == 20


def test_missing_key_message_says_what_the_key_is():
    with pytest.raises(ConfigError, match=r"\['max_position_embeddings'\].*the model's context length"):
        RoPE(64, scaling={"rope_type": "dynamic", "factor": 2.0})


def test_an_error_about_a_derived_head_width_says_where_it_came_from():
    """A head width the config does not state (hidden_size / num_attention_heads, either a model type's default) is
    named with its sources in an error about it: the derived value alone ("an odd rotary dimension 3") names no key."""
    pythia = {k: v for k, v in CONFIGS["pythia-160m"].items() if k != "num_attention_heads"}
    with pytest.raises(
        ConfigError,
        match=r"odd rotary dimension 3.*\(head_dim=12 is hidden_size=768 / "
        r"num_attention_heads=64 \(gpt_neox's default: the config does not state num_attention_heads",
    ):
        RoPE.from_hf_config(pythia)
    phi3 = {**CONFIGS["phi3_longrope"], "hidden_size": 4096}
    with pytest.raises(
        ConfigError,
        match=r"short_factor has 48 entries.*head_dim=128 is hidden_size=4096 / "
        r"num_attention_heads=32\)$",
    ):
        RoPE.from_hf_config(phi3)
    with pytest.raises(
        ConfigError, match=r"odd rotary dimension 3; .*channels\)$"
    ):  # a stated head_dim is not explained
        RoPE.from_hf_config({**pythia, "head_dim": 12})


def test_gptj_null_rotary_dim_rotates_the_whole_head():
    d = dict(load("gptj"), rotary_dim=None)
    assert RoPE.from_hf_config(d).rotary_dim == 256
    with pytest.raises(ConfigError, match="rotary_dim must be a positive int, got 0"):
        RoPE.from_hf_config(dict(d, rotary_dim=0))


def test_phi3_early_longrope_names():
    for name in ("su", "yarn"):
        d = load("phi3_longrope")
        d["rope_scaling"]["type"] = name
        assert RoPE.from_hf_config(d).freqs.rope_type == "longrope"


@pytest.mark.parametrize(
    "model_type, extra",
    [("cohere", {}), ("glm", {"partial_rotary_factor": 0.5, "head_dim": 64})],
)
def test_interleaved_architectures_match_transformers_attention_inputs(model_type, extra):
    module = __import__(f"transformers.models.{model_type}.modeling_{model_type}", fromlist=["x"])
    d = {
        "model_type": model_type,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "intermediate_size": 8,
        "vocab_size": 8,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "pad_token_id": 0,
        **extra,
    }
    cfg = hf_config(d)
    hf = getattr(module, f"{type(cfg).__name__.removesuffix('Config')}RotaryEmbedding")(cfg)
    rope = RoPE.from_hf_config(d)
    assert rope.interleaved
    q, k = torch.randn(1, 2, 16, 64), torch.randn(1, 2, 16, 64)
    cos, sin = hf(q, torch.arange(16)[None])
    hf_q, hf_k = module.apply_rotary_pos_emb(q, k, cos, sin)
    q_rot, k_rot = rope(q, k)
    torch.testing.assert_close(q_rot, hf_q, rtol=0, atol=1e-5)
    torch.testing.assert_close(k_rot, hf_k, rtol=0, atol=1e-5)


def test_config_value_errors():
    d = load("llama2")
    with pytest.raises(ConfigError, match="rope_theta must be a finite number > 0, got -1"):
        RoPE.from_hf_config(dict(d, rope_theta=-1))
    with pytest.raises(ConfigError, match="rope_scaling must be a dict, got 'linear'"):
        RoPE.from_hf_config(dict(d, rope_scaling="linear"))
    with pytest.raises(ConfigError, match="config head_dim must be a positive int, got 0"):
        RoPE.from_hf_config(dict(d, head_dim=0))
    with pytest.raises(ConfigError, match="layer_type 'chunked' is not in the config's layer_types"):
        RoPE.from_hf_config(dict(d, layer_types=["full_attention"]), layer_type="chunked")
    # a flat block with layer_types declared: every layer type shares it
    rope = RoPE.from_hf_config(dict(d, layer_types=["full_attention"]), layer_type="full_attention")
    assert torch.equal(rope.inv_freq, RoPE.from_hf_config(d).inv_freq)


# ---- published config.json files, as published (tests/fixtures/published) ------------------------
PUBLISHED = FIXTURES / "published"
# file -> (RotaryEmbedding class in transformers, layer types, head_dim, rotary_dim, interleaved,
# rope_type per layer type)
PUBLISHED_FILES = {
    "llama-3.1-8b-instruct": ("llama.modeling_llama.LlamaRotaryEmbedding", [None], 128, 128, False, ["llama3"]),
    "qwen2.5-7b-instruct-yarn": ("qwen2.modeling_qwen2.Qwen2RotaryEmbedding", [None], 128, 128, False, ["yarn"]),
    "mistral-7b-instruct-v0.3": (
        "mistral.modeling_mistral.MistralRotaryEmbedding", [None], 128, 128, False, ["default"]
    ),
    "phi-3.5-mini-instruct": ("phi3.modeling_phi3.Phi3RotaryEmbedding", [None], 96, 96, False, ["longrope"]),
    "deepseek-v3": ("deepseek_v3.modeling_deepseek_v3.DeepseekV3RotaryEmbedding", [None], 64, 64, True, ["yarn"]),
    "gemma-3-4b-it": ("gemma3.modeling_gemma3.Gemma3RotaryEmbedding", ["sliding_attention", "full_attention"], 256, 256,
                      False, ["default", "linear"]),
    "gpt-oss-20b": ("gpt_oss.modeling_gpt_oss.GptOssRotaryEmbedding", [None], 64, 64, False, ["yarn"]),
    "pythia-160m": ("gpt_neox.modeling_gpt_neox.GPTNeoXRotaryEmbedding", [None], 64, 16, False, ["default"]),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED_FILES))
def test_published_configs_read_as_transformers_reads_them(name):
    # issue 13 item 1: each file as published, against transformers' own rotary class built from the same file
    dotted, layer_types, head_dim, rotary_dim, interleaved, rope_types = PUBLISHED_FILES[name]
    path = PUBLISHED / f"{name}.json"
    d = json.loads(path.read_text())
    hf = hf_class(dotted)(text_config(d))
    for layer_type, rope_type in zip(layer_types, rope_types):
        kwargs = {} if layer_type is None else {"layer_type": layer_type}
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a published file reads without a complaint
            rope = RoPE.from_hf_config(path, **kwargs)
            # the same from the dict and from transformers' config object built from the file
            for source in (copy.deepcopy(d), AutoConfig.for_model(**copy.deepcopy(d))):
                again = RoPE.from_hf_config(source, **kwargs)
                assert torch.equal(again.freqs.inv_freq, rope.freqs.inv_freq), type(source).__name__
                assert again.attention_scaling == rope.attention_scaling and again.interleaved == rope.interleaved
        assert (rope.head_dim, rope.rotary_dim, rope.interleaved, rope.freqs.rope_type) == (
            head_dim,
            rotary_dim,
            interleaved,
            rope_type,
        )
        assert torch.equal(rope.freqs.inv_freq, getattr(hf, f"{layer_type or ''}{'_' if layer_type else ''}inv_freq"))
        hf_scaling = hf.attention_scaling if layer_type is None else getattr(hf, f"{layer_type}_attention_scaling")
        assert rope.attention_scaling == hf_scaling
        long = 4200 if rope_type == "longrope" else 0  # the long factors as well
        for positions in (torch.arange(0, 300), torch.arange(long, long + 50)):
            assert_tables_match(hf, rope, positions, **kwargs)
    assert json.loads(path.read_text()) == d


def test_gemma3_4b_it_is_filled_from_transformers_defaults_and_from_the_table_alike(monkeypatch):
    # the file states neither head_dim, num_attention_heads nor either base: transformers' Gemma-3 defaults
    path = PUBLISHED / "gemma-3-4b-it.json"
    with_transformers = {lt: read_hf_config(path, layer_type=lt) for lt in ("sliding_attention", "full_attention")}
    assert with_transformers["sliding_attention"].base == 10000.0 and with_transformers["full_attention"].base == 1e6
    assert with_transformers["full_attention"].scaling == {"rope_type": "linear", "factor": 8.0}
    assert {s.head_dim for s in with_transformers.values()} == {256}
    monkeypatch.setattr(rotary.hf.config, "_transformers_installed", lambda: False)  # the table instead
    for layer_type, settings in with_transformers.items():
        assert read_hf_config(path, layer_type=layer_type) == settings


def test_every_published_family_reads_the_same_without_transformers(monkeypatch):
    settings = {}
    for name, (_, layer_types, *_rest) in PUBLISHED_FILES.items():
        for layer_type in layer_types:
            settings[name, layer_type] = read_hf_config(PUBLISHED / f"{name}.json", layer_type=layer_type)
    monkeypatch.setattr(rotary.hf.config, "_transformers_installed", lambda: False)
    for (name, layer_type), expected in settings.items():
        assert read_hf_config(PUBLISHED / f"{name}.json", layer_type=layer_type) == expected, name


@pytest.mark.parametrize("model_type", sorted(rotary.hf.config.MODEL_DEFAULTS))
def test_defaults_table_equals_transformers_config_classes(model_type):
    from rotary.hf.config import model_defaults

    assert model_defaults(model_type, source="table") == model_defaults(model_type, source="transformers")


def test_text_model_types_of_multimodal_wrappers_equal_transformers():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    for outer, inner in rotary.hf.config.TEXT_MODEL_TYPES.items():
        assert CONFIG_MAPPING[outer]().text_config.model_type == inner, outer


def test_missing_values_are_filled_like_transformers():
    # each omitted value, from the model's config class: Phi-2's partial factor, gpt-oss's YaRN block,
    # GPT-NeoX's rotary_pct and base, DeepSeek-V3's rope_interleave and rope head width
    cases = [
        ({"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32}, (80, 40, False, "default", 10000.0)),
        ({"model_type": "gpt_oss"}, (64, 64, False, "yarn", 150000.0)),
        (
            {"model_type": "gpt_neox", "hidden_size": 2048, "num_attention_heads": 16},
            (128, 32, False, "default", 10000.0),
        ),
        ({"model_type": "deepseek_v3", "max_position_embeddings": 4096}, (64, 64, True, "default", 10000.0)),
        ({"model_type": "llama"}, (128, 128, False, "default", 10000.0)),
    ]
    for d, expected in cases:
        rope = RoPE.from_hf_config(d)
        assert (rope.head_dim, rope.rotary_dim, rope.interleaved, rope.freqs.rope_type, rope.freqs.base) == expected, d
        hf = AutoConfig.for_model(**copy.deepcopy(d))
        assert torch.equal(rope.inv_freq, RoPE.from_hf_config(hf).inv_freq), d  # the config object, fully filled


# ---- item 2 of issue 11: rope_parameters and a legacy rope_scaling in one config ---------------------
def test_both_blocks_that_disagree_are_an_error_and_leniently_what_transformers_does():
    d = load("mistral")  # rope_parameters {"rope_type": "default", "rope_theta": 1e6}
    d["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}
    with pytest.raises(
        ConfigError,
        match=r"both rope_parameters=.* and a legacy rope_scaling=.*transformers 5.23 reads "
        r"rope_scaling instead of rope_parameters.*'rope_theta': 10000.0.*merge",
    ):
        RoPE.from_hf_config(d)
    with pytest.warns(UserWarning, match="both rope_parameters"):
        rope = RoPE.from_hf_config(d, strict=False)
    # transformers drops rope_parameters, its rope_theta included, and falls back to the default base
    hf = hf_config(d)
    assert hf.rope_parameters["rope_theta"] == 10000.0 and rope.freqs.base == 10000.0
    assert rope.freqs.rope_type == "yarn"
    assert torch.equal(rope.inv_freq, hf_class("mistral.modeling_mistral.MistralRotaryEmbedding")(hf).inv_freq)


def test_both_blocks_that_agree_are_read_without_a_word():
    d = load("mistral")
    d["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    d["rope_theta"] = 1e6
    d["rope_scaling"] = {"type": "linear", "factor": 2.0}  # what transformers reads gives the same block
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rope = RoPE.from_hf_config(d)
    hf = hf_config(d)
    assert torch.equal(rope.inv_freq, hf_class("mistral.modeling_mistral.MistralRotaryEmbedding")(hf).inv_freq)
    for empty in (None, {}):  # a null or empty rope_scaling is ignored, as in transformers
        assert RoPE.from_hf_config(dict(load("mistral"), rope_scaling=empty)).freqs.base == 1e6


def test_gemma3_merges_rope_scaling_into_the_full_attention_block_like_transformers():
    d = load("gemma3_nested")
    d["rope_scaling"] = {"rope_type": "linear", "factor": 4.0}  # disagrees with full_attention's factor 8
    with pytest.raises(ConfigError, match="both rope_parameters"):
        RoPE.from_hf_config(d, layer_type="full_attention")
    with pytest.warns(UserWarning, match="both rope_parameters"):
        rope = RoPE.from_hf_config(d, layer_type="full_attention", strict=False)
    hf = hf_class("gemma3.modeling_gemma3.Gemma3RotaryEmbedding")(hf_config(d))
    assert rope.freqs.scaling["factor"] == 4.0 and torch.equal(rope.inv_freq, hf.full_attention_inv_freq)


# ---- item 7 of issue 11: values read from configs are checked for type ------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        ({"rope_interleave": "true"}, r"rope_interleave must be true or false, got 'true' \(str\)"),
        ({"rope_interleave": 1}, r"rope_interleave must be true or false, got 1 \(int\)"),
        ({"rope_theta": "10000"}, r"rope_theta must be a finite number > 0, got '10000'"),
        ({"rope_theta": True}, r"rope_theta must be a finite number > 0, got True"),
        ({"qk_rope_head_dim": 64.0}, r"qk_rope_head_dim must be a positive int, got 64.0"),
        ({"max_position_embeddings": "163840"}, r"max_position_embeddings must be a positive int .*got '163840'"),
        ({"model_type": ["deepseek_v3"]}, r"model_type must be a string, got \['deepseek_v3'\]"),
        ({"layer_types": "full_attention"}, r"layer_types must be a list of strings, got 'full_attention'"),
        ({"text_config": "x", "rope_theta": None, "rope_scaling": None, "head_dim": None}, None),
    ],
)
def test_config_values_are_type_checked(change, message):
    d = {k: v for k, v in load("deepseek_v3").items() if k not in change or change[k] is not None}
    d.update({k: v for k, v in change.items() if v is not None})
    if message is None:  # a text_config next to the RoPE keys is not where they are read; a multimodal one's is
        d = {"model_type": "gemma3", "text_config": "x"}  # (a text model's config, DeepSeek-V3's, has none to read)
        message = r"text_config must be a dict, got 'x'"
    with pytest.raises(ConfigError, match=message):
        RoPE.from_hf_config(d)
    with pytest.raises(ConfigError, match=message):
        RoPE.from_hf_config(d, strict=False)


def test_absurd_widths_are_config_errors_not_allocation_failures():
    # found by tests/test_config_properties.py: torch failed allocating the tables
    with pytest.raises(
        ConfigError, match=r"hidden_size=2361183241434822606848 / num_attention_heads=2 gives heads wider"
    ):
        read_hf_config({"model_type": "llama", "hidden_size": 2**71, "num_attention_heads": 2})
    with pytest.raises(ConfigError, match=r"head_dim=131072 is wider than any attention head"):
        read_hf_config({"model_type": "llama", "head_dim": 2**17})
    d = {
        "model_type": "mistral4",
        "head_dim": 128,
        "qk_rope_head_dim": 64,
        "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1e300},
    }
    with pytest.raises(ConfigError, match=r"qk_rope_head_dim=64 but head_dim=128 \* partial_rotary_factor=1e\+300"):
        read_hf_config(d)


def test_read_hf_config_argument_types():
    d = load("llama2")
    with pytest.raises(TypeError, match="strict must be True or False, got 'no'"):
        read_hf_config(d, strict="no")
    with pytest.raises(TypeError, match="layer_type must be a string or None, got 0"):
        read_hf_config(d, layer_type=0)
    with pytest.raises(TypeError, match="interleaved must be True or False, got 'false'"):
        read_hf_config(dict(d, model_type="my_model"), interleaved="false")


# ---- item 21 of issue 11: a file that is not UTF-8 ---------------------------------------------------
def test_a_config_that_is_not_utf8_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(
        json.dumps({"model_type": "llama", "note": "caf\u00e9"}).replace("\\u00e9", "\u00e9").encode("latin-1")
    )
    with pytest.raises(
        ConfigError, match=rf"{path} is not UTF-8 text \(byte 0xe9 at offset \d+\).*re-save it as UTF-8"
    ):
        RoPE.from_hf_config(tmp_path)


# ---- item 14 of issue 11: the pairing comes from a checked table, or from the caller -----------------
def test_unknown_model_types_need_the_pairing_stated():
    d = {"model_type": "my_custom_model", "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0}
    with pytest.raises(
        ConfigError,
        match=r"model_type 'my_custom_model' is not in rotary's pairing table.*pass "
        r"interleaved=True .*\(2i, 2i\+1\) or interleaved=False",
    ):
        read_hf_config(d)
    with pytest.raises(ConfigError, match="it has no model_type"):
        read_hf_config({k: v for k, v in d.items() if k != "model_type"})
    for interleaved in (True, False):
        assert read_hf_config(d, interleaved=interleaved).interleaved is interleaved
    assert RoPE.from_hf_config(d, interleaved=True).interleaved


def test_refused_architectures_say_why():
    from rotary.hf.config import UNSUPPORTED

    model_type, reason = next(iter(sorted(UNSUPPORTED.items())))
    with pytest.raises(ConfigError, match=re.escape(f"model_type {model_type!r} {reason}")):
        read_hf_config({"model_type": model_type, "head_dim": 64}, interleaved=False)
    with pytest.raises(ConfigError, match="multimodal RoPE"):
        read_hf_config(
            {
                "model_type": "llama",
                "head_dim": 64,
                "rope_parameters": {"rope_type": "default", "mrope_section": [16, 8, 8]},
            }
        )


@pytest.mark.parametrize("model_type", ["llama4_text", "codegen", "helium", "ernie4_5", "glm4_moe_lite", "mistral4"])
def test_architectures_transformers_rotates_in_adjacent_pairs(model_type):
    # the reproduction of item 14: Llama4TextConfig() read as half pairs before
    cfg = AutoConfig.for_model(model_type)
    if model_type in rotary.hf.config.UNSUPPORTED:
        with pytest.raises(ConfigError, match=model_type):
            RoPE.from_hf_config(cfg)
        return
    assert RoPE.from_hf_config(cfg, strict=False).interleaved


# ---- item 15 of issue 11: a YaRN factor that disagrees with the config's two lengths ----------------
def test_yarn_factor_disagreeing_with_the_config_lengths():
    d = json.loads((PUBLISHED / "qwen2.5-7b-instruct-yarn.json").read_text())
    d["max_position_embeddings"] = 65536  # factor 4 over 32768 says 131072
    with pytest.raises(
        ConfigError,
        match=r"factor=4.0 disagrees with max_position_embeddings / "
        r"original_max_position_embeddings = 65536 / 32768 = 2; set factor to 2",
    ):
        RoPE.from_hf_config(d)
    with pytest.warns(UserWarning, match="disagrees with"):
        rope = RoPE.from_hf_config(d, strict=False)
    hf = hf_class("qwen2.modeling_qwen2.Qwen2RotaryEmbedding")(hf_config(d))  # transformers: warns, uses factor
    assert torch.equal(rope.inv_freq, hf.inv_freq) and rope.attention_scaling == hf.attention_scaling


def test_defaults_of_every_transformers_model_type_read_without_an_error():
    # read_hf_config asks transformers for the defaults of whatever model_type a file names
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from rotary.hf.config import DEFAULTED_KEYS, model_defaults

    allowed = set(DEFAULTED_KEYS) | {
        "rope_theta",
        "partial_rotary_factor",
        "layer_rope_theta",
        "rope_parameters",
        "rope_ignore_keys",
    }
    for model_type in CONFIG_MAPPING_NAMES:
        defaults = model_defaults(model_type, source="transformers")
        assert set(defaults) <= allowed, (model_type, set(defaults) - allowed)


CONFIGS = {
    **{p.stem: json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))},
    **{p.stem: json.loads(p.read_text()) for p in sorted((FIXTURES / "published").glob("*.json"))},
}


ROPE_CONFIG_KEYS = [
    "head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings", "rope_theta", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "rotary_pct", "rotary_emb_base", "rotary_dim", "qk_rope_head_dim",
    "rope_interleave", "original_max_position_embeddings", "layer_types", "model_type", "text_config",
    "rope_local_base_freq", "n_embd", "n_head", "n_positions",
]  # fmt: skip


@st.composite
def perturbed_configs(draw):
    name = draw(st.sampled_from(sorted(set(CONFIGS) - {"gptj"})))  # GPT-J: explicit examples (its keys of its own)
    d = copy.deepcopy(CONFIGS[name])
    target = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    block_name = next((k for k in ("rope_parameters", "rope_scaling") if isinstance(target.get(k), dict)), None)
    inside = block_name is not None and draw(st.booleans())
    where = target[block_name] if inside else target
    if inside and "full_attention" in where:
        where = where["full_attention"]
    key = draw(st.sampled_from(sorted(set(where) | set(ROPE_CONFIG_KEYS if not inside else ["factor", "rope_theta"]))))
    if draw(st.booleans()) and key in where:
        del where[key]
        value = None
    else:
        value = draw(st.one_of(NASTY, NUMBERS))
        where[key] = value
    return d, key, value, (name, inside)


def original_target(name: str) -> dict:
    """The fixture's top level (its text_config for a multimodal config)."""
    d = CONFIGS[name]
    return d["text_config"] if isinstance(d.get("text_config"), dict) else d


def at_top(name: str, key: str, value):
    """A draw of :func:`perturbed_configs`: fixture ``name`` with its top-level ``key`` set to ``value``."""
    d = copy.deepcopy(CONFIGS[name])
    (d["text_config"] if isinstance(d.get("text_config"), dict) else d)[key] = value
    return d, key, value, (name, False)


def dropped(name: str, key: str):
    """A draw of :func:`perturbed_configs`: fixture ``name`` with its top-level ``key`` deleted."""
    d = copy.deepcopy(CONFIGS[name])
    del (d["text_config"] if isinstance(d.get("text_config"), dict) else d)[key]
    return d, key, None, (name, False)


def original_block(name: str) -> dict:
    """The fixture's scaling block as written (empty when it has none, or one per layer type)."""
    return perturbed_block(original_target(name))


def perturbed_block(target: dict) -> dict:
    """The scaling block :func:`perturbed_configs` perturbs in ``target`` (a config's top level or text_config): its
    ``rope_parameters`` or ``rope_scaling``, the full-attention one of a config with one per layer type."""
    block = next((target[k] for k in ("rope_parameters", "rope_scaling") if isinstance(target.get(k), dict)), {})
    return block["full_attention"] if isinstance(block.get("full_attention"), dict) else block


def removed(name: str, key: str):
    """A draw of :func:`perturbed_configs`: fixture ``name`` with ``key`` deleted from its scaling block."""
    d = copy.deepcopy(CONFIGS[name])
    del perturbed_block(d["text_config"] if isinstance(d.get("text_config"), dict) else d)[key]
    return d, key, None, (name, True)


def in_block(name: str, key: str, value):
    """A draw of :func:`perturbed_configs`: fixture ``name`` with ``key`` set to ``value`` in its scaling block."""
    d = copy.deepcopy(CONFIGS[name])
    perturbed_block(d["text_config"] if isinstance(d.get("text_config"), dict) else d)[key] = value
    return d, key, value, (name, True)


LAYER_TYPES = st.sampled_from([None, "sliding_attention", "full_attention"])

#: the top-level keys of the base (docs/scaling.md, "Loading from a checkpoint": rope_theta; GPT-NeoX
#: rotary_emb_base) and of the rotated part (partial_rotary_factor; GPT-NeoX rotary_pct)
BASE_KEYS, PART_KEYS = ("rope_theta", "rotary_emb_base"), ("partial_rotary_factor", "rotary_pct")
HEAD_KEYS = ("head_dim", "hidden_size", "num_attention_heads")


def _bad_number(value) -> bool:
    """Not a number a count or a positive parameter can be: a non-number (bool, string, list, dict), NaN,
    inf, or <= 0 (docs/scaling.md, "What each parameter may be")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return not -math.inf < value < math.inf or value <= 0


def top_level_reading(name: str, key: str, value, fixture):
    """How a top-level ``key`` set to ``value`` (not null) in single-block fixture ``name`` is read, from
    docs/scaling.md ("Loading from a checkpoint" and "What each parameter may be"), given the unperturbed
    fixture's reading ``fixture``: ``(block, base, head_dim)`` for :func:`frequencies_verdict`, ``"refused"``,
    or None where it depends on an architecture's defaults or names not written here (undecided)."""
    top = original_target(name)
    stated = [k for k in BASE_KEYS if k in top]
    block = dict(fixture.scaling)
    if key in BASE_KEYS:
        # the base this fixture states once at the top and nowhere in its block: the value is the base
        if stated != [key] or "rope_theta" in original_block(name) or top[key] != fixture.base:
            return None
        return block, value, fixture.head_dim
    if key in PART_KEYS:
        # the rotated part this fixture states at the top (read as the block's partial_rotary_factor)
        if [k for k in PART_KEYS if k in top] != [key] or block.get("partial_rotary_factor") != top[key]:
            return None
        if value is None:
            return None  # null: the config class's default (GPT-NeoX 0.25), not written here
        return {**block, "partial_rotary_factor": value}, fixture.base, fixture.head_dim
    if key not in HEAD_KEYS or {"qk_rope_head_dim", "rotary_dim", "n_embd", "n_head"} & set(top):
        return None
    # the head width: head_dim where stated, else hidden_size // num_attention_heads
    derived = "head_dim" not in top
    if not derived and key != "head_dim":
        return None  # hidden_size / num_attention_heads beside a head_dim: not the width
    if derived and not {"hidden_size", "num_attention_heads"} <= set(top):
        return None  # a width from the model's defaults
    width = top.get("head_dim") if not derived else top["hidden_size"] // top["num_attention_heads"]
    if width != fixture.head_dim or (derived and key == "head_dim"):
        return None
    if value is None:
        return None  # null: derived from the other keys or the class default
    if _bad_number(value):
        return "refused"
    if isinstance(value, float):
        return "refused"  # a float count, even 128.0 (the config classes type them int)
    after = {**top, key: value}
    width = after["head_dim"] if key == "head_dim" else after["hidden_size"] // after["num_attention_heads"]
    if width > 2**16:
        return "refused"  # wider heads than the tables could hold
    if width < 2 or width % 2 or (derived and after["hidden_size"] % after["num_attention_heads"]):
        return "refused"  # an odd or zero width (channels rotate in pairs), an uneven split (add head_dim)
    return block, fixture.base, width


#: keys whose value replaces what the fixture is (its architecture, its layers, its whole block): not compared with
#: the fixture's own transformers class
WHOLE_KEYS = ("model_type", "text_config", "layer_types", "rope_scaling", "rope_parameters")


def refused_always(key: str, value) -> bool:
    """Whether ``key=value`` is refused even with ``strict=False`` by docs/scaling.md's table ("What each parameter
    may be"), where transformers may still compute: a non-number, NaN, inf or a value <= 0 of a numeric key; a base
    <= 1; a rotated part > 1. (A deleted key, ``None``, is not.)"""
    if value is None or key in ("rope_type", "type", "rope_interleave", "truncate"):
        return False
    if _bad_number(value) or (key in COUNT_KEYS and not isinstance(value, int)):
        return True
    return (key in (*BASE_KEYS, "rope_local_base_freq") and value <= 1) or (key in PART_KEYS and value > 1)


#: counts and lengths: ints (a float, even 128.0, is refused always)
COUNT_KEYS = (
    *HEAD_KEYS, "qk_rope_head_dim", "rotary_dim", "n_embd", "n_head", "n_positions", "max_position_embeddings",
    "original_max_position_embeddings",
)  # fmt: skip


class _GptjRotary:
    """GPT-J's frequencies as transformers' GPTJAttention computes them (``create_sinusoidal_positions``'s first line:
    base 10000 over ``rotary_dim`` channels; a null rotary_dim rotates the whole head, docs/scaling.md); no scaling."""

    def __init__(self, cfg) -> None:
        dim = cfg.rotary_dim or cfg.n_embd // cfg.n_head
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64) / dim))
        self.attention_scaling = 1.0


#: the fixtures with one RoPE block per layer type, and the class transformers builds them with
PER_LAYER = {
    "gemma3_nested": "gemma3.modeling_gemma3.Gemma3RotaryEmbedding",
    "gemma-3-4b-it": PUBLISHED_FILES["gemma-3-4b-it"][0],
}


def transformers_reading(name: str, d: dict, *, falling: bool = False, layer_type: str | None = None):
    """transformers 5.23 as the oracle of a config whose reading depends on its config class's defaults: the
    ``(inv_freq, attention_scaling)`` of the fixture's RotaryEmbedding class built from ``d`` (of ``layer_type``,
    for a class that builds one per layer type: Gemma 3's ``{layer_type}_inv_freq``) when it builds and they are
    what rotary accepts (every frequency finite and > 0, the scaling a finite number > 0), else None."""
    dotted = PER_LAYER.get(name) or ARCHITECTURES.get(name, PUBLISHED_FILES.get(name, (None,)))[0]
    if dotted is None and name != "gptj":
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cfg = text_config(d)
            hf = hf_class(dotted)(cfg) if dotted is not None else _GptjRotary(cfg)
        prefix = "" if layer_type is None else f"{layer_type}_"
        inv_freq, scaling = getattr(hf, f"{prefix}inv_freq"), getattr(hf, f"{prefix}attention_scaling")
        top = d["text_config"] if isinstance(d.get("text_config"), dict) else d
        if top.get("head_dim") is None and cfg.hidden_size % cfg.num_attention_heads:
            return None  # a width from an uneven split (transformers floors it; rotary refuses it): not decided
    except Exception:  # noqa: BLE001 - a config transformers does not build: undecided here
        return None
    sound = inv_freq.numel() > 0 and bool(torch.isfinite(inv_freq).all() and (inv_freq > 0).all())
    if falling:  # frequencies that fall from at most 1 rad/token, at most 2^15 pairs (wider: refused always)
        sound = sound and bool((inv_freq <= 1).all() and (inv_freq[1:] <= inv_freq[:-1]).all())
        sound = sound and inv_freq.numel() <= 2**15
    if not (sound and isinstance(scaling, (int, float)) and 0 < scaling <= torch.finfo(torch.float32).max):
        return None
    return inv_freq, scaling


#: top-level keys of the base and the rotated part whose reading transformers decides (transformers_reads), each
#: with a valid value; GPT-J's rotary_dim, for its own oracle
PROBES = {
    "rope_theta": 12345.0, "rotary_emb_base": 12345.0, "rope_local_base_freq": 12345.0, "partial_rotary_factor": 0.5,
    "rotary_pct": 0.5, "rotary_dim": 48,
}  # fmt: skip


def _class_default(name: str, key: str):
    """The default of ``key`` in the field list of fixture ``name``'s transformers config class (None if none)."""
    import dataclasses

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[original_target(name).get("model_type") or CONFIGS[name]["model_type"]]
    fields = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    default = fields.get(key)
    return None if default is dataclasses.MISSING else default


def width_keys(name: str) -> tuple[str, ...]:
    """The top-level keys the head width of fixture ``name`` is read from (docs/scaling.md, "Loading from a
    checkpoint": MLA's qk_rope_head_dim, else head_dim, else hidden_size // num_attention_heads), each stated or
    its config class's default."""
    top = original_target(name)
    for key in ("qk_rope_head_dim", "head_dim"):
        if top.get(key) is not None or _class_default(name, key) is not None:
            return (key,)
    return ("hidden_size", "num_attention_heads")


@functools.cache
def transformers_reads(name: str, key: str, layer_type: str | None):
    """Whether transformers 5.23 reads top-level ``key`` of fixture ``name``: its frequencies (of ``layer_type``) move
    when the key is set to a valid value (:data:`PROBES`); None where it builds neither config."""
    d = copy.deepcopy(CONFIGS[name])
    target = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    before = transformers_reading(name, d, layer_type=layer_type)
    target[key] = PROBES[key] if target.get(key) != PROBES[key] else PROBES[key] / 2
    after = transformers_reading(name, d, layer_type=layer_type)
    if before is None or after is None:
        return None
    return not (torch.equal(before[0], after[0]) and before[1] == after[1])


@functools.cache
def _read_fixture(name, strict, layer_type, interleaved):
    """The reading of an unperturbed fixture (once per run): ``(settings, rope)`` or the error."""
    try:
        return _read(CONFIGS[name], strict, layer_type, interleaved)
    except Exception as exc:  # noqa: BLE001 - compared with the perturbed config's error
        return exc


def _lenient(d, layer_type, interleaved):
    """The ``strict=False`` reading of ``d``: ``(rope or the error, whether it warned)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            read_hf_config(d, layer_type=layer_type, strict=False, interleaved=interleaved)
            rope = RoPE.from_hf_config(d, layer_type=layer_type, strict=False, interleaved=interleaved, max_position=16)
        except Exception as exc:  # noqa: BLE001 - compared with the strict reading
            return exc, bool(caught)
    return rope, any(issubclass(w.category, UserWarning) for w in caught)


def _read(d, strict, layer_type, interleaved):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        settings_ = read_hf_config(d, layer_type=layer_type, strict=strict, interleaved=interleaved)
        rope = RoPE.from_hf_config(d, layer_type=layer_type, strict=strict, interleaved=interleaved, max_position=16)
    return settings_, rope


@PROPERTIES
@given(
    perturbed=perturbed_configs(),
    strict=st.booleans(),
    layer_type=LAYER_TYPES,
    interleaved=st.sampled_from([None, False]),
)
@example(perturbed=in_block("llama3_1", "factor", 16.0), strict=True, layer_type=None, interleaved=None)  # valid
@example(perturbed=in_block("qwen2", "beta_fast", 0.5), strict=False, layer_type=None, interleaved=None)  # warned
@example(perturbed=in_block("deepseek_v3", "mscale_all_dim", 1e300), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("qwen2", "max_position_embeddings", 65536), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("llama3_1", "max_position_embeddings", 4096), strict=True, layer_type=None, interleaved=None)
@example(perturbed=removed("deepseek_v3", "mscale"), strict=True, layer_type=None, interleaved=None)  # valid
@example(perturbed=removed("llama3_1", "low_freq_factor"), strict=False, layer_type=None, interleaved=None)
# top-level keys decided up front (top_level_reading): the base, the rotated part, the head width
@example(perturbed=at_top("llama2", "rope_theta", 20000.0), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("qwen2", "rope_theta", 0.5), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("llama3_1", "rope_theta", "1e6"), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("gpt_neox", "rotary_emb_base", 1e6), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("pythia-160m", "rotary_pct", 0.5), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("gpt_neox", "rotary_pct", 1.5), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("gpt_oss", "head_dim", 128), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("mistral", "head_dim", 2**17), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("llama2", "num_attention_heads", 16), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("llama2", "hidden_size", True), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("gpt_oss", "head_dim", None), strict=False, layer_type=None, interleaved=None)
@example(perturbed=dropped("gpt_neox", "rotary_pct"), strict=False, layer_type=None, interleaved=None)
@example(perturbed=dropped("llama3_1", "rope_theta"), strict=False, layer_type=None, interleaved=None)
@example(perturbed=dropped("qwen2", "num_attention_heads"), strict=False, layer_type=None, interleaved=None)
# layer types: one block per layer type (refused without one; another type's block unread), one for every layer
@example(perturbed=in_block("gemma3_nested", "factor", 4.0), strict=True, layer_type=None, interleaved=None)
@example(perturbed=in_block("gemma3_nested", "factor", 4.0), strict=True, layer_type="full_attention", interleaved=None)
@example(
    perturbed=in_block("gemma3_nested", "factor", 0.0), strict=True, layer_type="sliding_attention", interleaved=None
)
@example(
    perturbed=at_top("gemma-3-4b-it", "rope_theta", 5e5), strict=False, layer_type="full_attention", interleaved=None
)
@example(
    perturbed=at_top("gemma-3-4b-it", "head_dim", 128), strict=True, layer_type="sliding_attention", interleaved=None
)
@example(perturbed=at_top("llama3_1", "rope_theta", 1e6), strict=True, layer_type="sliding_attention", interleaved=None)
@example(perturbed=at_top("gpt-oss-20b", "rope_theta", 1e6), strict=True, layer_type="chunked", interleaved=None)
# keys a model's transformers class never reads, class defaults, a type stated twice (more: the tests below)
@example(perturbed=at_top("llama2", "qk_rope_head_dim", float("nan")), strict=True, layer_type=None, interleaved=None)
@example(
    perturbed=dropped("phi3_longrope", "original_max_position_embeddings"),
    strict=False,
    layer_type=None,
    interleaved=None,
)
@example(perturbed=at_top("gpt_oss", "head_dim", None), strict=False, layer_type=None, interleaved=None)
@example(perturbed=in_block("llama3_1", "type", "linear"), strict=True, layer_type=None, interleaved=None)
@example(perturbed=in_block("llama3_1", "rope_type", "yarnn"), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("llama2", "model_type", None), strict=False, layer_type=None, interleaved=False)
@example(perturbed=at_top("gpt_neox", "text_config", {}), strict=False, layer_type=None, interleaved=None)
@example(perturbed=in_block("mistral", "rope_theta", None), strict=False, layer_type=None, interleaved=None)
# GPT-J (not drawn: its own keys): rotary_dim, its rotated width (null: the whole head), against its attention's formula
@example(perturbed=at_top("gptj", "rotary_dim", 32), strict=True, layer_type=None, interleaved=None)
@example(perturbed=at_top("gptj", "rotary_dim", None), strict=False, layer_type=None, interleaved=None)
@example(perturbed=at_top("gptj", "rotary_dim", 32.0), strict=False, layer_type=None, interleaved=None)
def test_read_hf_config_and_from_hf_config_on_perturbed_configs(perturbed, strict, layer_type, interleaved):
    d, key, value, (name, inside) = perturbed
    original = copy.deepcopy(d)
    # the layer type, decided up front (docs/scaling.md, "Loading from a checkpoint"; read_hf_config's docstring):
    # a config with one block per layer type (PER_LAYER: Gemma 3) is read per layer_type, and without one refused;
    # a config with one block for every layer reads alike whatever layer_type says, except that one listing its
    # layer_types refuses a type it does not list. read_as: the layer type whose reading the draw gets
    listed = original_target(name).get("layer_types")
    whole = not inside and key in WHOLE_KEYS  # a key that replaces what the fixture is: decided below
    read_as = layer_type if name in PER_LAYER else None
    lt_refused = name in PER_LAYER and layer_type is None
    lt_refused |= layer_type is not None and bool(listed) and layer_type not in listed and key != "layer_types"
    # decided up front: a top-level key rotary does not read (outside ROPE_CONFIG_KEYS) changes nothing: the
    # config reads as the unperturbed one does (the same frequencies, or refused alike); so does a value in the
    # block of another layer type than the one read ("layer_type ... reads that layer's own keys")
    unread = not inside and key not in ROPE_CONFIG_KEYS
    unread |= inside and name in PER_LAYER and layer_type is not None and layer_type != "full_attention"
    # a value set inside the scaling block (of the layer type read), for a key the reader passes on as written (not
    # rope_theta, the base; not rope_type / type, whose names the reader maps per architecture; not a length a
    # top-level key overrides, Phi-3's original_max_position_embeddings): the block is the fixture's as read (its
    # values filled from the config and checked against transformers elsewhere in this file) with that value, and
    # the scaling block's documented contract decides (strategies.frequencies_verdict, with transformers'
    # frequencies as the oracle: helpers.computes)
    want = in_block = None
    target = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    block = perturbed_block(target)
    one = not lt_refused and not unread  # decided by the reading of read_as
    plain = inside and one and key not in ("rope_theta", "rope_type", "type") and key not in target
    # a key deleted from the block: what the reader does not fill in (it fills original_max_position_embeddings
    # from the context length) is then missing from the block as read
    deleted = plain and key not in block and key in original_block(name) and key != "original_max_position_embeddings"
    plain = plain and (key in block or deleted)
    # the top-level max_position_embeddings (set) is a positive int or refused (the config classes' type, even with
    # strict=False); a positive int is the length of the block of a type that takes one (yarn, longrope, dynamic), and
    # otherwise changes nothing
    length = not inside and one and key == "max_position_embeddings" and key in target
    # the other top-level keys rotary reads for the head width, the base and the rotated part (set): top_level_reading
    # says what the block, base and head width then are, from the documented reading; the same contract and oracle as
    # a block value then decide
    top = not inside and one and key in (*BASE_KEYS, *PART_KEYS, *HEAD_KEYS) and key in target
    fixture = _read_fixture(name, strict, read_as, interleaved) if plain or length or top else None
    base = head_dim = None
    if isinstance(fixture, tuple):
        fixture = fixture[0]
        base, head_dim = fixture.base, fixture.head_dim
        if top:
            reading = top_level_reading(name, key, value, fixture)
            if reading is not None:
                in_block, base, head_dim = ({}, None, None) if reading == "refused" else reading
        elif length and not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            in_block = {}  # refused: want stays None
        elif length:
            in_block = {**fixture.scaling, **({key: value} if key in fixture.scaling else {})}
        elif deleted:
            in_block = {k: v for k, v in fixture.scaling.items() if k != key}
        elif plain:
            in_block = {**fixture.scaling, key: value}
    # the draws left, decided from the documented reading where it says what they are (else by transformers, below)
    refused = lt_refused  # decided: refused, with an error naming the key, its value or the layer type
    # decided: a key the model's transformers class never reads: read leniently as the unperturbed config (a value
    # that differs from what the model uses may be named, strictly: docs/scaling.md's differences from transformers)
    ignored = False
    same_as = layer_type  # the layer type of the unperturbed reading a draw that changes nothing must equal
    unperturbed = _read_fixture(name, strict, read_as, interleaved)
    if not lt_refused:  # every fixture reads (with a layer type where it has one per type), as transformers does
        assert isinstance(unperturbed, tuple), f"the unperturbed {name} ({read_as=}) was refused: {unperturbed}"
    if in_block is None and one and not refused and isinstance(unperturbed, tuple):
        fx = unperturbed[0]
        raw = block  # the perturbed block as written
        if inside and key == "rope_theta" and value is None and key not in original_block(name):
            unread = True  # an explicit null reads as "not given": the base the unperturbed config states
        elif inside and key == "rope_theta" and value is not None:
            # the block's rope_theta is the base (docs/scaling.md, "Loading from a checkpoint": the 5.x column first)
            in_block, base, head_dim = dict(fx.scaling), value, fx.head_dim
        elif inside and key in ("rope_type", "type"):
            # the type: rope_type, else type (4.x's name), else default; Phi-3's su and yarn are longrope; a name that
            # is not a registered type is refused always; both given and different: a mistake (warned)
            named = (
                raw.get("rope_type") if "rope_type" in raw else "default" if raw.get("type") is None else raw["type"]
            )
            if fx.model_type == "phi3" and named in ("su", "yarn"):
                named = "longrope"
            if not (isinstance(named, str) and named in ROPE_TYPES):
                refused = True
            elif named == fx.scaling["rope_type"]:
                both = "rope_type" in raw and raw.get("type") is not None
                in_block = {**fx.scaling, **({"type": raw["type"]} if both else {})}
                base, head_dim = fx.base, fx.head_dim
        elif not inside and key == "original_max_position_embeddings" and value is not None:
            # a top-level trained length wins over the block's (yarn, longrope, llama3), and is read by no other type
            if fx.scaling["rope_type"] in ("yarn", "longrope", "llama3"):
                in_block, base, head_dim = {**fx.scaling, key: value}, fx.base, fx.head_dim
            else:
                unread = True
        elif whole:
            kind = dict if key in ("rope_scaling", "rope_parameters") else list
            if key == "text_config":
                # not read: every fixture's top level (or text config) is a text model's, whose transformers config
                # class has no text_config (docs/scaling.md, "Loading from a checkpoint")
                unread = True
            elif key == "model_type" and value is not None and not isinstance(value, str):
                refused = True  # model_type must be a string
            elif key == "model_type" and value is None and target is not d:
                unread = True  # the text config of a multimodal config: its wrapper's text model type
            elif key == "model_type":
                assume(not (value and _known_model_type(value)))  # another architecture's defaults: not drawn
                if interleaved is None:
                    refused = True  # no pairing known: pass interleaved=
                else:
                    reading = no_model_type_reading(target, layer_type=layer_type)
                    refused = reading is None
                    if reading is not None:
                        head_dim, base, in_block, _ = reading
            elif key != "model_type" and value is not None and not isinstance(value, kind):
                refused = True  # a block is a dict, layer_types a list (a type error stays an error)
            elif key == "layer_types" and not value:
                unread, same_as = True, read_as  # no layer types listed: nothing to check the layer type against
            elif key == "layer_types" and not all(isinstance(t, str) for t in value):
                refused = True
        elif not inside and value is None and key in HEAD_KEYS and key in width_keys(name):
            # a head-width key deleted or null: its config class's default, for which transformers is the oracle
            # (below), where that gives an even width by an exact split (else refused: docs/scaling.md)
            top_now = {k: v for k, v in original_target(name).items() if k != key}
            width = top_now.get("head_dim") or _class_default(name, "head_dim")
            if width is None:
                hidden = top_now.get("hidden_size") or _class_default(name, "hidden_size")
                heads = top_now.get("num_attention_heads") or _class_default(name, "num_attention_heads")
                width = hidden // heads if hidden and heads and not hidden % heads else 1
            refused = width % 2 == 1
        elif not inside and value is not None and key in (*HEAD_KEYS, "n_embd", "n_head", "qk_rope_head_dim"):
            # the head width's keys: those it is read from (width_keys; head_dim set beside hidden_size and
            # num_attention_heads is now the width; qk_rope_head_dim only an MLA model's) give the width, which must be
            # an even int of at most 65536 channels (a value refused always, an uneven split: refused); the block is
            # then the fixture's at that width. The other keys change nothing
            used, top_now = width_keys(name), {**original_target(name), key: value}
            if key in used or (key == "head_dim" and "qk_rope_head_dim" not in used):
                width = None
                if key in ("head_dim", "qk_rope_head_dim"):
                    width = value
                elif not refused_always(key, value):
                    hidden, heads = top_now.get("hidden_size"), top_now.get("num_attention_heads")
                    width = hidden // heads if not hidden % heads else None
                refused = refused_always(key, value) or width is None or width < 2 or width % 2 or width > 2**16
                if not refused:
                    in_block, base, head_dim = dict(fx.scaling), fx.base, width
            else:
                unread = True
        elif not inside and key == "rotary_dim" and value is None and fx.model_type in ("gptj", "codegen"):
            in_block, base, head_dim = dict(fx.scaling), fx.base, fx.head_dim  # GPT-J's null: the whole head
        elif not inside and key == "rope_interleave" and value is not None:
            # MLA models' pairing flag (true or false, refused otherwise), read only where no interleaved= is passed;
            # no other model reads it
            if "qk_rope_head_dim" not in width_keys(name) or interleaved is not None:
                unread = True
            else:
                refused = not isinstance(value, bool)
        elif not inside and value is not None and key in PROBES:
            # a key the model's transformers class does not read (its frequencies do not move when it is set to a
            # valid value) changes nothing; one it reads, set to a value refused always, is refused
            reads = transformers_reads(name, key, read_as)
            if reads is None:  # no probe builds (a fraction that breaks a longrope block): docs/scaling.md's table
                neox = fx.model_type in ("gpt_neox", "gpt_neox_japanese")
                reads = key in (("rotary_emb_base", "rotary_pct") if neox else ("rope_theta", "partial_rotary_factor"))
            if reads is False:
                ignored = True
            elif reads and refused_always(key, value):
                refused = True
            elif reads and key in PART_KEYS:  # the block's rotated part, checked with the block
                in_block, base, head_dim = {**fx.scaling, "partial_rotary_factor": value}, fx.base, fx.head_dim
            elif reads and key != "rotary_dim":  # the base
                in_block, base, head_dim = dict(fx.scaling), value, fx.head_dim
    if in_block:
        verdict, rotary_dim, base = frequencies_verdict(in_block, base, head_dim)
        if accepted(verdict, strict):
            want = computes(in_block, base, rotary_dim, None, head_dim)
    # every other draw (a key of the head width, base or rotated part deleted or null: the config class's default; a
    # value the model reads; a block or a model_type replaced): transformers is the oracle of its lenient reading
    # (docs/scaling.md: strict=False gives transformers' results where they are finite) where its rotary class builds
    # from the config (the layer type read_as, for Gemma 3's per-layer-type class) with finite frequencies (that fall
    # from at most 1 rad/token, but for a default filled in): rotary gives the same, bit for bit
    hf_want = None
    decided = unread or refused or ignored or in_block is not None
    defaulted = not inside and value is None and key in (*BASE_KEYS, *PART_KEYS, *HEAD_KEYS)
    if not decided and isinstance(unperturbed, tuple):
        falling = not (defaulted and key in original_target(name))
        stated = d  # a null is "not given" (docs/scaling.md): transformers reads the key deleted
        where = perturbed_block(target) if inside else target
        if value is None and key in where and key != "rotary_dim":  # (GPT-J's null rotary_dim: the whole head)
            stated = copy.deepcopy(d)
            text = stated["text_config"] if target is not d else stated
            del (perturbed_block(text) if inside else text)[key]
        hf_want = transformers_reading(name, stated, falling=falling, layer_type=read_as)
    # every draw is decided up front: for a strict one, the lenient twin it is decided by (below)
    assert decided or hf_want is not None, f"undecided: {key}={value!r} in {name} (inside={inside}, {layer_type=})"
    # a strict draw decided by transformers: its lenient reading is transformers', and it is decided by that (below)
    hf_lenient, hf_want = (hf_want, None) if strict else (None, hf_want)
    if ignored and not strict:
        unread = True
    if unread:
        want = _read_fixture(name, strict, same_as, interleaved)
        want = want if isinstance(want, Exception) else want[1]
    # every draw read strictly is decided by its lenient reading (docs/scaling.md, "What each parameter may be":
    # a value mistake is an error with strict=True and a warning with strict=False; what is refused leniently is
    # refused strictly): accepted strictly exactly when read leniently without a warning, and then the same RoPE
    lenient, warned = _lenient(d, layer_type, interleaved) if strict else (None, False)
    if hf_lenient is not None:
        assert not isinstance(lenient, Exception), (
            f"{key}={value!r}, read as transformers reads it, was refused leniently"
        )
        assert torch.equal(lenient.inv_freq, hf_lenient[0]) and lenient.attention_scaling == hf_lenient[1], (key, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            settings_, rope = _read(d, strict, layer_type, interleaved)
        except Exception as exc:
            if unread:
                assert isinstance(want, Exception), (
                    f"{key}={value!r}, a key this reading does not read, was refused: {exc}"
                )
                assert type(exc) is type(want), (exc, want)
            assert hf_want is None, f"{key}={value!r}, read as transformers reads it, was refused: {exc}"
            if strict:
                assert isinstance(lenient, Exception) or warned, (
                    f"{key}={value!r} was refused strictly but read leniently without a warning: {exc}"
                )
            if in_block is not None:
                assert want is None, f"a valid block value was refused: {key}={value!r} in {in_block} ({exc})"
                if top:  # a top-level key decided up front: a ConfigError (naming it: below)
                    assert isinstance(exc, ConfigError), f"{key}={value!r}: {exc!r}"
            # a layer type the config lacks, or a config the perturbation made ambiguous, names itself;
            # anything else must name the perturbed key or value
            message = str(exc)
            if "layer_type" in message or "layer type" in message:
                assert_named_error(exc)
            else:
                assert_named_error(exc, (key, value))
            return
    assert json.dumps(d, sort_keys=True, default=repr) == json.dumps(original, sort_keys=True, default=repr)
    assert not refused, f"{key}={value!r} (layer_type={layer_type!r}), refused by docs/scaling.md, was read"
    if strict:
        assert not isinstance(lenient, Exception), f"{key}={value!r}, refused leniently, was read strictly: {lenient}"
        if ignored:  # the lenient reading is the unperturbed one
            same = _read_fixture(name, False, same_as, interleaved)[1]
            assert torch.equal(lenient.inv_freq, same.inv_freq) and lenient.attention_scaling == same.attention_scaling
        assert not warned, f"{key}={value!r}, a mistake warned about leniently, was read strictly"
        assert torch.equal(rope.inv_freq, lenient.inv_freq) and rope.interleaved == lenient.interleaved, (key, value)
        assert rope.attention_scaling == lenient.attention_scaling, (key, value)
    if in_block is not None:
        assert want is not None, f"an invalid block value was accepted: {key}={value!r} in {in_block}"
        assert torch.equal(rope.inv_freq, want[0]) and rope.attention_scaling == float(want[1]), (key, value)
    if hf_want is not None:
        assert torch.equal(rope.inv_freq, hf_want[0]) and rope.attention_scaling == hf_want[1], (key, value)
    if unread:
        assert not isinstance(want, Exception), f"{key}={value!r} made a refused config acceptable: {want}"
        assert torch.equal(rope.inv_freq, want.inv_freq) and rope.interleaved == want.interleaved, (key, value)
        assert rope.attention_scaling == want.attention_scaling
    assert isinstance(settings_.interleaved, bool) and settings_.interleaved == rope.interleaved
    assert_sound(rope.freqs)
    cos, sin = rope.cos_sin(torch.arange(0, 40))
    assert bool(torch.isfinite(cos).all() and torch.isfinite(sin).all())


def test_a_partial_rotary_factor_the_model_never_reads_is_named_strictly_and_dropped_leniently():
    """Found by the property test above: transformers' Llama (and 137 other model types whose rotary class computes
    its default frequencies itself) rotates the whole head whatever ``partial_rotary_factor`` says; rotary rotated the
    stated part. Strict, it is a ConfigError naming the key; lenient, a warning and transformers' rotation."""
    d, *_ = at_top("llama2", "partial_rotary_factor", 0.5)
    inv_freq, _ = transformers_reading("llama2", d)
    with pytest.warns(UserWarning, match="partial_rotary_factor=0.5 with rope_type 'default'.*rotates the whole head"):
        rope = RoPE.from_hf_config(d, strict=False)
    assert torch.equal(rope.inv_freq, inv_freq) and rope.rotary_dim == 128
    with pytest.raises(ConfigError, match="transformers' 'llama' model never reads it"):
        RoPE.from_hf_config(d, strict=True)
    # a model that reads it (Phi-2) rotates the part, as its transformers model does
    phi = {**d, "model_type": "phi"}
    assert RoPE.from_hf_config(phi).rotary_dim == 64


def _reads_as_transformers(name: str, d: dict, *, warns: str | None = None) -> RoPE:
    """``RoPE.from_hf_config(d)`` (with the warning ``warns`` when given, strict=False) equals transformers' reading."""
    if warns is None:
        rope = RoPE.from_hf_config(d)
    else:
        with pytest.warns(UserWarning, match=warns):
            rope = RoPE.from_hf_config(d, strict=False)
    want = transformers_reading(name, d)
    assert want is not None, f"transformers does not build {name} from {d}"
    inv_freq, scaling = want
    assert torch.equal(rope.inv_freq, inv_freq) and rope.attention_scaling == scaling
    return rope


def test_gpt_neox_names_are_read_for_gpt_neox_only():
    """Found by the perturbed-config property: rotary read a top-level rope_theta / partial_rotary_factor of a GPT-NeoX
    config before its rotary_emb_base / rotary_pct, which transformers' GPT-NeoX config reads instead (and never the
    first two), and read rotary_emb_base / rotary_pct in configs of models that never read them."""
    for key, value, own in (("rope_theta", 5e5, "rotary_emb_base"), ("partial_rotary_factor", 0.5, "rotary_pct")):
        d, *_ = at_top("gpt_neox", key, value)
        with pytest.raises(
            ConfigError,
            match=rf"{key}={value}, but transformers' 'gpt_neox' config never reads {key} "
            rf"and uses {own}=",
        ):
            RoPE.from_hf_config(d)
        _reads_as_transformers("gpt_neox", d, warns=f"never reads {key}")
        same = at_top("gpt_neox", key, CONFIGS["gpt_neox"][own])[0]  # the value it uses: nothing to say
        assert torch.equal(RoPE.from_hf_config(same).inv_freq, RoPE.from_hf_config(load("gpt_neox")).inv_freq)
    # a null rotary_pct is "not given": the class's default 0.25 (transformers' config class keeps the null and fails)
    assert RoPE.from_hf_config(at_top("gpt_neox", "rotary_pct", None)[0]).rotary_dim == 64
    # Llama's config never reads GPT-NeoX's names: the base is Llama's default, the whole head rotates
    d = {k: v for k, v in load("llama2").items() if k != "rope_theta"}
    _reads_as_transformers("llama2", {**d, "rotary_emb_base": 5e5})
    assert _reads_as_transformers("llama3_1", {**load("llama3_1"), "rotary_pct": 0.5}).rotary_dim == 128


def test_keys_and_defaults_read_as_the_model_reads_them():
    """Found by the perturbed-config property (each rotary's reading differed from transformers' or refused it):
    qk_rope_head_dim is MLA's key only; a config without a block gets its class's default block whatever base it
    states (gpt-oss: YaRN); Phi-3's class default original_max_position_embeddings; an explicit null head_dim is "not
    given" (gpt-oss: its class's 64); a text model's config is not read from a text_config key; a
    partial_rotary_factor a model never reads is dropped leniently whatever it says."""
    assert _reads_as_transformers("llama2", {**load("llama2"), "qk_rope_head_dim": 32}).head_dim == 128
    assert RoPE.from_hf_config(load("deepseek_v3")).head_dim == 64  # an MLA model's rope head width
    rope = _reads_as_transformers("gpt_oss", {k: v for k, v in load("gpt_oss").items() if k != "rope_scaling"})
    assert rope.freqs.rope_type == "yarn"
    d = {k: v for k, v in load("phi3_longrope").items() if k != "original_max_position_embeddings"}
    assert _reads_as_transformers("phi3_longrope", d).freqs.scaling["original_max_position_embeddings"] == 4096
    assert RoPE.from_hf_config({**load("gpt_oss"), "head_dim": None}).head_dim == 64
    # a text model's config has no text part: a stray text_config is not read (it was, with the model's defaults)
    assert _reads_as_transformers("gpt_neox", {**load("gpt_neox"), "text_config": {}}).head_dim == 256
    rope = _reads_as_transformers("llama2", {**load("llama2"), "partial_rotary_factor": "x"}, warns="never reads it")
    assert rope.rotary_dim == 128
    with pytest.raises(ConfigError, match="partial_rotary_factor='x' with rope_type 'default'"):
        RoPE.from_hf_config({**load("llama2"), "partial_rotary_factor": "x"})


def test_odd_head_widths_and_a_type_stated_twice_are_named():
    """Found by the perturbed-config property: an odd head width was an InputError of RoPE that named no key of the
    config, and a block setting both rope_type and type differently was read silently by from_hf_config (frequencies
    names it)."""
    with pytest.raises(ConfigError, match=r"config head_dim=63 is odd"):
        read_hf_config({**load("mistral"), "head_dim": 63})
    with pytest.raises(ConfigError, match=r"hidden_size=4096 / num_attention_heads=4096 gives an odd head width 1"):
        read_hf_config({**load("llama2"), "num_attention_heads": 4096})
    d = in_block("llama3_1", "type", "linear")[0]
    with pytest.raises(ConfigError, match=r"sets both rope_type='llama3' and type='linear'; keep one"):
        RoPE.from_hf_config(d)
    _reads_as_transformers("llama3_1", d, warns="keep one")


def test_a_float_trained_length_is_read_leniently_as_transformers_reads_it():
    """Found by the perturbed-config property: a float original_max_position_embeddings (a warning with strict=False,
    docs/scaling.md) was refused by RoPE for longrope, whose schedule wanted an int; it now switches to the long factors
    past it, as transformers compares lengths with it."""
    block = {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32, "factor": 4.0}
    exact = RoPE(64, scaling={**block, "original_max_position_embeddings": 4096})
    with pytest.warns(UserWarning, match="original_max_position_embeddings"):
        lenient = RoPE(64, scaling={**block, "original_max_position_embeddings": 4096.0}, strict=False)
    for length in (16, 4096, 4097, 5000):  # the short factors up to the trained length, the long ones past it
        (want, which), (got, label) = exact.schedule.freqs_for(length), lenient.schedule.freqs_for(length)
        assert torch.equal(got.inv_freq, want.inv_freq) and (got.attention_scaling, label) == (
            want.attention_scaling,
            which,
        )
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        RoPE(64, scaling={**block, "original_max_position_embeddings": 4096.0})


def test_the_models_that_read_partial_rotary_factor_are_those_of_transformers():
    """PARTIAL_READERS against transformers' modeling code: a model type of PAIRING reads the factor unless its rotary
    class computes its own default frequencies and its module never names ``partial_rotary_factor``."""
    import importlib
    import inspect

    from transformers import CONFIG_MAPPING

    from rotary.hf.architectures import PAIRING, PARTIAL_READERS

    readers = set()
    for model_type in PAIRING:
        package = CONFIG_MAPPING[model_type].__module__.rsplit(".", 1)[0]
        module = importlib.import_module(f"{package}.modeling_{package.rsplit('.', 1)[1]}")
        own = [
            cls
            for name, cls in vars(module).items()
            if name.endswith("RotaryEmbedding")
            and inspect.isclass(cls)
            and cls.__module__ == module.__name__
            and "compute_default_rope_parameters" in vars(cls)
        ]
        if not own or "partial_rotary_factor" in inspect.getsource(module):
            readers.add(model_type)
    assert readers == PARTIAL_READERS


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _known_model_type(value: str) -> bool:
    """Whether ``value`` names a model type transformers or rotary's tables know (its defaults, pairing or refusal)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from rotary.hf.architectures import SEQUENCE_ROPE, VISION_ROPE
    from rotary.hf.config import MROPE_MODELS, PAIRING, TEXT_MODEL_TYPES, UNSUPPORTED
    from rotary.hf.encoder_tables import ENCODER_PART

    tables = (CONFIG_MAPPING_NAMES, PAIRING, UNSUPPORTED, TEXT_MODEL_TYPES, MROPE_MODELS, ENCODER_PART, VISION_ROPE)
    return any(value in table for table in (*tables, SEQUENCE_ROPE)) or value.startswith("gemma3")


def _as_read(block: dict) -> dict:
    """A scaling block with its type under ``rope_type`` (``type`` is 4.x's name; ``rope_type`` wins), default
    ``default``."""
    out = dict(block)
    legacy = out.pop("type", None)
    out.setdefault("rope_type", "default" if legacy is None else legacy)
    return out


def no_model_type_reading(d: dict, *, layer_type: str | None = None):
    """How a dict of the keys docs/scaling.md lists ("Loading from a checkpoint"), with no model_type (or one neither
    transformers nor rotary knows) and ``interleaved=False``, is read, restated from docs/scaling.md ("Values a
    config.json leaves out": a dict without a model_type) and "What each parameter may be":
    ``(head_dim, base, block, max_position_embeddings)``, the block as read (before its values are checked:
    :func:`frequencies_verdict` does that), or None where the reader itself refuses it (a ``layer_type`` picks the
    block of one layer type). No model defaults: what the dict does not state is not filled in."""
    model_type = d.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        return None  # model_type must be a string
    if d.get("text_config") is not None and not any(
        k in d for k in ("rope_parameters", "rope_scaling", "rope_theta", "head_dim")
    ):
        inner = d["text_config"]  # the text part of a multimodal config (a dict), read alone
        if not isinstance(inner, dict):
            return None
        return no_model_type_reading({"model_type": model_type, **inner}, layer_type=layer_type)
    # the head width: qk_rope_head_dim, else head_dim, else hidden_size // num_attention_heads (n_embd // n_head),
    # each a positive int, the division exact, at most 65536 channels
    width = next((d[k] for k in ("qk_rope_head_dim", "head_dim") if d.get(k) is not None), None)
    if width is None:
        hidden = d.get("hidden_size", d.get("n_embd"))
        heads = d.get("num_attention_heads", d.get("n_head"))
        if not (_positive_int(hidden) and _positive_int(heads)) or hidden % heads:
            return None
        width = hidden // heads
    if not _positive_int(width) or width > 2**16 or width % 2:
        return None  # a head width is an even int (channels rotate in pairs)
    length = d.get("max_position_embeddings", d.get("n_positions"))
    if length is not None and not _positive_int(length):
        return None  # a length in tokens
    params, legacy = d.get("rope_parameters"), d.get("rope_scaling")
    if any(b is not None and not isinstance(b, dict) for b in (params, legacy)):
        return None  # a block is a dict
    if params and legacy and _as_read(params) != _as_read(legacy):
        return None  # both blocks, read differently (strict)
    layer_types = d.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
        return None
    raw = legacy or params or {}
    # one block per layer type (no type of its own, every value a dict or null, keyed by the listed layer types):
    # layer_type picks one, and must; a config with one block refuses a layer type its layer_types do not list
    labels = set(layer_types or ())
    nested = raw and "rope_type" not in raw and "type" not in raw
    nested = (
        nested and all(isinstance(v, dict) or v is None for v in raw.values()) and (labels & set(raw) or not labels)
    )
    if nested:
        if layer_type is None or not isinstance(raw.get(layer_type), dict):
            return None
        raw = raw[layer_type]
    elif layer_type is not None and layer_types and layer_type not in layer_types:
        return None
    block = _as_read(raw)
    # the base: the block's rope_theta, else rope_theta, else rotary_emb_base, else 10000 (a null is not a base)
    base = block.pop("rope_theta", None)
    base = d.get("rope_theta", d.get("rotary_emb_base", 10000.0)) if base is None else base
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not -math.inf < base < math.inf or base <= 0:
        return None
    # the rotated part: partial_rotary_factor (a null: not given), else rotary_pct
    if "partial_rotary_factor" in block:
        pass
    elif d.get("partial_rotary_factor") is not None:
        block["partial_rotary_factor"] = d["partial_rotary_factor"]
    elif "rotary_pct" in d:
        block["partial_rotary_factor"] = d["rotary_pct"]
    part = block.get("partial_rotary_factor")
    if d.get("qk_rope_head_dim") is not None and part not in (None, 1, 1.0):
        # qk_rope_head_dim and head_dim * partial_rotary_factor state the rotated width twice: they must agree
        full = d.get("head_dim")
        if not (isinstance(part, (int, float)) and not isinstance(part, bool) and 0 < part <= 1):
            return None
        if not (_positive_int(full) and int(full * part) == width):
            return None
        del block["partial_rotary_factor"]
    # the trained length of yarn, longrope and llama3: a top-level original_max_position_embeddings wins, a block
    # without one is refused (strict; transformers would use the context length); dynamic, yarn and longrope get the
    # context length
    rope_type = block.get("rope_type", block.get("type", "default"))
    if rope_type in ("yarn", "longrope", "llama3"):
        if d.get("original_max_position_embeddings") is not None:
            block["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        elif block.get("original_max_position_embeddings") is None and length is not None:
            return None
    if rope_type in ("dynamic", "yarn", "longrope") and length is not None:
        block.setdefault("max_position_embeddings", length)
    return width, float(base), block, length


#: values each config key plausibly holds (a few wrong ones among them), for dicts that often read
PLAUSIBLE = {
    "head_dim": [64, 128, 96, 80], "hidden_size": [4096, 2048, 4100], "num_attention_heads": [32, 16], "n_embd": [4096],
    "n_head": [16, 0], "qk_rope_head_dim": [64, 32], "rope_theta": [10000.0, 500000.0, 1e6, 0.5, None],
    "rotary_emb_base": [10000, 1e6], "partial_rotary_factor": [0.5, 0.25, 1.0, 0.3, None],
    "rotary_pct": [0.25, 1.0, None], "max_position_embeddings": [2048, 131072], "n_positions": [2048],
    "original_max_position_embeddings": [4096, 8192], "layer_types": [[], ["full_attention"]],
    "rope_interleave": [True, "no"], "model_type": ["my_model", None],
    "rope_scaling": [None, {}, {"rope_type": "linear", "factor": 4.0}, {"rope_type": "yarn", "factor": 4.0}],
    "rope_parameters": [None, {"rope_type": "default"}, {"type": "linear", "factor": 2.0},
                        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}],
}  # fmt: skip
#: a dict of config keys: plausible values, each key at most once, one of them perhaps NASTY
CONFIG_DICTS = st.one_of(
    st.fixed_dictionaries({}, optional={k: st.sampled_from(v) for k, v in PLAUSIBLE.items()}),
    st.fixed_dictionaries(
        {"head_dim": st.sampled_from(PLAUSIBLE["head_dim"])},
        optional={k: st.sampled_from(v) for k, v in PLAUSIBLE.items() if k != "head_dim"},
    ),
).flatmap(
    lambda d: st.one_of(
        st.just(d),
        st.builds(lambda k, v: {**d, k: v}, st.sampled_from(ROPE_CONFIG_KEYS), NASTY),
    )
)


@PROPERTIES
@given(
    config=st.one_of(
        NASTY,
        st.dictionaries(st.sampled_from(ROPE_CONFIG_KEYS), NASTY, max_size=6),
        CONFIG_DICTS,
        CONFIG_DICTS,  # twice: a dict of plausible values reads often, and a valid one must
    )
)
@example(config={"head_dim": 64})  # valid: 10000, the whole head
@example(config={"hidden_size": 4096, "num_attention_heads": 32, "rope_theta": 500000.0, "rotary_pct": 0.25})
@example(config={"qk_rope_head_dim": 64, "head_dim": 128, "partial_rotary_factor": 0.5})
@example(config={"n_embd": 256, "n_head": 4, "rope_scaling": {}, "max_position_embeddings": 2048})
@example(config={"head_dim": 64, "rope_theta": None})  # refused: a null base
@example(config={"head_dim": 64, "rope_theta": 0.5})  # read, then refused: a base <= 1
@example(config={"text_config": {"head_dim": 32}, "model_type": "zz"})  # valid: the text part
def test_read_hf_config_on_arbitrary_objects(config):
    # decided up front (read_hf_config's docstring): a config is a dict, a transformers config or a path to a
    # config.json (or its folder); anything else is refused, and a string names a path, which these short ones
    # do not (FileNotFoundError naming it). A dict without a model_type (or with one nobody knows), read with
    # interleaved=False, is read by docs/scaling.md's key table alone (no_model_type_reading); its values are then
    # checked by "What each parameter may be" (frequencies_verdict), with transformers' frequencies as the oracle
    if isinstance(config, dict) and isinstance(config.get("model_type"), str) and config["model_type"]:
        assume(not _known_model_type(config["model_type"]))  # a real architecture: its defaults (perturbed_configs)
    reading = no_model_type_reading(config) if isinstance(config, dict) else None
    verdict = None if reading is None else frequencies_verdict(reading[2], reading[1], reading[0])
    want = None
    if verdict is not None and accepted(verdict[0], strict=True):
        want = computes(reading[2], verdict[2], verdict[1], None, reading[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s = read_hf_config(config, interleaved=False)
            rope = RoPE.from_hf_config(config, interleaved=False, max_position=16)
        except FileNotFoundError as exc:  # a string is a path
            assert isinstance(config, str), exc
            assert repr(str(config)) in str(exc) or str(config) in str(exc)
            return
        except Exception as exc:
            assert not isinstance(config, str), f"the path {config!r} was not looked up: {exc}"
            assert want is None, f"{config!r}, valid by docs/scaling.md, was refused: {exc}"
            assert_named_error(exc)
            return
    assert isinstance(config, dict), f"{config!r} was read as a config"
    assert reading is not None and want is not None, f"{config!r}, invalid by docs/scaling.md, was read: {s}"
    head_dim, base, block, length = reading
    assert (s.head_dim, s.base, s.scaling, s.rotary_dim) == (head_dim, base, block, None), (s, reading)
    assert (s.max_position_embeddings, s.interleaved) == (length, False)
    assert torch.equal(rope.inv_freq, want[0]) and rope.attention_scaling == float(want[1]), config


# ------------------------------------------------------------------------------------------------
# architectures with keys of their own: heterogeneous configs, DeepSeek-V4, attribute_map names


def test_gemma4_reads_each_layer_types_own_head_width():
    from rotary.hf import read_hf_layers

    config = transformers.Gemma4TextConfig(num_hidden_layers=6, head_dim=64, global_head_dim=128)
    layers = read_hf_layers(config)
    assert {t: s.head_dim for t, s in layers.items()} == {"full_attention": 128, "sliding_attention": 64}
    assert layers["full_attention"].scaling["rope_type"] == "proportional"
    # the same from the config.json a checkpoint ships (global_head_dim, no per_layer_config yet)
    d = {k: v for k, v in config.to_dict().items() if k != "per_layer_config"}
    assert read_hf_config(dict(d, global_head_dim=128), layer_type="full_attention").head_dim == 128
    with pytest.raises(ConfigError, match="layer_type"):
        read_hf_config(config)


def test_a_published_gemma3_config_without_layer_types_reads_per_layer_type():
    # Gemma-3's 4.x config.json lists no layer_types: its sliding and full layers are implied. read_hf_layers
    # refused it ("pass layer_type=") though read_hf_config(layer_type=...) reads each
    d = json.loads((PUBLISHED / "gemma-3-4b-it.json").read_text())
    layers = read_hf_layers(d)
    assert sorted(layers) == ["full_attention", "sliding_attention"]
    for kind, settings in layers.items():
        assert settings == read_hf_config(d, layer_type=kind)
    assert (layers["full_attention"].base, layers["sliding_attention"].base) == (1_000_000.0, 10_000.0)
    assert layers["full_attention"].scaling == {"rope_type": "linear", "factor": 8.0}


def test_per_layer_config_overrides_that_disagree_within_a_layer_type_are_refused():
    d = transformers.Gemma4TextConfig(num_hidden_layers=6).to_dict()
    d["layer_types"] = ["sliding_attention", "full_attention"] * 3
    d["per_layer_config"] = {"1": {"head_dim": 512}, "3": {"head_dim": 256}}
    with pytest.raises(ConfigError, match=r"full_attention layers 1 and 3 have different per_layer_config"):
        read_hf_config(d, layer_type="full_attention")


def test_deepseek_v4_has_a_main_and_a_compress_rope():
    config = transformers.DeepseekV4Config(
        num_hidden_layers=4,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536},
    )
    main = read_hf_config(config, layer_type="sliding_attention")
    compress = read_hf_config(config, layer_type="compress")
    assert (main.head_dim, main.interleaved, main.base, main.scaling["rope_type"]) == (64, True, 10000.0, "default")
    assert (compress.base, compress.scaling["rope_type"], compress.scaling["attention_factor"]) == (
        160000.0,
        "yarn",
        1.0,
    )
    assert read_hf_config(config, layer_type="heavily_compressed_attention") == compress
    with pytest.raises(ConfigError, match="'main'"):
        read_hf_config(config)
    with pytest.raises(ConfigError, match="'full_attention'"):
        read_hf_config(config, layer_type="full_attention")


def test_attribute_map_names_are_read_and_the_fallback_table_agrees_with_transformers():
    from rotary.hf.own_keys import ATTRIBUTE_MAPS, attribute_map

    for model_type, table in ATTRIBUTE_MAPS.items():
        assert attribute_map(model_type) == table
    assert (
        read_hf_config(
            {"model_type": "jetmoe", "kv_channels": 96, "hidden_size": 64, "num_attention_heads": 4}
        ).head_dim
        == 96
    )


def test_dbrx_base_stated_only_in_attn_config_is_not_silently_dropped():
    d = {"model_type": "dbrx", "d_model": 512, "n_heads": 4, "attn_config": {"rope_theta": 500000.0}}
    with pytest.raises(ConfigError, match=r"attn_config.rope_theta=500000.0"):
        read_hf_config(d)
    ok = dict(d, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    assert (read_hf_config(ok).head_dim, read_hf_config(ok).base) == (128, 500000.0)


@pytest.mark.parametrize("model_type", ["apertus", "cwm", "ministral3"])
def test_a_class_default_block_keeps_its_base_over_a_top_level_rope_theta(model_type):
    """Found by the perturbed-config property's review: transformers' Apertus, CWM and Ministral 3 config classes give a
    config without a RoPE block their default block, whose own base wins over a stated top-level rope_theta; rotary
    read the stated one. Strict: a ConfigError naming it; lenient: a warning and transformers' frequencies."""
    import importlib
    import inspect

    d = {"model_type": model_type, "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "rope_theta": 123456.0}
    with pytest.raises(ConfigError, match=r"rope_theta=123456.0, but transformers' .* whose base .* it keeps"):
        RoPE.from_hf_config(d)
    with pytest.warns(UserWarning, match="whose base"):
        rope = RoPE.from_hf_config(d, strict=False)
    config = transformers.AutoConfig.for_model(**d)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    (rotary_class,) = [
        c for n, c in vars(module).items() if n.endswith("RotaryEmbedding") and inspect.isclass(c)
    ]  # the model's own
    hf = rotary_class(config)
    assert torch.equal(rope.inv_freq, hf.inv_freq) and rope.attention_scaling == hf.attention_scaling
    assert rope.freqs.base != 123456.0
    # the base the class keeps, stated: nothing to say
    same = {**d, "rope_theta": config.rope_parameters["rope_theta"]}
    assert torch.equal(RoPE.from_hf_config(same).inv_freq, hf.inv_freq)
