"""Rotation frequencies: :class:`Frequencies` (``inv_freq`` and ``attention_scaling``) of a configuration; the
``rope_type`` registry and the built-in types live in :mod:`rotary.rope_types`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ._checks import MAX_HEAD_DIM, check_bool, check_positive_int, is_int
from .errors import InputError, InputTypeError
from .rope_types import (
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    ConfigError,
    default_inv_freq,
    proportional_pairs,
    register_rope_type,
    rotary_dim_from,
    validate_rope_parameters,
)

__all__ = [
    "Frequencies",
    "FrozenBlock",
    "frequencies",
    "default_inv_freq",
    "ROPE_INIT_FUNCTIONS",
    "ROPE_TYPES",
    "register_rope_type",
]


class FrozenBlock(dict):
    """A read-only deep copy of the scaling block a :class:`Frequencies` was computed from (lists become tuples).

    It compares equal to the dict and serialises as it; ``dict(block)`` is an editable copy.

    Example:
        >>> b = FrozenBlock.of({"rope_type": "longrope", "short_factor": [1.0, 1.5]})
        >>> b["short_factor"]
        (1.0, 1.5)
        >>> b["rope_type"] = "yarn"
        Traceback (most recent call last):
        ...
        rotary.errors.InputTypeError: FrozenBlock is read-only; edit a copy (dict(block)) and compute new frequencies
    """

    __slots__ = ()

    @classmethod
    def of(cls, block: Mapping[str, Any]) -> FrozenBlock:
        """A frozen deep copy of ``block``."""
        return cls({key: _frozen(value) for key, value in block.items()})

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise InputTypeError(
            f"{type(self).__name__} is read-only; edit a copy (dict(block)) and compute new frequencies"
        )

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:  # pickle / copy rebuild from a plain dict, not item by item
        return (type(self), (dict(self),))

    def __copy__(self) -> FrozenBlock:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenBlock:
        return self


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenBlock.of(value)
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return copy.deepcopy(value)


@dataclass(frozen=True)
class Frequencies:
    """The frequencies of one RoPE configuration.

    Attributes:
        inv_freq: fp32 ``[rotary_dim // 2]``; pair ``i`` turns by ``position * inv_freq[i]``.
        attention_scaling: factor multiplied into cos and sin (1.0 except for YaRN / LongRoPE).
        head_dim, rotary_dim: ``D``; channels rotated ``r`` (even, ``<= D``), the rest pass through.
        base, rope_type, scaling: ``theta``; the type's name in :data:`ROPE_INIT_FUNCTIONS`; the :class:`FrozenBlock`.
    """

    inv_freq: torch.Tensor
    attention_scaling: float
    head_dim: int
    rotary_dim: int
    base: float
    rope_type: str = "default"
    scaling: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.scaling, FrozenBlock):
            object.__setattr__(self, "scaling", FrozenBlock.of(self.scaling))

    @property
    def wavelengths(self) -> torch.Tensor:
        """``2π / inv_freq`` in tokens, float64 ``[rotary_dim // 2]`` (``inf`` for frequency 0)."""
        return (2 * math.pi) / self.inv_freq.double()


def _check_dims(head_dim: int, rotary_dim: int | None) -> int:
    check_positive_int(head_dim, "head_dim")
    if head_dim > MAX_HEAD_DIM:
        raise InputError(f"head_dim={head_dim} is wider than any attention head (at most {MAX_HEAD_DIM} channels here)")
    if head_dim % 2:
        raise InputError(f"head_dim must be even (channels rotate in pairs), got head_dim={head_dim}")
    if rotary_dim is None:
        return head_dim
    check_positive_int(rotary_dim, "rotary_dim")
    if rotary_dim % 2:
        raise InputError(f"rotary_dim must be even (channels rotate in pairs), got rotary_dim={rotary_dim}")
    if rotary_dim > head_dim:
        raise InputError(f"rotary_dim={rotary_dim} exceeds head_dim={head_dim}; use rotary_dim <= head_dim")
    return rotary_dim


def _check_base(base: float) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not math.isfinite(base) or base <= 0:
        raise InputError(f"base must be a finite number > 0, got base={base!r}")
    if base <= 1:
        # pair 0 always turns at 1 rad/token; base ** (-2i/d) must fall from there (YaRN also divides by ln(base))
        raise ConfigError(
            f"base={base!r} must be > 1: the frequencies base ** (-2i/d) fall from 1 rad/token only for a base above 1 "
            "(models use 10000 to 1e7)"
        )
    return float(base)


def _check_seq_len(seq_len: Any) -> None:
    if seq_len is None or (is_int(seq_len) and seq_len >= 0):
        return
    if (
        isinstance(seq_len, torch.Tensor)
        and seq_len.numel() == 1
        and not (seq_len.is_floating_point() or seq_len.is_complex() or seq_len.dtype == torch.bool)
    ):
        return
    raise InputTypeError(f"seq_len must be None, an int >= 0 or a one-element integer tensor, got {seq_len!r}")


def _compute(rope_type: str, head_dim: int, base: float, rotary_dim: int, params: dict[str, Any], seq_len: Any):
    """Run the init function; arithmetic failures inside it are reported as the block's fault."""
    try:
        inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](head_dim, base, rotary_dim, params, seq_len)
    except ConfigError:
        raise
    except (ArithmeticError, ValueError) as exc:  # ZeroDivisionError, OverflowError, "math domain error"
        block = ", ".join(
            f"{k}={v}" for k, v in params.items() if k != "rope_type" and not isinstance(v, (list, tuple))
        )
        raise ConfigError(
            f"rope_type {rope_type!r} cannot compute frequencies for base={base:g}, rotary_dim={rotary_dim}"
            f"{', ' + block if block else ''} ({type(exc).__name__}: {exc}); a parameter is out of range"
        ) from None
    if not isinstance(inv_freq, torch.Tensor):
        raise InputTypeError(
            f"rope_type {rope_type!r} returned inv_freq of type {type(inv_freq).__name__}, not a tensor"
        )
    return inv_freq.to(torch.float32), attention_scaling


def _check_result(
    rope_type: str,
    inv_freq: torch.Tensor,
    attention_scaling: Any,
    turning: int,
    base: float,
    params: Mapping[str, Any],
    seq_len: Any = None,
) -> None:
    """Frequencies finite, the first ``turning`` pairs turning, the scaling finite and > 0."""
    block = ", ".join(f"{k}={v}" for k, v in params.items() if k != "rope_type" and not isinstance(v, (list, tuple)))
    at = "" if seq_len is None else f" at sequence length {seq_len}"
    where = f"rope_type {rope_type!r} (base={base:g}{', ' + block if block else ''}){at}"

    def per_pair(pairs: list[int]) -> str:  # the entries of per-pair lists (LongRoPE's factors) at those pairs
        lists = [(k, v) for k, v in params.items() if isinstance(v, (list, tuple)) and len(v) == len(inv_freq)]
        return "".join(f"; {k}[{i}]={v[i]}" for k, v in lists for i in pairs[:2])

    bad = (~torch.isfinite(inv_freq)).nonzero().flatten().tolist()
    if bad:
        raise ConfigError(
            f"{where} gives non-finite frequencies for pairs {bad[:8]}{per_pair(bad)}; a parameter is out of range"
        )
    still = (inv_freq[:turning] <= 0).nonzero().flatten().tolist()
    if still:
        raise ConfigError(
            f"{where} gives frequency {float(inv_freq[still[0]]):g} (in float32) to pairs {still[:8]}"
            f"{' ...' if len(still) > 8 else ''}{per_pair(still)}: they would not rotate; a parameter is out of range "
            "(a base above ~1e38 or a factor large enough to underflow)"
        )
    if not (
        isinstance(attention_scaling, (int, float))
        and 0 < attention_scaling <= torch.finfo(torch.float32).max  # it multiplies the float32 tables
    ):
        raise ConfigError(
            f"{where} gives attention scaling {attention_scaling!r}; it must be a number > 0 that float32 tables can "
            "hold"
        )


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

    ``scaling`` uses Hugging Face's names and defaults (transformers 5.23); each type's parameters are in
    docs/scaling.md. Any block may carry ``rope_theta`` and ``partial_rotary_factor``.

    Args:
        head_dim: channels per attention head ``D`` (even).
        base: RoPE base ``theta`` (``rope_theta``), > 1; default the block's ``rope_theta`` or 10000.
        rotary_dim: channels that rotate (even, ``<= head_dim``); default ``int(head_dim * partial_rotary_factor)``.
        scaling: ``None`` or a block such as ``{"rope_type": "linear", "factor": 4.0}`` (4.x ``type`` too).
        seq_len: current length, for ``dynamic`` and ``longrope`` (a 0-dim tensor, as transformers passes).
        strict: ``False`` turns value errors in ``scaling`` into warnings.

    Raises ``ConfigError`` (a ``ValueError``) for an invalid block, saying what to change.

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
    check_bool(strict, "strict")
    _check_seq_len(seq_len)
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ConfigError(
            f"the scaling block must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {scaling!r}"
        )
    params: dict[str, Any] = copy.deepcopy(dict(scaling or {}))  # nothing the caller edits later reaches us
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
    rope_type = params["rope_type"]
    spec = ROPE_TYPES[rope_type]
    inv_freq, attention_scaling = _compute(rope_type, head_dim, base, rotary_dim, params, seq_len)
    # an odd width (accepted with strict=False) rotates one channel more, as in transformers
    expected = head_dim // 2 if every_pair else (rotary_dim + 1) // 2
    if inv_freq.shape != (expected,):
        raise RuntimeError(
            f"rope_type {rope_type!r} returned inv_freq of shape {tuple(inv_freq.shape)}, expected ({expected},)"
        )
    turning = proportional_pairs(head_dim, params) if every_pair else expected
    _check_result(rope_type, inv_freq, attention_scaling, turning, base, params)
    if spec.length_dependent and spec.target_length is not None and seq_len is None:
        # frequencies that only overflow at long lengths (dynamic NTK's growing base, LongRoPE's long
        # factors) are refused now, not at the first long call
        longest = spec.target_length(params)
        at_target, scaling_at_target = _compute(rope_type, head_dim, base, rotary_dim, params, longest)
        _check_result(rope_type, at_target, scaling_at_target, turning, base, params, longest)
    return Frequencies(
        inv_freq=inv_freq,
        attention_scaling=float(attention_scaling),
        head_dim=head_dim,
        rotary_dim=2 * expected,
        base=base,
        rope_type=rope_type,
        scaling=FrozenBlock.of(params),
    )
