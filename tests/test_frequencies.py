import copy
import math
import warnings

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import rotary
from helpers import assert_named_error, assert_sound, computes
from rotary import frequencies
from rotary.frequencies import default_inv_freq
from strategies import (
    NASTY,
    PROPERTIES,
    accepted,
    frequencies_verdict,
    perturbed_blocks,
    setting,
    without,
)


def test_seed_002_inv_freq_figures():
    # seeds/README.md: head_dim 128, base 10000
    inv = rotary.frequencies(128).inv_freq
    assert inv.dtype == torch.float32 and inv.shape == (64,)
    assert float(inv.max()) == 1.0
    assert float(inv.min()) == pytest.approx(0.000115, abs=5e-7)
    assert float(inv.mean()) == pytest.approx(0.116562, abs=5e-7)
    assert inv[:5].tolist() == pytest.approx([1.0, 0.865964, 0.749894, 0.649382, 0.562341], abs=5e-7)


@pytest.mark.parametrize("head_dim", [2, 16, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 1e6, 10.0])
def test_inv_freq_bit_identical_to_hf_formula(head_dim, base):
    # transformers' expression, spelled out independently of ours
    hf = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    assert torch.equal(rotary.frequencies(head_dim, base=base).inv_freq, hf)


def test_partial_rotary_dim_uses_rotary_dim_as_denominator():
    f = rotary.frequencies(128, rotary_dim=32)
    assert f.rotary_dim == 32 and f.head_dim == 128
    assert torch.equal(f.inv_freq, default_inv_freq(10000.0, 32))


def test_default_scaling_block_and_legacy_type_key():
    for scaling in (None, {}, {"rope_type": "default"}, {"type": "default"}):
        f = rotary.frequencies(64, scaling=scaling)
        assert f.rope_type == "default" and f.attention_scaling == 1.0
        assert torch.equal(f.inv_freq, default_inv_freq(10000.0, 64))


def test_frequencies_is_frozen_and_has_wavelengths():
    f = rotary.frequencies(8)
    with pytest.raises(AttributeError):
        f.base = 1.0  # type: ignore[misc]
    assert float(f.wavelengths[0]) == pytest.approx(2 * math.pi)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(head_dim=7), "head_dim must be even.*7"),
        (dict(head_dim=0), "head_dim must be a positive int, got 0"),
        (dict(head_dim=64.0), "head_dim must be a positive int, got 64.0"),
        (dict(head_dim=64, rotary_dim=33), "rotary_dim must be even.*33"),
        (dict(head_dim=64, rotary_dim=128), "rotary_dim=128 exceeds head_dim=64"),
        (dict(head_dim=64, rotary_dim=-2), "rotary_dim must be a positive int, got -2"),
        (dict(head_dim=64, base=0.0), r"base must be a finite number > 0, got base=0.0"),
        (dict(head_dim=64, base=-10000.0), r"got base=-10000.0"),
        (dict(head_dim=64, base=float("nan")), r"got base=nan"),
        (dict(head_dim=2**40), r"head_dim=1099511627776 is wider than any attention head"),
    ],
)
def test_bad_dimensions_and_base(kwargs, match):
    head_dim = kwargs.pop("head_dim")
    with pytest.raises(ValueError, match=match):
        rotary.frequencies(head_dim, **kwargs)
    with pytest.raises(ValueError, match=match):
        rotary.RoPE(head_dim, **kwargs)


def test_unknown_rope_type_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown rope_type 'nope'.*default"):
        rotary.frequencies(64, scaling={"rope_type": "nope"})


def test_editing_the_block_afterwards_changes_nothing():
    # item 11 of issue 11: a longrope block's lists were kept by reference
    block = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 32,
        "long_factor": [4.0] * 32,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "nested": {"a": [1]},
    }
    with pytest.warns(UserWarning, match="unknown key 'nested'"):
        f = rotary.frequencies(64, scaling=block, strict=False)
    with pytest.warns(UserWarning):
        rope = rotary.RoPE(64, scaling=block, strict=False)
    with pytest.warns(UserWarning):
        expected = rotary.RoPE(64, scaling=copy.deepcopy(block), strict=False).cos_sin(torch.arange(100))
    inv_freq, short = f.inv_freq.clone(), rope.inv_freq.clone()
    block["short_factor"][:] = [2.0] * 32
    block["long_factor"][0] = 1000.0
    block["nested"]["a"].append(2)
    block["factor"] = 8.0
    assert f.scaling["short_factor"] == (1.0,) * 32 and f.scaling["long_factor"][0] == 4.0
    assert f.scaling["nested"] == {"a": (1,)} and f.scaling["factor"] == 4.0
    assert torch.equal(f.inv_freq, inv_freq)
    assert torch.equal(rope.inv_freq, short)
    # the long factors are computed at the first long call, after the edit
    cos, sin = rope.cos_sin(torch.arange(100))
    assert torch.equal(cos, expected[0]) and torch.equal(sin, expected[1])


