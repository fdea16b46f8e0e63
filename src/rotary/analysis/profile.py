"""What a configuration does to each pair: the scaling profile, position precision, and ``inspect``."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..errors import InputError
from ..frequencies import Frequencies, frequencies
from ..rope import RoPE

__all__ = [
    "PairProfile",
    "scaling_profile",
    "PrecisionLimit",
    "precision_limits",
    "Inspection",
    "inspect_rope",
    "jsonable",
]


@dataclass
class PairProfile:
    """How a configuration treats each pair ``i`` against the unscaled default frequencies (lists of ``r/2``).

    ``inv_freq``, ``original_inv_freq``: ``θ_i`` in rad per token, configured and default; ``wavelength``,
    ``original_wavelength``: ``2π / θ_i`` in tokens (``inf``: not rotated); ``factor``: ``original / configured``
    (1 = unchanged); ``kind``: ``"unchanged"``, ``"extrapolated"``, ``"interpolated"`` (the full factor),
    ``"blended"``, ``"raised"`` or ``"not rotated"``; ``ramp``: ``(1 - 1/factor_i) / (1 - 1/F)`` (YaRN's);
    ``full_factor``: ``F``, the largest factor.
    """

    inv_freq: list[float]
    original_inv_freq: list[float]
    wavelength: list[float]
    original_wavelength: list[float]
    factor: list[float]
    kind: list[str]
    ramp: list[float]
    full_factor: float

    def pairs_of(self, kind: str) -> list[int]:
        """Indices of the pairs with ``kind``."""
        return [i for i, k in enumerate(self.kind) if k == kind]


def scaling_profile(freqs: Frequencies, *, rtol: float = 1e-4) -> PairProfile:
    """Classify every pair of ``freqs`` against the unscaled default, for any ``rope_type`` (``rtol``: "the same").

    Example:
        >>> p = scaling_profile(frequencies(8, scaling={"rope_type": "default"}))
        >>> p.kind
        ['unchanged', 'unchanged', 'unchanged', 'unchanged']
    """
    original = frequencies(freqs.head_dim, base=freqs.base, rotary_dim=freqs.rotary_dim).inv_freq.double()
    scaled = freqs.inv_freq.double()
    if scaled.shape != original.shape:
        raise InputError(
            f"inv_freq has {scaled.numel()} pairs but the default for head_dim={freqs.head_dim}, "
            f"rotary_dim={freqs.rotary_dim} has {original.numel()}"
        )
    rotating = scaled > 0
    factor = torch.where(
        rotating, original / scaled.where(rotating, torch.ones_like(scaled)), torch.full_like(scaled, math.inf)
    )
    finite = factor[rotating]
    full = float(finite.max()) if finite.numel() else 1.0
    scaled_at_all = bool(((factor - 1).abs() > rtol)[rotating].any()) or not bool(rotating.all())
    kinds: list[str] = []
    ramp: list[float] = []
    for f, rot in zip(factor.tolist(), rotating.tolist()):
        if not rot:
            kinds.append("not rotated")
            ramp.append(math.nan)
            continue
        r = (1 - 1 / f) / (1 - 1 / full) if full > 1 + rtol else 0.0
        ramp.append(r)
        if abs(f - 1) <= rtol:
            kinds.append("extrapolated" if scaled_at_all and freqs.rope_type != "default" else "unchanged")
        elif f < 1:
            kinds.append("raised")
        elif abs(f - full) <= rtol * full:
            kinds.append("interpolated")
        else:
            kinds.append("blended")
    two_pi = 2 * math.pi
    return PairProfile(
        inv_freq=scaled.tolist(),
        original_inv_freq=original.tolist(),
        wavelength=[two_pi / t if t > 0 else math.inf for t in scaled.tolist()],
        original_wavelength=(two_pi / original).tolist(),
        factor=factor.tolist(),
        kind=kinds,
        ramp=ramp,
        full_factor=full,
    )


# precision -----------------------------------------------------------------------------------
#: explicit mantissa bits of the float formats positions and angles are commonly kept in
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}


@dataclass
class PrecisionLimit:
    """What storing positions / angles in ``dtype`` (a name) does at ``length`` positions.

    ``exact_positions``: every integer below it is exact; ``position_error``: worst rounding of a position, in
    tokens; ``angle_error``: worst rounding of pair 0's angle at ``length - 1``, in rad (rotary uses float64).
    """

    dtype: str
    exact_positions: int
    position_error: float
    angle_error: float


def _half_spacing(x: float, mantissa: int) -> float:
    if x <= 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(x)) - mantissa) / 2


def precision_limits(length: int, inv_freq_0: float = 1.0) -> list[PrecisionLimit]:
    """Position and angle rounding in bf16, fp16 and fp32 for positions ``0 .. length-1``.

    Example:
        >>> [p.exact_positions for p in precision_limits(4096)]
        [256, 2048, 16777216]
    """
    last = max(int(length) - 1, 0)
    out = []
    for name, bits in MANTISSA_BITS.items():
        exact = 2 ** (bits + 1)
        pos_err = 0.0 if last <= exact else _half_spacing(last, bits)
        out.append(PrecisionLimit(name, exact, pos_err, _half_spacing(last * inv_freq_0, bits)))
    return out


# inspect -------------------------------------------------------------------------------------
#: position error (tokens) above which ``inspect`` warns about a dtype's angles
ANGLE_WARN_TOKENS = 1e-3


@dataclass
class Inspection:
    """Everything ``rotary inspect`` prints; ``to_dict()`` is its ``--json``."""

    head_dim: int
    rotary_dim: int
    base: float
    rope_type: str
    scaling: dict[str, Any]
    interleaved: bool
    context: int
    attention_scaling: float
    profile: PairProfile
    turns: list[float]
    precision: list[PrecisionLimit]
    warnings: list[str] = field(default_factory=list)
    #: the sequence length the frequencies were computed for (length-dependent types), else None
    seq_len: int | None = None

    def pairs(self) -> list[dict[str, Any]]:
        p = self.profile
        return [
            {
                "pair": i,
                "inv_freq": p.inv_freq[i],
                "wavelength": p.wavelength[i],
                "turns": self.turns[i],
                "original_wavelength": p.original_wavelength[i],
                "factor": p.factor[i],
                "kind": p.kind[i],
            }
            for i in range(len(p.inv_freq))
        ]

    def to_dict(self) -> dict[str, Any]:
        p = self.profile
        return {
            "head_dim": self.head_dim,
            "rotary_dim": self.rotary_dim,
            "base": self.base,
            "rope_type": self.rope_type,
            "scaling": jsonable(self.scaling),
            "interleaved": self.interleaved,
            "context": self.context,
            "seq_len": self.seq_len,
            "attention_scaling": self.attention_scaling,
            "full_factor": p.full_factor,
            "pairs": jsonable(self.pairs()),
            "interpolated_pairs": p.pairs_of("interpolated"),
            "extrapolated_pairs": p.pairs_of("extrapolated"),
            "blended_pairs": p.pairs_of("blended"),
            "precision": [asdict(x) for x in self.precision],
            "warnings": self.warnings,
        }


def jsonable(obj: Any) -> Any:
    """Replace inf/nan (invalid JSON) by None, recursively."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for j, i in enumerate(indices):
        if start is None:
            start = i
        if j + 1 == len(indices) or indices[j + 1] != i + 1:
            out.append(f"{start}" if start == i else f"{start}-{i}")
            start = None
    return ", ".join(out)


def inspect_rope(rope: RoPE, *, freqs: Frequencies | None = None, context: int | None = None) -> Inspection:
    """Per-pair table, attention scaling and warnings for a RoPE configuration (``rotary inspect``).

    ``freqs``: frequencies to inspect instead of ``rope.freqs`` (dynamic NTK at a length); ``context``: in tokens,
    default ``rope.max_position``.

    Example:
        >>> info = inspect_rope(RoPE(128, max_position=4096))
        >>> round(info.profile.wavelength[0], 4), info.profile.kind[0]
        (6.2832, 'unchanged')
    """
    f = freqs if freqs is not None else rope.freqs
    length = int(context if context is not None else rope.max_position)
    if length <= 0:
        raise InputError(f"context must be a positive number of tokens, got {length}")
    profile = scaling_profile(f)
    turns = [length / w if math.isfinite(w) else 0.0 for w in profile.wavelength]
    info = Inspection(
        head_dim=f.head_dim,
        rotary_dim=f.rotary_dim,
        base=f.base,
        rope_type=f.rope_type,
        scaling=dict(f.scaling),
        interleaved=rope.interleaved,
        context=length,
        attention_scaling=f.attention_scaling,
        profile=profile,
        turns=turns,
        precision=precision_limits(length, float(f.inv_freq.double().max()) if f.inv_freq.numel() else 1.0),
    )
    slow = [i for i, (t, k) in enumerate(zip(turns, profile.kind)) if t < 1 and k != "not rotated"]
    if slow:
        info.warnings.append(
            f"pairs {_ranges(slow)} never complete a turn within the {length}-token context "
            f"(wavelength up to {max(profile.wavelength[i] for i in slow):.0f} tokens): within it they "
            "cover only part of the circle"
        )
    for p in info.precision:
        if p.position_error >= 0.5:
            info.warnings.append(
                f"{p.dtype}: integer positions are exact only below {p.exact_positions}; at {length - 1} adjacent "
                f"positions collide (rounding up to {p.position_error:g} tokens): never keep position_ids in {p.dtype}"
            )
        elif p.angle_error / max(float(f.inv_freq.max()), 1e-30) >= ANGLE_WARN_TOKENS:
            info.warnings.append(
                f"{p.dtype} angles: at position {length - 1} pair 0's angle rounds by up to {p.angle_error:.2g} rad "
                f"({p.angle_error / float(f.inv_freq.max()):.2g} tokens); rotary forms angles in float64"
            )
    return info
