"""Range and type checks of every rope_type's parameters (rotary.rope_types): what is allowed, what the
error says, and where strict=False may only warn (the frequencies must stay finite and computable)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import rotary
from helpers import assert_named_error
from rotary import ConfigError, RoPE, frequencies
from rotary.rope_types import ROPE_TYPES, register_rope_type, validate_rope_parameters
from strategies import NASTY, PROPERTIES, accepted, block_verdict, perturbed_blocks, setting, without
from variant_checks import is_int

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}  # fmt: skip
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [4.0] * 32, "factor": 4.0,
            "original_max_position_embeddings": 4096}  # fmt: skip
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096}

# (block, base, message): refused with and without strict, because nothing finite (or nothing that
# rotates) could be computed from them
NEVER = [
    # item 18 of issue 11: each of these was a ZeroDivisionError / "math domain error"
    ({**LLAMA3, "low_freq_factor": 0}, None, r"low_freq_factor=0 for rope_type 'llama3' must be > 0"),
    ({**LLAMA3, "high_freq_factor": -4.0}, None, r"high_freq_factor=-4.0 for rope_type 'llama3' must be > 0"),
    ({**YARN, "beta_slow": -5}, None, r"beta_slow=-5 for rope_type 'yarn' must be > 0"),
    ({**YARN, "beta_fast": -1.0}, None, r"beta_fast=-1.0 for rope_type 'yarn' must be > 0"),
    # item 10: out-of-range values that gave NaN, inf or no rotation
    (
        {**LONGROPE, "long_factor": [4.0] * 31 + [0.0]},
        None,
        r"long_factor entries .* must be > 0, got long_factor\[31\]=0.0",
    ),
    ({**LONGROPE, "short_factor": [-1.0] * 32}, None, r"short_factor\[0\]=-1.0"),
    (
        {"rope_type": "proportional", "partial_rotary_factor": 0},
        None,
        r"partial_rotary_factor of rope_type 'proportional' must be a number in \(0, 1\], got 0",
    ),
    (
        {"rope_type": "proportional", "partial_rotary_factor": 0.01},
        None,
        r"leaves no pair rotating .*raise it to at least 0.03125",
    ),
    ({**DYNAMIC, "factor": 1e300}, None, r"factor=1e\+300 for rope_type 'dynamic' is too large: .*<= 2\*\*24"),
    ({"rope_type": "ntk", "factor": 1e300}, None, r"factor=1e\+300 for rope_type 'ntk' overflows the base"),
    (
        {"rope_type": "linear", "factor": 1e300},
        None,
        r"gives frequency 0 \(in float32\) to pairs \[0, 1, .*would not rotate",
    ),
    ({"rope_type": "linear", "factor": 0.0}, None, r"factor=0.0 for rope_type 'linear' must be > 0"),
    ({"rope_type": "linear", "factor": -2.0}, None, r"factor=-2.0 for rope_type 'linear' must be > 0"),
    ({**YARN, "factor": -4.0}, None, r"factor=-4.0 for rope_type 'yarn' must be > 0"),
    ({**YARN, "attention_factor": 0.0}, None, r"attention_factor=0.0 for rope_type 'yarn' must be > 0"),
    ({**LONGROPE, "attention_factor": -1}, None, r"attention_factor=-1 for rope_type 'longrope' must be > 0"),
    (
        {**YARN, "mscale": 1.0, "mscale_all_dim": -10 / math.log(4.0)},
        None,
        r"give the attention factor .* must be a finite number > 0",
    ),
    (
        {**YARN, "mscale": -20.0, "mscale_all_dim": 1.0},
        None,
        r"attention factor .* = -[0-9.]+, which must be a finite number > 0",
    ),
    ({**LONGROPE, "factor": 4.0, "original_max_position_embeddings": 1}, None, r"divides by ln\(1\) = 0"),
    ({"rope_type": "default"}, 1e-300, r"base=1e-300 must be > 1"),
    ({"rope_type": "default"}, 1.0, r"base=1.0 must be > 1"),
    ({"rope_type": "yarn", **YARN}, 0.5, r"base=0.5 must be > 1"),
    ({"rope_type": "default"}, 1e300, r"gives frequency 0 \(in float32\) to pairs \[.*would not rotate"),
    # finite at the trained length, not at the length the factor aims for (factor x 4096 tokens)
    ({**DYNAMIC, "factor": 2.0**24}, 1e37, r"'dynamic' .* at sequence length 68719476736 gives frequency 0"),
    # found by tests/test_config_properties.py
    (
        {**YARN, "mscale": 1e300, "mscale_all_dim": 1.0},
        None,
        r"mscale=1e\+300.* gives attention scaling .*float32 tables",
    ),
    (
        {**LONGROPE, "original_max_position_embeddings": 1e-300},
        None,
        r"original_max_position_embeddings must be a positive int .*1e-300",
    ),
    (
        {**LONGROPE, "short_factor": [1e-188] * 32},
        None,
        r"non-finite frequencies for pairs \[0, .*short_factor\[0\]=1e-188",
    ),
    (
        {**LONGROPE, "long_factor": [3.4e38] * 32},
        None,
        r"at sequence length 4097 gives frequency 0 .*long_factor\[1\]=3.4e\+38",
    ),
    # item 7: a number written as a string (YAML, CLI) is not a number
    (
        {"rope_type": "linear", "factor": "2.0"},
        None,
        r"factor of rope_type 'linear' must be a finite number .*got '2.0' \(str\)",
    ),
    ({"rope_type": "linear", "factor": True}, None, r"got True \(bool\)"),
    ({"rope_type": "linear", "factor": float("nan")}, None, r"got nan \(float\)"),
    ({"rope_type": "linear", "factor": float("inf")}, None, r"got inf \(float\)"),
    ({**LLAMA3, "high_freq_factor": "4"}, None, r"high_freq_factor of rope_type 'llama3' must be a finite number"),
    ({**YARN, "beta_fast": [32]}, None, r"beta_fast of rope_type 'yarn' must be a finite number .*got \[32\] \(list\)"),
    ({**YARN, "mscale": "1.0", "mscale_all_dim": 1.0}, None, r"mscale of rope_type 'yarn' must be a finite number"),
    ({**YARN, "truncate": "false"}, None, r"truncate of rope_type 'yarn' must be true or false, got 'false' \(str\)"),
    ({**YARN, "truncate": 0}, None, r"truncate of rope_type 'yarn' must be true or false, got 0 \(int\)"),
    (
        {**YARN, "original_max_position_embeddings": "4096"},
        None,
        r"original_max_position_embeddings must be a positive int .*'4096'",
    ),
    ({**DYNAMIC, "max_position_embeddings": True}, None, r"max_position_embeddings must be a positive int .*True"),
    ({**LONGROPE, "short_factor": ["1.0"] * 32}, None, r"short_factor must be a list of 32 numbers"),
]


@pytest.mark.parametrize("block, base, message", NEVER, ids=[str(i) for i in range(len(NEVER))])
def test_values_with_nothing_to_compute_are_errors_even_leniently(block, base, message):
    for strict in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # lenient mode may warn about other keys first
            with pytest.raises(ConfigError, match=message):
                frequencies(64, base=base, scaling=block, strict=strict)


# (block, message): value mistakes that still give finite, rotating frequencies: an error in strict
# mode, a warning with strict=False
WARN = [
    ({**YARN, "beta_fast": 0}, r"beta_fast=0 for rope_type 'yarn' is read as unset \(the default 32"),
    ({**YARN, "mscale": 0.0, "mscale_all_dim": 1.0}, r"mscale=0.0 for rope_type 'yarn' must be > 0"),
    ({**YARN, "mscale": -0.5, "mscale_all_dim": 1.0}, r"mscale=-0.5 for rope_type 'yarn' must be > 0"),
    ({"rope_type": "linear", "factor": 0.5}, r"factor=0.5 < 1"),
    ({**DYNAMIC, "factor": 0.5}, r"factor=0.5 < 1"),
    ({**LONGROPE, "factor": 0.5}, r"factor=0.5 < 1"),
    ({"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 0.5}, r"factor=0.5 < 1"),
    ({**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 4.0}, r"low_freq_factor=4.0 must be smaller"),
    # item 15 of issue 11: transformers warns about this one (and uses factor)
    ({**YARN, "max_position_embeddings": 65536},
     r"rope_type 'yarn' factor=4.0 disagrees with max_position_embeddings / original_max_position_embeddings = "
     r"65536 / 4096 = 16; set factor to 16 or fix the lengths"),
]  # fmt: skip


@pytest.mark.parametrize("block, message", WARN, ids=[str(i) for i in range(len(WARN))])
def test_value_mistakes_are_errors_strictly_and_warnings_leniently(block, message):
    with pytest.raises(ConfigError, match=message):
        frequencies(64, scaling=block)
    with pytest.warns(UserWarning, match=message):
        f = frequencies(64, scaling=block, strict=False)
    turning = f.inv_freq[:16] if block["rope_type"] == "proportional" else f.inv_freq  # the others never turn
    assert bool(torch.isfinite(f.inv_freq).all()) and bool((turning > 0).all())
    assert math.isfinite(f.attention_scaling) and f.attention_scaling > 0


def test_yarn_factor_disagreeing_with_the_lengths_uses_factor_like_transformers():
    import transformers
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    transformers.logging.set_verbosity_error()
    block = {**YARN, "rope_theta": 10000.0}
    cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        max_position_embeddings=65536,
        num_hidden_layers=1,
        intermediate_size=8,
        vocab_size=8,
        rope_parameters=dict(block),
    )
    hf_inv_freq, hf_scaling = ROPE_INIT_FUNCTIONS["yarn"](cfg, "cpu")
    with pytest.warns(UserWarning, match="disagrees with"):
        f = frequencies(64, scaling={**block, "max_position_embeddings": 65536}, strict=False)
    assert torch.equal(f.inv_freq, hf_inv_freq) and f.attention_scaling == hf_scaling
    # a context length left at the trained one (Qwen2.5's documented block) is not a disagreement
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frequencies(64, scaling={**YARN, "max_position_embeddings": 4096})
        frequencies(64, scaling={**YARN, "max_position_embeddings": 16384})


def test_a_string_scaling_is_a_config_error():
    # item 18 of issue 11: RoPE(64, scaling="linear") failed converting the string to a dict
    with pytest.raises(ConfigError, match="scaling block must be a dict .*got 'linear'"):
        frequencies(64, scaling="linear")
    with pytest.raises(ConfigError, match="scaling block must be a dict .*got 'linear'"):
        RoPE(64, scaling="linear")


def test_argument_types_are_checked():
    with pytest.raises(TypeError, match="strict must be True or False, got 'false'"):
        frequencies(64, strict="false")
    with pytest.raises(TypeError, match="seq_len must be None, an int >= 0 or a one-element integer tensor, got 2.5"):
        frequencies(64, scaling=DYNAMIC, seq_len=2.5)
    with pytest.raises(TypeError, match="seq_len must be .* got True"):
        frequencies(64, scaling=DYNAMIC, seq_len=True)
    with pytest.raises(ValueError, match="base must be a finite number > 0, got base='10000'"):
        frequencies(64, base="10000")


def test_a_registered_type_returning_nan_is_refused():
    from rotary.rope_types import default_inv_freq, register_rope_type

    def _nan(head_dim, base, rotary_dim, params, seq_len):
        inv_freq = default_inv_freq(base, rotary_dim)
        inv_freq[3] = float("nan")
        return inv_freq, 1.0

    def _zero(head_dim, base, rotary_dim, params, seq_len):
        return default_inv_freq(base, rotary_dim), 1 / 0

    with ROPE_TYPES.scope():
        register_rope_type("test-nan")(_nan)
        register_rope_type("test-zero-division")(_zero)
        with pytest.raises(ConfigError, match=r"rope_type 'test-nan' .*non-finite frequencies for pairs \[3\]"):
            frequencies(64, scaling={"rope_type": "test-nan"})
        with pytest.raises(ConfigError, match=r"rope_type 'test-zero-division' cannot compute .*ZeroDivisionError"):
            frequencies(64, scaling={"rope_type": "test-zero-division"})
    assert "test-nan" not in ROPE_TYPES and "test-zero-division" not in ROPE_TYPES


@pytest.mark.parametrize("mode", ["hf", "stateless"])
@pytest.mark.parametrize(
    "builtin, update, block",
    [
        ("dynamic", "grow", {"factor": 4.0, "max_position_embeddings": 8}),
        (
            "longrope",
            "switch",
            {
                "original_max_position_embeddings": 8,
                "factor": 4.0,
                "short_factor": [1.0] * 8,
                "long_factor": [1.0 + i for i in range(8)],
            },
        ),
    ],
)
def test_a_registered_length_dependent_type_follows_the_length_like_the_builtin(builtin, update, block, mode):
    """A user's length-dependent type gets transformers' update rule from the registry, not from its name."""
    from rotary.rope_types import register_rope_type

    spec = ROPE_TYPES[builtin]
    with ROPE_TYPES.scope():
        register_rope_type(
            "test-mine",
            required=spec.required,
            optional=spec.optional,
            length_dependent=True,
            update=update,
            trained_length=spec.trained_length,
        )(spec.init)
        mine = RoPE(16, scaling={"rope_type": "test-mine", **block}, dynamic=mode)
        theirs = RoPE(16, scaling={"rope_type": builtin, **block}, dynamic=mode)
        g = torch.Generator().manual_seed(0)
        for length in [4, 12, 20, 6, 9, 3, 30, 8]:  # grows past, comes back under, crosses the trained length
            q = torch.randn(1, 2, length, 16, generator=g)
            assert torch.equal(mine(q, q)[0], theirs(q, q)[0]), length
            assert torch.equal(mine.schedule.current.inv_freq, theirs.schedule.current.inv_freq), length


def test_a_length_dependent_type_must_name_its_trained_length():
    from rotary.rope_types import default_inv_freq, register_rope_type

    def init(head_dim, base, rotary_dim, params, seq_len):
        return default_inv_freq(base, rotary_dim), 1.0

    with pytest.raises(ValueError, match="add 'max_position_embeddings' to required="):
        register_rope_type("test-no-length", required={"factor"}, length_dependent=True)(init)
    with pytest.raises(ValueError, match="add 'original_max_position_embeddings' to required="):
        register_rope_type("test-no-length", length_dependent=True, update="switch")(init)
    with pytest.raises(ValueError, match="update must be 'grow' .* or 'switch' .*, got 'sometimes'"):
        register_rope_type("test-no-length", length_dependent=True, update="sometimes")(init)
    with pytest.raises(TypeError, match="length_dependent must be True or False, got 'yes'"):
        register_rope_type("test-no-length", length_dependent="yes")(init)


BUILT_IN = ["default", "linear", "ntk", "dynamic", "ntk_alpha", "yarn", "longrope", "llama3", "proportional"]


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_type_names_an_unknown_key(name):
    """issue 24: the default type (no keys of its own) had been read as 'registered without checks'."""

    spec = ROPE_TYPES[name]
    block = dict(spec.example(64).block) if spec.example is not None else {"rope_type": name}
    frequencies(64, scaling=block)  # the block itself is valid
    with pytest.raises(ConfigError, match=rf"unknown key 'foo_bar' for rope_type '{name}'; valid keys: "):
        frequencies(64, scaling={**block, "foo_bar": 1})
    with pytest.raises(ConfigError, match=rf"unknown key 'foo_bar' for rope_type '{name}'"):
        RoPE(64, scaling={**block, "foo_bar": 1})
    with pytest.warns(UserWarning, match=rf"unknown key 'foo_bar' for rope_type '{name}'"):
        lenient = frequencies(64, scaling={**block, "foo_bar": 1}, strict=False)
    assert torch.equal(lenient.inv_freq, frequencies(64, scaling=block).inv_freq)


def test_which_registered_types_check_their_keys():
    """A type with key sets or a check, or check_keys=True, refuses other keys; a bare registration
    (a stand-in whose keys rotary cannot know) and a ROPE_INIT_FUNCTIONS assignment take any key."""
    from rotary.rope_types import ROPE_INIT_FUNCTIONS, default_inv_freq, register_rope_type

    def init(head_dim, base, rotary_dim, params, seq_len):
        return default_inv_freq(base, rotary_dim) / params.get("factor", 1.0), 1.0

    with ROPE_TYPES.scope():
        register_rope_type("test-bare")(init)
        register_rope_type("test-keyless", check_keys=True)(init)
        register_rope_type("test-keyed", optional={"factor"})(init)
        ROPE_INIT_FUNCTIONS["test-assigned"] = init
        assert not ROPE_TYPES["test-bare"].check_keys and not ROPE_TYPES["test-assigned"].check_keys
        assert ROPE_TYPES["test-keyless"].check_keys and ROPE_TYPES["test-keyed"].check_keys
        for name in ("test-bare", "test-assigned"):
            halved = frequencies(64, scaling={"rope_type": name, "factor": 2.0})
            assert torch.equal(halved.inv_freq, frequencies(64).inv_freq / 2)
        with pytest.raises(ConfigError, match=r"key 'factor' belongs to rope_type .*, not 'test-keyless'"):
            frequencies(64, scaling={"rope_type": "test-keyless", "factor": 2.0})
        with pytest.raises(ConfigError, match=r"unknown key 'factr' for rope_type 'test-keyed'; valid keys: factor, "):
            frequencies(64, scaling={"rope_type": "test-keyed", "factr": 2.0})
        with pytest.raises(TypeError, match="check_keys must be True or False"):
            register_rope_type("test-bad", check_keys="yes")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"required": "factor"}, "collection of key names"),
        ({"optional": 3}, "collection of key names"),
        ({"check": "yes"}, "check must be a function"),
        ({"length_dependent": "no"}, "length_dependent"),
        ({"trained_length": "no"}, "trained_length"),
    ],
)
def test_register_rope_type_checks_its_arguments(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        register_rope_type("_guard_test", **kwargs)


def test_register_rope_type_refuses_a_non_function():
    with pytest.raises(TypeError, match="decorates an init function"):
        register_rope_type("_guard_test2")(42)
    assert "_guard_test2" not in rotary.rope_types.ROPE_TYPES


@PROPERTIES
@given(
    perturbed=perturbed_blocks(),
    # a nasty strict or rotary_dim one time in four, so that most draws reach the block's rules (drawn as
    # st.one_of(..., NASTY), most were nasty: 9 of 69 calls were accepted)
    rotary_dim=st.sampled_from([64, 64, 2, 4, 62, None]).flatmap(lambda v: NASTY if v is None else st.just(v)),
    strict=st.sampled_from([True, False, True, None]).flatmap(lambda v: NASTY if v is None else st.just(v)),
)
@example(perturbed=without("yarn", "beta_fast"), rotary_dim=64, strict=True)  # valid: beta_fast has a default
@example(perturbed=without("proportional", "factor"), rotary_dim=64, strict=False)  # valid: factor is optional
@example(perturbed=without("linear", "factor"), rotary_dim=64, strict=False)  # invalid: a required key missing
@example(perturbed=without("longrope", "factor"), rotary_dim=64, strict=True)  # invalid: no factor, no length
@example(perturbed=setting("yarn", "beta_fast", 0.5), rotary_dim=64, strict=False)  # warned: fast < slow
@example(perturbed=setting("dynamic", "factor", 2**24), rotary_dim=64, strict=True)  # valid: at the limit
@example(perturbed=setting("llama3", "high_freq_factor", 1e-300), rotary_dim=64, strict=False)  # warned: low > high
@example(perturbed=setting("yarn", "beta_fast", 64.0), rotary_dim=64, strict=True)  # valid
@example(perturbed=setting("dynamic", "max_position_embeddings", 4096.5), rotary_dim=64, strict=False)  # warned
def test_validate_rope_parameters_on_perturbed_blocks(perturbed, rotary_dim, strict):
    block, key, value = perturbed
    # decided up front from the documented contract (strategies.block_verdict, docs/scaling.md "What each
    # parameter may be"): strict a bool, rotary_dim an int > 0, and the block valid, or warned and strict=False
    args_ok = isinstance(strict, bool) and is_int(rotary_dim) and rotary_dim > 0
    ok = args_ok and accepted(block_verdict(block, rotary_dim), strict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = validate_rope_parameters(block, rotary_dim=rotary_dim, strict=strict)
        except Exception as exc:
            assert not ok, f"a valid block was refused: {block}, rotary_dim={rotary_dim!r}, strict={strict!r} ({exc})"
            assert_named_error(exc, (key, value), ("rotary_dim", rotary_dim), ("strict", strict))
            return
    assert ok, f"an invalid block was accepted: {block}, rotary_dim={rotary_dim!r}, strict={strict!r}"
    # a normalised copy: the values given are the values used, rope_type set, 4.x's type dropped
    legacy = block.get("type")
    rope_type = block.get("rope_type", legacy if legacy is not None else "default")
    assert out is not block and out == {**{k: v for k, v in block.items() if k != "type"}, "rope_type": rope_type}