def test_frequencies_scaling_is_a_read_only_deep_copy_that_serialises():
    import copy
    import json
    import pickle

    from rotary.frequencies import FrozenBlock

    block = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [2.0] * 4,
        "factor": 2.0,
        "original_max_position_embeddings": 64,
    }
    f = rotary.frequencies(8, scaling=block)
    assert isinstance(f.scaling, FrozenBlock) and isinstance(f.scaling, dict)
    for edit in (
        lambda s: s.__setitem__("factor", 3.0),
        lambda s: s.pop("factor"),
        lambda s: s.update(factor=3),
        lambda s: s.setdefault("x", 1),
        lambda s: s.clear(),
        lambda s: s.__delitem__("factor"),
    ):
        with pytest.raises(TypeError, match="FrozenBlock is read-only"):
            edit(f.scaling)
    with pytest.raises(AttributeError):
        f.scaling["short_factor"].append(3.0)  # a tuple
    assert f.scaling == {**block, "short_factor": (1.0,) * 4, "long_factor": (2.0,) * 4}
    assert json.loads(json.dumps(f.scaling)) == block
    for clone in (pickle.loads(pickle.dumps(f.scaling)), copy.deepcopy(f.scaling), copy.copy(f.scaling)):
        assert clone == f.scaling and isinstance(clone, FrozenBlock)
    editable = dict(f.scaling)
    editable["factor"] = 4.0
    assert f.scaling["factor"] == 2.0
    # the frozen block computes the same frequencies again
    assert torch.equal(rotary.frequencies(8, scaling=f.scaling).inv_freq, f.inv_freq)
    # a Frequencies built by hand freezes its block too
    g = rotary.Frequencies(
        inv_freq=f.inv_freq, attention_scaling=1.0, head_dim=8, rotary_dim=8, base=1e4, scaling={"factor": [1, 2]}
    )
    assert g.scaling == {"factor": (1, 2)} and isinstance(g.scaling, FrozenBlock)


@PROPERTIES
@given(
    perturbed=perturbed_blocks(),
    # a nasty base one time in four, so that most draws reach the block's rules (drawn as one_of(..., NASTY), whose
    # branches one_of flattens, 33 of 70 calls were refused for the base)
    base=st.sampled_from([None, 10000.0, 500000.0, "nasty"]).flatmap(lambda v: NASTY if v == "nasty" else st.just(v)),
    strict=st.booleans(),
    seq_len=st.one_of(st.none(), st.integers(1, 100_000)),
)
@example(perturbed=without("yarn", "mscale"), base=None, strict=True, seq_len=None)  # valid: mscale has a default
@example(perturbed=without("proportional", "partial_rotary_factor"), base=1e4, strict=True, seq_len=None)  # valid
@example(perturbed=without("llama3", "low_freq_factor"), base=None, strict=False, seq_len=None)  # invalid
@example(perturbed=without("linear", "type"), base=1.0, strict=True, seq_len=None)  # invalid: base 1
@example(perturbed=setting("linear", "factor", 1e30), base=None, strict=True, seq_len=None)  # valid
@example(perturbed=setting("linear", "factor", 1e300), base=None, strict=True, seq_len=None)  # frequencies underflow
@example(perturbed=setting("ntk", "factor", 1e30), base=None, strict=True, seq_len=None)  # the base overflows fp32
@example(perturbed=setting("yarn", "attention_factor", 1e39), base=None, strict=True, seq_len=None)  # past fp32
@example(perturbed=setting("yarn", "beta_fast", 64.0), base=None, strict=True, seq_len=None)  # valid
@example(perturbed=setting("llama3", "original_max_position_embeddings", 8192.5), base=None, strict=False, seq_len=None)
def test_frequencies_on_perturbed_blocks(perturbed, base, strict, seq_len):
    block, key, value = perturbed
    original = copy.deepcopy(block)
    # decided up front from the documented contract (strategies.frequencies_verdict: the base, the rotated width
    # and the block, docs/scaling.md "What each parameter may be"); a block that passes its checks is accepted
    # exactly when transformers computes finite, rotating frequencies from it (computes), and then they are
    # transformers' (bit for bit)
    verdict, rotary_dim, base_used = frequencies_verdict(block, base)
    want = computes(block, base_used, rotary_dim, seq_len) if accepted(verdict, strict) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            f = frequencies(64, base=base, scaling=block, strict=strict, seq_len=seq_len)
        except Exception as exc:
            assert want is None, f"a valid block was refused: {block}, base={base!r}, strict={strict} ({exc})"
            # the message names the perturbed key or value, the base, or the rotated width it gave
            assert_named_error(
                exc, (key, value), ("base", base), ("rope_theta", block.get("rope_theta")), ("rotary_dim", None)
            )
            return
    assert want is not None, f"an invalid block or base was accepted: {block}, base={base!r}, strict={strict}"
    assert block == original or math.isnan(value if isinstance(value, float) else 0.0), "frequencies modified its block"
    assert_sound(f)
    assert f.rotary_dim == 2 * len(want[0]) and torch.equal(f.inv_freq, want[0]), (block, f.inv_freq, want[0])
    assert f.attention_scaling == float(want[1])
