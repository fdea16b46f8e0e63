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

from .config import ConfigError, rotary_dim_from, validate_rope_parameters

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


@register_rope_type("linear")
def _linear(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: int | None):
    # Position interpolation (Chen et al. 2023): position m becomes m / factor; dividing inv_freq instead
    # gives the same angles and keeps positions integer.
    return default_inv_freq(base, rotary_dim) / params["factor"], 1.0


def _ntk_base(base: Any, alpha: Any, rotary_dim: int) -> Any:
    # NTK-aware scaling: raising the base by alpha ** (d / (d - 2)) divides the lowest frequency by
    # exactly alpha and leaves the highest (pair 0) untouched.
    return base * alpha ** (rotary_dim / (rotary_dim - 2))


@register_rope_type("ntk")
def _ntk(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: int | None):
    return default_inv_freq(_ntk_base(base, params["factor"], rotary_dim), rotary_dim), 1.0


@register_rope_type("dynamic")
def _dynamic(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Dynamic NTK: alpha grows with the current length, factor * L / L_train - (factor - 1), and is 1 up to
    # L_train. transformers' module passes seq_len as a 0-dim int64 tensor (max(position_ids) + 1), which
    # makes the base an fp32 tensor; a Python int keeps it in float64. Both are reproduced bit for bit.
    trained = params["max_position_embeddings"]
    factor = params["factor"]
    if seq_len is None:
        seq_len = trained
    elif isinstance(seq_len, torch.Tensor):
        seq_len = torch.maximum(seq_len, torch.tensor(trained, dtype=seq_len.dtype, device=seq_len.device))
    else:
        seq_len = max(seq_len, trained)
    alpha = (factor * seq_len / trained) - (factor - 1)
    return default_inv_freq(_ntk_base(base, alpha, rotary_dim), rotary_dim), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22)
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_pair_index(rotations: float, rotary_dim: int, base: float, trained: int) -> float:
    # The (fractional) pair index whose wavelength fits `rotations` times into the trained context.
    return (rotary_dim * math.log(trained / (rotations * 2 * math.pi))) / (2 * math.log(base))


@register_rope_type("yarn")
def _yarn(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: int | None):
    trained = params["original_max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:  # DeepSeek-style configs: the ratio of the two context lengths
        factor = params["max_position_embeddings"] / trained
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    # Pairs below `low` turn more than beta_fast times over the trained context: keep them (extrapolate).
    # Pairs above `high` turn less than beta_slow times: interpolate them by `factor`. A linear ramp between.
    low = _yarn_pair_index(beta_fast, rotary_dim, base, trained)
    high = _yarn_pair_index(beta_slow, rotary_dim, base, trained)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp

    # the operation order below is transformers' own, so inv_freq is bit-identical
    powers = base ** (torch.arange(0, rotary_dim, 2).to(dtype=torch.float) / rotary_dim)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, attention_factor


@register_rope_type("longrope")
def _longrope(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    trained = params["original_max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:  # Phi-3 states the two context lengths instead
        factor = params["max_position_embeddings"] / trained
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(trained))
    # one searched rescale factor per pair; the long set once the sequence outgrows the trained context
    use_long = bool(seq_len is not None and seq_len > trained)
    rescale = torch.tensor(params["long_factor" if use_long else "short_factor"], dtype=torch.float32)
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    return 1.0 / (rescale * base**exponent), attention_factor


@register_rope_type("llama3")
def _llama3(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: int | None):
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


@register_rope_type("proportional")
def _proportional(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: int | None):
    # Gemma-style: the first partial_rotary_factor of the pairs rotate with exponents over the whole
    # head_dim (not over the rotated width), the remaining pairs get frequency 0 (they never turn).
    fraction = params.get("partial_rotary_factor", 1.0)
    fraction = 1.0 if fraction is None else fraction
    rotating = int(fraction * head_dim // 2)
    exponent = torch.arange(0, 2 * rotating, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (base**exponent)
    still = head_dim // 2 - rotating
    if still > 0:
        inv_freq = torch.cat((inv_freq, torch.zeros(still, dtype=torch.float32)))
    return inv_freq / params.get("factor", 1.0), 1.0


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
    if rotary_dim is None:
        # proportional keeps every pair (the non-rotating ones get frequency 0)
        partial = {} if rope_type == "proportional" else params
        rotary_dim = rotary_dim_from(head_dim, partial, strict=strict)
    elif params.get("partial_rotary_factor") not in (None, 1.0, 1) and rope_type != "proportional":
        raise ConfigError(
            f"rotary_dim={rotary_dim} and partial_rotary_factor={params['partial_rotary_factor']} both set the "
            "rotated width; give only one"
        )
    params = validate_rope_parameters(params, rotary_dim=rotary_dim, valid_types=ROPE_INIT_FUNCTIONS, strict=strict)
    params.pop("rope_theta", None)
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](head_dim, base, rotary_dim, params, seq_len)
    inv_freq = inv_freq.to(torch.float32)
    # an odd width (accepted with strict=False) rotates one channel more, as in transformers
    expected = head_dim // 2 if rope_type == "proportional" else (rotary_dim + 1) // 2
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
