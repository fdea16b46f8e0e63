"""Property-based tests of the configuration layer: arbitrary scaling blocks, values and config dicts.

Every call to ``frequencies``, ``validate_rope_parameters``, ``read_hf_config`` and ``RoPE.from_hf_config``
on a perturbed input must end in one of two ways:

- a result whose frequencies are finite, turn (every pair that should rotate has a frequency > 0) and
  whose attention scaling is a finite number > 0, equal to transformers' ``ROPE_INIT_FUNCTIONS`` where
  transformers computes the same block; or
- a ``ConfigError`` / ``ValueError`` / ``TypeError`` raised by rotary itself (not passed through from
  Python's math, torch or json) whose message names the offending value or key.

Never NaN or inf frequencies, never a bare ZeroDivisionError, KeyError, AttributeError, OverflowError,
IndexError or "math domain error".
"""

from __future__ import annotations

import copy
import json
import math
import os
import traceback
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS as HF_ROPE_INIT_FUNCTIONS

import rotary
from rotary import ConfigError, RoPE, frequencies
from rotary.hf_config import read_hf_config
from rotary.rope_types import ROPE_TYPES, proportional_pairs, validate_rope_parameters

transformers.logging.set_verbosity_error()

PROPERTIES = settings(max_examples=int(os.environ.get("ROTARY_CONFIG_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROTARY_SOURCE = os.path.dirname(rotary.__file__)
FIXTURES = Path(__file__).parent / "fixtures"

# values YAML files, command lines and careless edits put into configs
NASTY = st.one_of(
    st.sampled_from([
        float("nan"), float("inf"), float("-inf"), 0, 0.0, -0.0, -1, -1.0, -5, 0.5, 1, 1.0, 2, 1e300, -1e300, 1e-300,
        2**63, 2**24 + 1, True, False, None, "", "1.0", "true", "false", "yarn", [], [1.0], [1.0, "x"], {}, {"a": 1},
    ]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.text(max_size=4),
    st.lists(st.floats(-2, 70), max_size=3),
)  # fmt: skip

#: a valid block per built-in type, with rotary_dim 64 (32 pairs)
VALID = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [4.0] * 32, "factor": 4.0,
                 "original_max_position_embeddings": 4096},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
}  # fmt: skip
BAD_TYPES = (ZeroDivisionError, KeyError, AttributeError, OverflowError, IndexError, RuntimeError, AssertionError)


def _mentions(message: str, key, value) -> bool:
    """The message names the offending key or value (in any of the ways a message prints one)."""
    texts = {repr(value), str(value)}
    if isinstance(value, float) and math.isfinite(value):
        texts |= {f"{value:g}", repr(float(value))}
    if isinstance(value, (list, tuple)):
        texts |= {repr(v) for v in value} | {str(v) for v in value}
    return any(t and t in message for t in texts) or (key is not None and str(key) in message)


def assert_named_error(exc: BaseException, *suspects: tuple) -> None:
    """``exc`` is a named error raised by rotary, naming one of the ``(key, value)`` suspects (if any given)."""
    assert not isinstance(exc, BAD_TYPES), f"bare {type(exc).__name__}: {exc}"
    assert isinstance(exc, (ConfigError, ValueError, TypeError)), f"unexpected {type(exc).__name__}: {exc}"
    assert "math domain error" not in str(exc)
    origin = traceback.extract_tb(exc.__traceback__)[-1].filename
    assert origin.startswith(ROTARY_SOURCE), f"{type(exc).__name__} raised outside rotary ({origin}): {exc}"
    if suspects:
        assert any(_mentions(str(exc), key, value) for key, value in suspects), f"the message names none of {suspects}: {exc}"


def assert_sound(f: rotary.Frequencies) -> None:
    inv_freq = f.inv_freq
    assert inv_freq.dtype == torch.float32 and bool(torch.isfinite(inv_freq).all()), inv_freq
    turning = proportional_pairs(f.head_dim, f.scaling) if ROPE_TYPES[f.rope_type].rotates_every_pair else len(inv_freq)
    assert bool((inv_freq[:turning] > 0).all()), inv_freq
    assert math.isfinite(f.attention_scaling) and f.attention_scaling > 0


def hf_frequencies(head_dim: int, rotary_dim: int, base: float, block: dict):
    """transformers' inv_freq and scaling for a block (the init functions read head_dim and the block)."""
    params = {k: v for k, v in block.items() if k != "max_position_embeddings"}
    params["rope_theta"] = base
    cfg = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim, num_hidden_layers=1,
                      intermediate_size=8, vocab_size=8, rope_parameters=params,
                      max_position_embeddings=block.get("max_position_embeddings", 4096))  # fmt: skip
    if block["rope_type"] == "default":  # transformers' default lives in each model's class: its formula
        return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim)), 1.0
    return HF_ROPE_INIT_FUNCTIONS[block["rope_type"]](cfg, "cpu")


@st.composite
def perturbed_blocks(draw):
    rope_type = draw(st.sampled_from(sorted(VALID)))
    block = copy.deepcopy(VALID[rope_type])
    keys = sorted(ROPE_TYPES[rope_type].required | ROPE_TYPES[rope_type].optional | {"rope_type", "partial_rotary_factor"})
    key = draw(st.sampled_from([*keys, "type", "rope_theta", "facter"]))
    action = draw(st.sampled_from(["set", "set", "set", "delete", "entry"]))
    value = None
    if action == "delete":
        block.pop(key, None)
        value = None
    elif action == "entry" and rope_type == "longrope":
        key = draw(st.sampled_from(["short_factor", "long_factor"]))
        value = draw(NASTY)
        block[key][draw(st.integers(0, 31))] = value
    else:
        value = draw(NASTY)
        block[key] = value
    return block, key, value


