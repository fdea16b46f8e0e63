"""rotary.hf.ignored_keys: every key transformers skips at RoPE validation is audited, and none that may
change the tables is dropped silently (read, dropped for a stated reason, or refused by name)."""

from __future__ import annotations

import warnings

import pytest
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

import rotary.hf.config as hf_config_module
from rotary import ConfigError, RoPE
from rotary.hf.config import read_hf_config
from rotary.hf.ignored_keys import IGNORED_ROPE_KEYS, READ, drop_ignored_keys

transformers.logging.set_verbosity_error()


def _ignored_by_transformers() -> dict[str, list[str]]:
    """key -> the model_types whose config class (or its default instance) skips it at rope validation."""
    found: dict[str, list[str]] = {}
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            cls = CONFIG_MAPPING[model_type]
        except Exception:  # a config class that needs a missing optional package
            continue
        keys = set(getattr(cls, "ignore_keys_at_rope_validation", None) or ())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                keys |= set(getattr(cls(), "ignore_keys_at_rope_validation", None) or ())
        except Exception:  # a few classes cannot build their own defaults
            pass
        for key in keys:
            found.setdefault(key, []).append(model_type)
    return found


@pytest.mark.slow
def test_every_key_transformers_skips_is_audited():
    found = _ignored_by_transformers()
    assert "alpha" in found and "llama_4_scaling_beta" in found  # the audit sees the lists it is about
    unaudited = {key: types for key, types in found.items() if key not in IGNORED_ROPE_KEYS}
    assert not unaudited, f"keys transformers skips at RoPE validation that rotary has not audited: {unaudited}"


def test_read_keys_are_keys_rotary_reads():
    from rotary.rope_types import ROPE_TYPES

    taken = set().union(*(t.required | t.optional for t in ROPE_TYPES.values()))
    for key, what in IGNORED_ROPE_KEYS.items():
        if what == READ:
            assert key in taken | {"mrope_section", "mrope_interleaved", "partial_rotary_factor"}, key


def _hunyuan(block: dict) -> dict:
    return {
        "model_type": "hunyuan_v1_dense",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "rope_scaling": block,
    }


def _skipping(monkeypatch, keys: list[str]) -> None:
    """Make read_hf_config see ``keys`` as the model's ignored keys (as hunyuan_vl_text's config class lists them)."""
    real = hf_config_module.model_defaults

    def fake(model_type, **kwargs):
        out = real(model_type, **kwargs)
        out["rope_ignore_keys"] = list(keys)
        return out

    monkeypatch.setattr(hf_config_module, "model_defaults", fake)


def test_alpha_skipped_by_transformers_is_read_not_dropped(monkeypatch):
    """HunYuan-VL's config class skips alpha (and YaRN's keys) at validation: alpha still sets the tables."""
    _skipping(monkeypatch, ["alpha", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"])
    block = {
        "type": "dynamic",
        "alpha": 1000.0,
        "factor": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    }
    s = read_hf_config(_hunyuan(block))
    assert s.scaling["rope_type"] == "ntk_alpha" and s.scaling["alpha"] == 1000.0
    assert not {"beta_fast", "beta_slow", "mscale", "mscale_all_dim"} & set(s.scaling)
    # before this audit, alpha was dropped here and the tables were plain dynamic NTK's: they differ
    alpha_rope = RoPE.from_hf_config(_hunyuan(block))
    plain = RoPE.from_hf_config(_hunyuan({"type": "dynamic", "factor": 1.0}))
    assert not bool((alpha_rope.inv_freq == plain.inv_freq).all())
    # alpha on a type that does not read it: refused by name (transformers' HunYuan ignores it there)
    with pytest.raises(ConfigError, match="alpha"):
        RoPE.from_hf_config(_hunyuan({"type": "linear", "factor": 2.0, "alpha": 1000.0}))


def test_unaudited_skipped_key_is_refused_by_name(monkeypatch):
    _skipping(monkeypatch, ["shift_scale"])
    with pytest.raises(ConfigError, match=r"shift_scale=0\.5.*hunyuan_v1_dense"):
        read_hf_config(_hunyuan({"type": "dynamic", "factor": 2.0, "shift_scale": 0.5}))
    read_hf_config(_hunyuan({"type": "dynamic", "factor": 2.0}))  # absent: nothing to refuse


def test_inert_keys_are_dropped_with_their_reason():
    block = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "llama_4_scaling_beta": 0.1,
        "max_position_embeddings": 64,
    }
    drop_ignored_keys(block, ["llama_4_scaling_beta", "max_position_embeddings"], "ministral3", "the config")
    # dropped: the query temperature; kept: a key the yarn type takes
    assert "llama_4_scaling_beta" not in block and block["max_position_embeddings"] == 64
    assert "not part of the cos/sin tables" in IGNORED_ROPE_KEYS["llama_4_scaling_beta"]


def test_ministral3_config_with_llama_4_scaling_beta_reads():
    cfg = transformers.AutoConfig.for_model(
        "ministral3",
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        num_key_value_heads=2,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 16,
            "max_position_embeddings": 64,
            "llama_4_scaling_beta": 0.1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )
    s = read_hf_config(cfg)
    assert s.scaling["rope_type"] == "yarn" and "llama_4_scaling_beta" not in s.scaling


@pytest.mark.parametrize("strict", [True, False])
def test_a_rope_type_that_is_not_a_string_is_refused_by_name(strict):
    """The ignored-keys pass looked the type up in a dict: a list raised 'unhashable type' from inside rotary."""
    config = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": [], "rope_theta": 1e6},
    }
    with pytest.raises(ConfigError, match=r"unknown rope_type \[\]"):
        RoPE.from_hf_config(config, strict=strict)
