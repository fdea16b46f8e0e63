import math

import pytest
import torch

import rotary
from rotary.frequencies import default_inv_freq


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
