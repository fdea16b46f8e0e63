"""``llama3`` (Llama 3.1's wavelength bands) and ``proportional`` (Gemma: the first fraction of the pairs
turn, the rest keep frequency 0)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._checks import is_number
from .registry import ConfigError, RopeExample, check_factor, default_inv_freq, optional_number, register_rope_type


def _check_llama3(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "llama3", complain)
    low, high = (
        optional_number(p, key, "llama3", allowed=f"> 0; Llama 3.1 uses {example}")
        for key, example in (("low_freq_factor", 1), ("high_freq_factor", 4))
    )
    for key, value in (("low_freq_factor", low), ("high_freq_factor", high)):
        if value <= 0:
            raise ConfigError(
                f"{key}={value} for rope_type 'llama3' must be > 0 (the band edges are original_max_position_embeddings"
                f" / {key}); Llama 3.1 uses low_freq_factor=1 and high_freq_factor=4"
            )
    if low >= high:
        complain(
            f"low_freq_factor={low} must be smaller than high_freq_factor={high} (Llama 3.1 uses 1 and 4); "
            "swap or fix them"
        )


@register_rope_type(
    "llama3",
    required={"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    check=_check_llama3,
    trained_length=True,
    example=lambda d: RopeExample(  # Llama 3.1's published values
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        base=500000.0,
        max_position=131072,
    ),
)
def _llama3(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    inv_freq = default_inv_freq(base, rotary_dim)
    factor = params["factor"]
    low_freq_factor, high_freq_factor = params["low_freq_factor"], params["high_freq_factor"]
    trained = params["original_max_position_embeddings"]
    # wavelengths longer than trained / low_freq_factor are interpolated by `factor`, shorter than
    # trained / high_freq_factor are kept, and in between the two are blended smoothly
    low_freq_wavelen = trained / low_freq_factor
    high_freq_wavelen = trained / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (trained / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def _check_proportional(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    check_factor(p, "proportional", complain, nullable=True)
    fraction = p.get("partial_rotary_factor")
    if fraction is not None and (not is_number(fraction) or not 0 < fraction <= 1):
        raise ConfigError(
            f"partial_rotary_factor of rope_type 'proportional' must be a number in (0, 1], got {fraction!r}"
        )
    # rotary_dim is the head width here (every pair is kept; the ones past the fraction get frequency 0)
    if proportional_pairs(rotary_dim, p) < 1:
        raise ConfigError(
            f"partial_rotary_factor={fraction} with head_dim={rotary_dim} leaves no pair rotating for rope_type "
            f"'proportional' (int({fraction} * {rotary_dim} // 2) = 0); raise it to at least {2 / rotary_dim:g}"
        )


def proportional_pairs(head_dim: int, params: Mapping[str, Any]) -> int:
    """Pairs that turn under ``proportional``: ``int(partial_rotary_factor * head_dim // 2)`` (as transformers)."""
    fraction = params.get("partial_rotary_factor")
    return int((1.0 if fraction is None else fraction) * head_dim // 2)


@register_rope_type(
    "proportional",
    optional={"factor"},
    check=_check_proportional,
    rotates_every_pair=True,
    example=lambda d: RopeExample({"rope_type": "proportional", "factor": 4.0, "partial_rotary_factor": 0.25}),
)
def _proportional(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Gemma-style: the first partial_rotary_factor of the pairs rotate with exponents over the whole
    # head_dim (not over the rotated width), the remaining pairs get frequency 0 (they never turn).
    rotating = proportional_pairs(head_dim, params)
    exponent = torch.arange(0, 2 * rotating, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (base**exponent)
    still = head_dim // 2 - rotating
    if still > 0:
        inv_freq = torch.cat((inv_freq, torch.zeros(still, dtype=torch.float32, device="cpu")))
    factor = params.get("factor")
    return inv_freq / (1.0 if factor is None else factor), 1.0
