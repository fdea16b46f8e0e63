"""LongRoPE's short_mscale / long_mscale (Phi-3.5-MoE): a float64 form of the per-set attention factor,
transformers' PhiMoE and Phi-3 models (tiny, from configs), and vLLM's rule (longrope_serving_block)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import transformers

from rotary import ConfigError, RoPE, frequencies
from rotary.rope_types import longrope_serving_block

transformers.logging.set_verbosity_error()

N = 8  # pairs: head_dim 16
SHORT = [1.0, 1.1, 1.3, 1.7, 2.0, 2.2, 2.5, 3.0]
LONG = [1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 11.0, 15.0]
TRAINED = 16


def block(**extra) -> dict:
    return {
        "rope_type": "longrope",
        "short_factor": SHORT,
        "long_factor": LONG,
        "original_max_position_embeddings": TRAINED,
        **extra,
    }


def reference(positions: torch.Tensor, factors: list[float], mscale: float, base: float = 10000.0):
    """float64 cos/sin [S, 2N] (pairs (i, i + N)): angle t / (factor_i * base ** (2i / d)), times mscale."""
    d = 2 * N
    inv = torch.tensor([1.0 / (factors[i] * base ** (2 * i / d)) for i in range(N)], dtype=torch.float64)
    angle = positions.double()[:, None] * inv
    cos, sin = torch.cos(angle) * mscale, torch.sin(angle) * mscale
    return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want, rtol=0, atol=3e-6 * max(1.0, float(want.abs().max())))


def test_each_set_takes_its_mscale():
    rope = RoPE(2 * N, scaling=block(short_mscale=1.15, long_mscale=1.4, max_position_embeddings=64))
    short_positions, long_positions = torch.arange(TRAINED), torch.arange(3 * TRAINED)
    for got, want in zip(rope.cos_sin(short_positions), reference(short_positions, SHORT, 1.15)):
        close(got, want)
    for got, want in zip(rope.cos_sin(long_positions), reference(long_positions, LONG, 1.4)):
        close(got, want)
    # one of the two given: the other set keeps the default factor sqrt(1 + ln(64/16) / ln(16))
    default = math.sqrt(1 + math.log(64 / TRAINED) / math.log(TRAINED))
    only_long = frequencies(2 * N, scaling=block(long_mscale=1.4, max_position_embeddings=64))
    assert math.isclose(only_long.attention_scaling, default)
    assert (
        frequencies(
            2 * N, scaling=block(long_mscale=1.4, max_position_embeddings=64), seq_len=TRAINED + 1
        ).attention_scaling
        == 1.4
    )


def test_mscale_errors():
    with pytest.raises(ConfigError, match=r"short_mscale=0\.0"):
        frequencies(2 * N, scaling=block(factor=4.0, short_mscale=0.0))
    with pytest.raises(ConfigError, match="long_mscale"):
        frequencies(2 * N, scaling=block(factor=4.0, long_mscale="1.2"))
    with pytest.raises(ConfigError, match=r"attention_factor=1\.3 and short_mscale"):
        frequencies(2 * N, scaling=block(factor=4.0, attention_factor=1.3, short_mscale=1.2))
    with pytest.raises(ConfigError, match="short_mscale"):  # a type that does not read it names it
        frequencies(2 * N, scaling={"rope_type": "linear", "factor": 2.0, "short_mscale": 1.2})


def _tiny(model_type: str, rope_parameters: dict, **extra):
    sizes = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=2 * N,
        num_hidden_layers=1,
        intermediate_size=32,
        num_local_experts=2,
        vocab_size=32,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    return transformers.AutoConfig.for_model(model_type, rope_parameters=dict(rope_parameters), **sizes, **extra)


def test_phimoe_matches_transformers_within_the_trained_length_and_names_its_long_bug():
    params = block(rope_theta=10000.0, short_mscale=1.15, long_mscale=1.4)
    cfg = _tiny("phimoe", params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoModelForCausalLM.from_config(cfg).model.rotary_emb
    rope = RoPE.from_hf_config(cfg)
    short = torch.arange(TRAINED)
    hf_cos, hf_sin = hf(torch.zeros(1), short[None])
    cos, sin = rope.cos_sin(short)
    close(cos, hf_cos[0].double())
    close(sin, hf_sin[0].double())
    close(cos, reference(short, SHORT, 1.15)[0])

    # past the trained length transformers 5.23's PhiMoE takes long_mscale but keeps the SHORT factors (its
    # forward recomputes inv_freq without the length); the checkpoint's own code and vLLM use the long ones
    long = torch.arange(3 * TRAINED)
    hf_cos, hf_sin = hf(torch.zeros(1), long[None])
    close(hf_cos[0].double(), reference(long, SHORT, 1.4)[0])
    cos, sin = rope.cos_sin(long)
    close(cos, reference(long, LONG, 1.4)[0])
    close(sin, reference(long, LONG, 1.4)[1])


def test_phi3_config_with_mscale_is_refused_by_name():
    """transformers' Phi-3 ignores the keys, vLLM applies them: refused, or (strict=False) read as transformers."""
    params = block(rope_theta=10000.0, short_mscale=1.15, long_mscale=1.4)
    # Phi3Config's own original_max_position_embeddings (default 4096) wins over the block's: state it
    cfg = _tiny("phi3", params, original_max_position_embeddings=TRAINED)
    with pytest.raises(ConfigError, match=r"long_mscale=1\.4, short_mscale=1\.15.*transformers.*vLLM"):
        RoPE.from_hf_config(cfg)
    with pytest.warns(UserWarning, match="short_mscale"):
        rope = RoPE.from_hf_config(cfg, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoModelForCausalLM.from_config(cfg).model.rotary_emb
    for positions in (torch.arange(TRAINED), torch.arange(3 * TRAINED)):
        hf_cos, _ = hf(torch.zeros(1), positions[None])
        close(rope.cos_sin(positions)[0], hf_cos[0].double())


@pytest.mark.parametrize("max_model_len, uses_long", [(8, False), (TRAINED, False), (TRAINED + 1, True), (64, True)])
def test_serving_block_is_vllms_rule(max_model_len, uses_long):
    """vLLM: one set for every position, picked by max_model_len; default factor from max_position_embeddings
    alone (factor and attention_factor unread)."""
    given = block(max_position_embeddings=64, factor=2.0, attention_factor=1.05)
    served = longrope_serving_block(given, max_model_len)
    vllm_default = math.sqrt(1 + math.log(64 / TRAINED) / math.log(TRAINED))
    rope = RoPE(2 * N, scaling=served)
    for positions in (torch.arange(4), torch.arange(3 * TRAINED)):  # short and long calls alike
        want = reference(positions, LONG if uses_long else SHORT, vllm_default)
        for got, w in zip(rope.cos_sin(positions), want):
            close(got, w)
    with_mscale = longrope_serving_block(
        block(max_position_embeddings=64, short_mscale=1.1, long_mscale=1.3), max_model_len
    )
    assert with_mscale["short_mscale"] == with_mscale["long_mscale"] == (1.3 if uses_long else 1.1)
    assert given == block(max_position_embeddings=64, factor=2.0, attention_factor=1.05)  # not edited


def test_serving_block_errors():
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        longrope_serving_block(block(), 64)
    with pytest.raises(ConfigError, match="max_model_len"):
        longrope_serving_block(block(max_position_embeddings=64), 0)