@PROPERTIES
@given(perturbed=perturbed_blocks(), base=st.one_of(st.none(), st.sampled_from([10000.0, 500000.0]), NASTY),
       strict=st.booleans(), seq_len=st.one_of(st.none(), st.integers(1, 100_000)))  # fmt: skip
def test_frequencies_on_perturbed_blocks(perturbed, base, strict, seq_len):
    block, key, value = perturbed
    original = copy.deepcopy(block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            f = frequencies(64, base=base, scaling=block, strict=strict, seq_len=seq_len)
        except Exception as exc:
            suspects = [(key, value)] + ([] if base in (None, 10000.0, 500000.0) else [("base", base)])
            assert_named_error(exc, *suspects)
            return
    assert block == original or math.isnan(value if isinstance(value, float) else 0.0), "frequencies modified its block"
    assert_sound(f)
    # where transformers computes the same block, the frequencies are transformers'
    rope_type = f.rope_type
    if seq_len is None and rope_type in VALID and rope_type not in ("ntk",) and "type" not in block:
        try:
            hf_inv_freq, hf_scaling = hf_frequencies(64, f.rotary_dim, f.base, dict(f.scaling))
        except Exception:  # noqa: BLE001 - transformers failing on a block rotary accepts is reported below
            hf_inv_freq = None
        if hf_inv_freq is None:
            # rotary reads an explicit null as "not given" (partial_rotary_factor: null is 1, as when absent) where
            # transformers fails on int(head_dim * None); and with strict=False it accepts a length written as a
            # float, which transformers' config class refuses. Any other failure is a difference to look at.
            lengths = [f.scaling.get(k) for k in ("max_position_embeddings", "original_max_position_embeddings")]
            float_length = not strict and any(isinstance(v, float) for v in lengths)
            assert None in f.scaling.values() or float_length, f"transformers cannot compute a block rotary accepts: {dict(f.scaling)}"
            return
        assert torch.equal(f.inv_freq, hf_inv_freq.float()), (dict(f.scaling), f.inv_freq, hf_inv_freq)
        assert f.attention_scaling == pytest.approx(float(hf_scaling), rel=1e-12)


@PROPERTIES
@given(perturbed=perturbed_blocks(), rotary_dim=st.one_of(st.sampled_from([64, 2, 4, 62]), NASTY),
       strict=st.one_of(st.booleans(), NASTY))  # fmt: skip
def test_validate_rope_parameters_on_perturbed_blocks(perturbed, rotary_dim, strict):
    block, key, value = perturbed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = validate_rope_parameters(block, rotary_dim=rotary_dim, strict=strict)
        except Exception as exc:
            assert_named_error(exc, (key, value), ("rotary_dim", rotary_dim), ("strict", strict))
            return
    assert isinstance(out, dict) and out["rope_type"] in ROPE_TYPES and out is not block


# ---- whole configs ----------------------------------------------------------------------------------
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
    name = draw(st.sampled_from(sorted(CONFIGS)))
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
        value = draw(NASTY)
        where[key] = value
    return d, key, value


LAYER_TYPES = st.sampled_from([None, "sliding_attention", "full_attention"])


@PROPERTIES
@given(perturbed=perturbed_configs(), strict=st.booleans(), layer_type=LAYER_TYPES, interleaved=st.sampled_from([None, False]))
def test_read_hf_config_and_from_hf_config_on_perturbed_configs(perturbed, strict, layer_type, interleaved):
    d, key, value = perturbed
    original = copy.deepcopy(d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            settings_ = read_hf_config(d, layer_type=layer_type, strict=strict, interleaved=interleaved)
            rope = RoPE.from_hf_config(d, layer_type=layer_type, strict=strict, interleaved=interleaved, max_position=16)
        except Exception as exc:
            # a layer type the config lacks, or a config the perturbation made ambiguous, names itself;
            # anything else must name the perturbed key or value
            message = str(exc)
            if "layer_type" in message or "layer type" in message:
                assert_named_error(exc)
            else:
                assert_named_error(exc, (key, value))
            return
    assert json.dumps(d, sort_keys=True, default=repr) == json.dumps(original, sort_keys=True, default=repr)
    assert isinstance(settings_.interleaved, bool) and settings_.interleaved == rope.interleaved
    assert_sound(rope.freqs)
    cos, sin = rope.cos_sin(torch.arange(0, 40))
    assert bool(torch.isfinite(cos).all() and torch.isfinite(sin).all())


@PROPERTIES
@given(config=st.one_of(NASTY, st.dictionaries(st.sampled_from(ROPE_CONFIG_KEYS), NASTY, max_size=6)))
def test_read_hf_config_on_arbitrary_objects(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s = read_hf_config(config, interleaved=False)
        except FileNotFoundError as exc:  # a string is a path
            assert repr(str(config)) in str(exc) or str(config) in str(exc)
            return
        except Exception as exc:
            assert_named_error(exc)
            return
    assert s.head_dim > 0 and math.isfinite(s.base)
