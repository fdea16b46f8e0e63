"""Rotation frequencies: ``inv_freq`` and ``attention_scaling`` for every ``rope_type``.

Each ``rope_type`` is one function in :data:`ROPE_INIT_FUNCTIONS` with the signature
``fn(head_dim, base, rotary_dim, params, seq_len) -> (inv_freq, attention_scaling)``, the shape of
Hugging Face's ``modeling_rope_utils`` registry, but taking plain values instead of reading (and
mutating) a config object.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Frequencies", "frequencies", "default_inv_freq", "ROPE_INIT_FUNCTIONS", "register_rope_type"]

RopeInitFn = Callable[[int, float, int, Mapping[str, Any], "int | None"], "tuple[torch.Tensor, float]"]

#: ``rope_type`` -> init function. Extended by :func:`register_rope_type`.
ROPE_INIT_FUNCTIONS: dict[str, RopeInitFn] = {}


def register_rope_type(name: str) -> Callable[[RopeInitFn], RopeInitFn]:
    """Decorator adding an init function to :data:`ROPE_INIT_FUNCTIONS` under ``name``."""

    def deco(fn: RopeInitFn) -> RopeInitFn:
        ROPE_INIT_FUNCTIONS[name] = fn
        return fn

    return deco


@dataclass(frozen=True)
class Frequencies:
    """The frequencies of one RoPE configuration.

    Attributes:
        inv_freq: fp32 tensor ``[rotary_dim // 2]``; pair ``i`` turns by ``position * inv_freq[i]``.
        attention_scaling: factor multiplied into cos and sin (1.0 except for YaRN / LongRoPE).
        head_dim: channels per head ``D``.
        rotary_dim: channels rotated ``r`` (``r <= D``, even); the rest pass through.
        base: the base ``theta`` the frequencies were derived from.
        rope_type: name of the init function in :data:`ROPE_INIT_FUNCTIONS`.
        scaling: the scaling parameters used (read-only copy).
    """

    inv_freq: torch.Tensor
    attention_scaling: float
    head_dim: int
    rotary_dim: int
    base: float
    rope_type: str = "default"
    scaling: Mapping[str, Any] = field(default_factory=dict)

    @property
    def wavelengths(self) -> torch.Tensor:
        """``2π / inv_freq`` in tokens, float64 ``[rotary_dim // 2]`` (``inf`` for frequency 0)."""
        return (2 * math.pi) / self.inv_freq.double()


def default_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    """``1 / base ** (arange(0, r, 2) / r)`` in fp32, bit-identical to Hugging Face.

    The expression (fp32 exponent, fp32 power, fp32 reciprocal) is kept exactly as transformers writes
    it: checkpoints were trained with these rounded values, so "more accurate" ones would differ.

    Example:
        >>> default_inv_freq(10000.0, 128)[:3]
        tensor([1.0000, 0.8660, 0.7499])
    """
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype=torch.float) / rotary_dim
    return 1.0 / (base ** exponent)


@register_rope_type("default")
def _default(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: int | None):
    return default_inv_freq(base, rotary_dim), 1.0


def _check_dims(head_dim: int, rotary_dim: int | None) -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (channels rotate in pairs), got head_dim={head_dim}")
    if rotary_dim is None:
        return head_dim
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim <= 0:
        raise ValueError(f"rotary_dim must be a positive int, got {rotary_dim!r}")
    if rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even (channels rotate in pairs), got rotary_dim={rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim={rotary_dim} exceeds head_dim={head_dim}; use rotary_dim <= head_dim")
    return rotary_dim


def _check_base(base: float) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 0:
        raise ValueError(f"base must be a finite number > 0, got base={base!r}")
    return float(base)


def frequencies(
    head_dim: int,
    *,
    base: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
) -> Frequencies:
    """Compute the rotation frequencies of a RoPE configuration.

    Args:
        head_dim: channels per attention head ``D`` (even).
        base: RoPE base ``theta`` (``rope_theta`` in Hugging Face configs), > 0.
        rotary_dim: channels that rotate (even, ``<= head_dim``); default ``head_dim``.
        scaling: ``None`` or a Hugging Face-style block such as ``{"rope_type": "default"}``
            (the 4.x key ``type`` is accepted too).
        seq_len: current sequence length, for length-dependent types (dynamic NTK, LongRoPE).

    Returns:
        :class:`Frequencies` with ``inv_freq`` ``[rotary_dim // 2]`` (fp32) and ``attention_scaling``.

    Example:
        >>> f = frequencies(128)
        >>> f.inv_freq.shape, f.attention_scaling
        (torch.Size([64]), 1.0)
    """
    rotary_dim = _check_dims(head_dim, rotary_dim)
    base = _check_base(base)
    params: dict[str, Any] = dict(scaling or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ROPE_INIT_FUNCTIONS:
        valid = ", ".join(sorted(ROPE_INIT_FUNCTIONS))
        raise ValueError(f"unknown rope_type {rope_type!r}; valid rope_types: {valid}")
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](head_dim, base, rotary_dim, params, seq_len)
    inv_freq = inv_freq.to(torch.float32)
    if inv_freq.shape != (rotary_dim // 2,):
        raise RuntimeError(
            f"rope_type {rope_type!r} returned inv_freq of shape {tuple(inv_freq.shape)}, expected ({rotary_dim // 2},)"
        )
    return Frequencies(
        inv_freq=inv_freq,
        attention_scaling=float(attention_scaling),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        base=base,
        rope_type=rope_type,
        scaling=params,
    )
