"""Rotation frequencies: :class:`Frequencies` (``inv_freq`` and ``attention_scaling``) of a configuration.

The ``rope_type`` registry and the built-in types live in :mod:`rotary.rope_types`; this module turns
a configuration (head_dim, base, rotary width, scaling block) into the frequencies of one type.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ._checks import check_positive_int
from .rope_types import (
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    ConfigError,
    default_inv_freq,
    register_rope_type,
    rotary_dim_from,
    validate_rope_parameters,
)

__all__ = ["Frequencies", "frequencies", "default_inv_freq", "ROPE_INIT_FUNCTIONS", "ROPE_TYPES", "register_rope_type"]


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


def _check_dims(head_dim: int, rotary_dim: int | None) -> int:
    check_positive_int(head_dim, "head_dim")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (channels rotate in pairs), got head_dim={head_dim}")
    if rotary_dim is None:
        return head_dim
    check_positive_int(rotary_dim, "rotary_dim")
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
    base: float | None = None,
    rotary_dim: int | None = None,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | torch.Tensor | None = None,
    strict: bool = True,
) -> Frequencies:
    """Compute the rotation frequencies of a RoPE configuration.

    ``scaling`` uses Hugging Face's names and defaults (transformers 5.23 is the reference):
    ``default``; ``linear`` (``factor``); ``dynamic`` (``factor``, ``max_position_embeddings``);
    ``yarn`` (``factor``, ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``,
    ``attention_factor``, ``mscale``, ``mscale_all_dim``, ``truncate``); ``longrope``
    (``short_factor``, ``long_factor``, ``factor``, ``original_max_position_embeddings``,
    ``attention_factor``); ``llama3`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``); ``proportional`` (``partial_rotary_factor``, ``factor``);
    ``ntk`` (static NTK-aware: base' = base * factor ** (r / (r - 2))). Any block may carry
    ``rope_theta`` (the base) and ``partial_rotary_factor``. See docs/scaling.md.

    Args:
        head_dim: channels per attention head ``D`` (even).
        base: RoPE base ``theta`` (``rope_theta``), > 0; default the block's ``rope_theta`` or 10000.
        rotary_dim: channels that rotate (even, ``<= head_dim``); default
            ``int(head_dim * partial_rotary_factor)`` or ``head_dim``.
        scaling: ``None`` or a Hugging Face-style block such as ``{"rope_type": "linear", "factor": 4.0}``
            (the 4.x key ``type`` is accepted too).
        seq_len: current sequence length, for the length-dependent types (``dynamic``, ``longrope``).
            A 0-dim integer tensor reproduces transformers' module, which passes one.
        strict: ``False`` turns value errors in ``scaling`` into warnings.

    Returns:
        :class:`Frequencies` with ``inv_freq`` ``[rotary_dim // 2]`` (fp32) and ``attention_scaling``.

    Raises:
        ConfigError: (a ``ValueError``) for an invalid block; the message says what to change.

    Example:
        >>> f = frequencies(128)
        >>> f.inv_freq.shape, f.attention_scaling
        (torch.Size([64]), 1.0)
        >>> y = frequencies(128, base=10000.0, scaling={"rope_type": "yarn", "factor": 4.0,
        ...                                             "original_max_position_embeddings": 4096})
        >>> round(y.attention_scaling, 4), bool(y.inv_freq[-1] < f.inv_freq[-1])
        (1.1386, True)
    """
    _check_dims(head_dim, rotary_dim)
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(
            f"the scaling block must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {scaling!r}"
        )
    params: dict[str, Any] = dict(scaling or {})
    block_base = params.get("rope_theta")
    if base is None:
        base = 10000.0 if block_base is None else block_base
    elif block_base is not None and block_base != base:
        raise ConfigError(f"base={base} disagrees with the scaling block's rope_theta={block_base}; give only one")
    base = _check_base(base)
    rope_type = params.get("rope_type", params.get("type", "default"))
    spec = ROPE_TYPES.get(rope_type) if isinstance(rope_type, str) else None
    # e.g. proportional keeps every pair (partial_rotary_factor gives the others frequency 0)
    every_pair = spec is not None and spec.rotates_every_pair
    if rotary_dim is None:
        partial = {} if every_pair else params
        rotary_dim = rotary_dim_from(head_dim, partial, strict=strict)
    elif params.get("partial_rotary_factor") not in (None, 1.0, 1) and not every_pair:
        raise ConfigError(
            f"rotary_dim={rotary_dim} and partial_rotary_factor={params['partial_rotary_factor']} both set the "
            "rotated width; give only one"
        )
    params = validate_rope_parameters(params, rotary_dim=rotary_dim, strict=strict)
    params.pop("rope_theta", None)
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](head_dim, base, rotary_dim, params, seq_len)
    inv_freq = inv_freq.to(torch.float32)
    # an odd width (accepted with strict=False) rotates one channel more, as in transformers
    expected = head_dim // 2 if every_pair else (rotary_dim + 1) // 2
    if inv_freq.shape != (expected,):
        raise RuntimeError(
            f"rope_type {rope_type!r} returned inv_freq of shape {tuple(inv_freq.shape)}, expected ({expected},)"
        )
    return Frequencies(
        inv_freq=inv_freq,
        attention_scaling=float(attention_scaling),
        head_dim=head_dim,
        rotary_dim=2 * expected,
        base=base,
        rope_type=rope_type,
        scaling=params,
    )
