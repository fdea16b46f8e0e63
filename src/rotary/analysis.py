"""The numbers behind every figure and report: decay bound, wavelengths, per-pair scaling profile,
position-precision limits, attention scores, a PCA of the position tables, and verification checks.

Everything here returns plain tensors, dataclasses or dicts (JSON-ready through ``to_dict``); the
figures in :mod:`rotary.plots` only draw what these functions compute, so tests can assert the
numbers without looking at pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from . import reference
from .apply import apply_rotary, check_tables
from .frequencies import Frequencies, frequencies
from .module import RoPE
from .tables import angles, cos_sin_table

__all__ = [
    "decay_bound",
    "measured_decay",
    "PairProfile",
    "scaling_profile",
    "PrecisionLimit",
    "precision_limits",
    "Inspection",
    "inspect_rope",
    "score_matrix",
    "position_pca",
    "Check",
    "verify",
    "jsonable",
]


# decay ---------------------------------------------------------------------------------------
def decay_bound(head_dim: int = 128, base: float = 10000.0, distances: Sequence[int] | None = None) -> torch.Tensor:
    """Seed 001's long-range decay bound: ``(1 / (d/2)) Σ_j |S_j|`` against relative distance.

    Abel summation bounds ``|Σ_i q_i k_i* e^{i m θ_i}|`` by ``max_i |h_{i+1} - h_i| · Σ_j |S_j|`` with
    ``S_j = Σ_{i<j} e^{i m θ_i}`` and ``θ_i = base^(-2i/d)``; the mean of ``|S_j|`` over ``j = 1..d/2``
    is the curve in the RoFormer blog post. At distance 0 every ``|S_j| = j``, so the value is
    ``(d/2 + 1) / 2`` (32.5 for d = 128). Angles are float64.

    Args:
        head_dim: ``d`` (even).
        base: RoPE base.
        distances: relative distances ``m``; default ``0..256``.

    Returns:
        float64 ``[len(distances)]``.

    Example:
        >>> float(decay_bound(128, distances=[0])[0])
        32.5
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got head_dim={head_dim}")
    if not base > 0:
        raise ValueError(f"base must be > 0, got base={base}")
    m = torch.arange(257, dtype=torch.float64) if distances is None else torch.as_tensor(distances, dtype=torch.float64)
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [d/2]
    angle = m[:, None] * theta[None, :]
    partial = torch.cumsum(torch.polar(torch.ones_like(angle), angle), dim=-1)  # S_1 .. S_{d/2}
    return partial.abs().mean(dim=-1)


def measured_decay(rope: RoPE, distances: Sequence[int], *, kind: str = "random", samples: int = 256, seed: int = 0) -> torch.Tensor:
    """Mean ``|⟨R_m q, R_n k⟩|`` over samples, for each relative distance ``m - n``.

    The score is taken between vectors actually rotated by ``rope`` (q at position ``m = distance``,
    k at position ``n = 0``), not read off the cos/sin tables.

    Args:
        rope: the RoPE to measure.
        distances: non-negative relative distances.
        kind: ``"random"`` (q, k ~ N(0, I), ``samples`` pairs) or ``"ones"`` (q = k = all ones).
        samples: number of random (q, k) pairs.

    Returns:
        float64 ``[len(distances)]``.

    Example:
        >>> measured_decay(RoPE(8), [0], kind="ones").tolist()  # ⟨1, 1⟩ = 8 at distance 0
        [8.0]
    """
    if kind not in ("random", "ones"):
        raise ValueError(f"kind must be 'random' or 'ones', got {kind!r}")
    dist = torch.as_tensor(list(distances), dtype=torch.int64)
    if dist.numel() == 0 or int(dist.min()) < 0:
        raise ValueError("distances must be a non-empty sequence of ints >= 0")
    d = rope.head_dim
    if kind == "ones":
        q = k = torch.ones(1, 1, 1, d, dtype=torch.float64)
    else:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(samples, 1, 1, d, generator=g, dtype=torch.float64)
        k = torch.randn(samples, 1, 1, d, generator=g, dtype=torch.float64)
    n = q.shape[0]
    qm = rope.rotate(q.expand(n, 1, dist.numel(), d).contiguous(), position_ids=dist)
    k0 = rope.rotate(k, position_ids=torch.zeros(1, dtype=torch.int64))
    return (qm * k0).sum(-1).abs().mean(dim=(0, 1))


# per-pair profile ----------------------------------------------------------------------------
@dataclass
class PairProfile:
    """How a configuration treats each pair, relative to the unscaled default frequencies.

    All lists have one entry per pair ``i`` (``rotary_dim // 2`` entries).

    Attributes:
        inv_freq: the configured ``θ_i`` (rad per token).
        original_inv_freq: ``θ_i`` of ``rope_type="default"`` with the same head_dim, base, rotary_dim.
        wavelength: ``2π / θ_i`` in tokens (``inf`` for a pair that does not rotate).
        original_wavelength: the same for the default frequencies.
        factor: ``original_inv_freq / inv_freq``, how much the pair was slowed (1 = unchanged).
        kind: ``"unchanged"`` (no scaling at all), ``"extrapolated"`` (factor 1 under a scaling
            method: the pair sees positions beyond its training range), ``"interpolated"`` (slowed by
            the method's full factor), ``"blended"`` (in between), ``"raised"`` (sped up) or
            ``"not rotated"`` (θ = 0).
        ramp: interpolation fraction ``(1 - 1/factor_i) / (1 - 1/F)`` with ``F`` the largest factor
            applied: 0 = original frequency, 1 = fully interpolated. For YaRN this is its linear
            ramp; for Llama 3 its smooth factor's complement.
        full_factor: ``F``.
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
    """Classify every pair of ``freqs`` against the unscaled default, for any ``rope_type``.

    Args:
        freqs: the configured frequencies.
        rtol: relative tolerance for "same as the original" and "scaled by the full factor"
            (fp32 ``inv_freq`` computed along different paths differ by ~1e-7).

    Example:
        >>> p = scaling_profile(frequencies(8, scaling={"rope_type": "default"}))
        >>> p.kind
        ['unchanged', 'unchanged', 'unchanged', 'unchanged']
    """
    original = frequencies(freqs.head_dim, base=freqs.base, rotary_dim=freqs.rotary_dim).inv_freq.double()
    scaled = freqs.inv_freq.double()
    if scaled.shape != original.shape:
        raise ValueError(
            f"inv_freq has {scaled.numel()} pairs but the default for head_dim={freqs.head_dim}, "
            f"rotary_dim={freqs.rotary_dim} has {original.numel()}"
        )
    rotating = scaled > 0
    factor = torch.where(rotating, original / scaled.where(rotating, torch.ones_like(scaled)), torch.full_like(scaled, math.inf))
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
    """What storing positions / angles in ``dtype`` does at ``length`` positions.

    Attributes:
        dtype: format name.
        exact_positions: every integer position below this is exact (``2^(mantissa + 1)``).
        position_error: worst rounding of a position ``< length`` in tokens (half the spacing at
            ``length - 1``; 0 while positions are exact).
        angle_error: worst rounding, in rad, of pair 0's angle ``position · θ_0`` at ``length - 1``
            (what forming angles in this dtype costs; rotary forms them in float64).
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
    """Per-pair table, attention scaling and warnings for a RoPE configuration.

    Args:
        rope: the configuration (its pairing is reported too).
        freqs: frequencies to inspect instead of ``rope.freqs`` (e.g. dynamic NTK at a given length).
        context: context length in tokens (a config's ``max_position_embeddings``); default
            ``rope.max_position``.

    Example:
        >>> info = inspect_rope(RoPE(128, max_position=4096))
        >>> round(info.profile.wavelength[0], 4), info.profile.kind[0]
        (6.2832, 'unchanged')
    """
    f = freqs if freqs is not None else rope.freqs
    length = int(context if context is not None else rope.max_position)
    if length <= 0:
        raise ValueError(f"context must be a positive number of tokens, got {length}")
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


# scores and positions -----------------------------------------------------------------------
def score_matrix(rope: RoPE, q: torch.Tensor, k: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Attention logits ``⟨R_m q, R_n k⟩`` for query positions ``m`` and key positions ``n``.

    The same content vectors ``q``, ``k`` (``[D]``) are placed at every position and rotated by
    ``rope``; the logits therefore depend on ``m - n`` only (the relative property).

    Returns:
        float64 ``[seq_len, seq_len]`` (rows: query position, columns: key position).

    Example:
        >>> s = score_matrix(RoPE(8), torch.ones(8), torch.ones(8), 4)
        >>> bool(torch.allclose(s[1, 0], s[3, 2]))
        True
    """
    d = rope.head_dim
    for name, v in (("q", q), ("k", k)):
        if not isinstance(v, torch.Tensor) or v.shape != (d,):
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"{name} must be a vector of shape [{d}] (head_dim), got {shape}")
    if seq_len <= 0:
        raise ValueError(f"seq_len must be > 0, got {seq_len}")
    qq = q.double().expand(1, 1, seq_len, d).contiguous()
    kk = k.double().expand(1, 1, seq_len, d).contiguous()
    qr, kr = rope(qq, kk)
    return (qr[0, 0] @ kr[0, 0].T).double()


def position_pca(rope: RoPE, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D PCA of the position tables (each position's ``[cos θ_i m, sin θ_i m]`` over all pairs).

    PCA (a linear projection) keeps distances meaningful, unlike the t-SNE of the seeds. The
    features are float64 ``cos``/``sin`` of the angles, one of each per pair (no attention scaling).

    Returns:
        ``(coords [seq_len, 2], explained_variance_ratio [2])``, float64.

    Example:
        >>> coords, explained = position_pca(RoPE(16), 32)
        >>> coords.shape, bool(explained.sum() <= 1)
        (torch.Size([32, 2]), True)
    """
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 for a 2-D PCA, got {seq_len}")
    theta = angles(torch.arange(seq_len), rope.freqs.inv_freq)  # float64 [S, r/2]
    x = torch.cat((theta.cos(), theta.sin()), dim=-1)
    x = x - x.mean(dim=0)
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    var = s**2
    return u[:, :2] * s[:2], var[:2] / var.sum()


# verification --------------------------------------------------------------------------------
@dataclass
class Check:
    """One verification check: ``passed`` is ``worst_error <= tolerance``."""

    name: str
    worst_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.worst_error <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "worst_error": self.worst_error, "tolerance": self.tolerance, "passed": self.passed}


def verify(rope: RoPE, *, seq_len: int = 64, offset: int | None = None, seed: int = 0) -> list[Check]:
    """Check RoPE's defining properties for one configuration, through its fast path.

    Checks: norms scaled exactly by ``attention_scaling``; scores depend on ``m - n`` only (the
    same vectors at positions ``offset ..``, default 4096, e.g. the end of the context); fast == block-diagonal matrix ==
    complex form (the references, times ``attention_scaling``); the cos/sin tables match the
    module's pairing and are rotations; the fp32 tables agree with float64 angles.

    Example:
        >>> all(c.passed for c in verify(RoPE(16), seq_len=8))
        True
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be > 0, got {seq_len}")
    shift = 4096 if offset is None else int(offset)
    if shift < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    g = torch.Generator().manual_seed(seed)
    d, s = rope.head_dim, rope.attention_scaling
    q = torch.randn(2, 3, seq_len, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, seq_len, d, generator=g, dtype=torch.float64)
    pos = torch.arange(seq_len)
    qr, kr = rope(q, k)
    # tolerances: fp32 tables carry a relative rounding of at most 2^-24 per entry, so a rotated
    # entry is off by <= 2 · 2^-24 · max|x| and a logit by a few 2^-24 · |q| |k|
    scale = max(1.0, float(q.abs().max())) * max(s, 1.0)
    norm = float(q.norm(dim=-1).max()) * max(s, 1.0)
    checks = [Check("norm preserved (× attention_scaling)", float((qr.norm(dim=-1) - s * q.norm(dim=-1)).abs().max()), 1e-6 * norm)]
    # shifted tables straight from the table function: RoPE's cache would hold every position below
    # the shift (131072 of them for Llama 3.1) to check 64
    inv = rope.freqs.inv_freq
    cos_s, sin_s = cos_sin_table(torch.arange(shift, shift + seq_len), inv, attention_scaling=s, interleaved=rope.interleaved)
    qs = apply_rotary(q, cos_s, sin_s, interleaved=rope.interleaved)
    ks = apply_rotary(k, cos_s, sin_s, interleaved=rope.interleaved)
    s0 = qr @ kr.transpose(-1, -2)
    s1 = qs @ ks.transpose(-1, -2)
    checks.append(Check(f"scores depend on m - n only (shift {shift})", float((s0 - s1).abs().max()), 1e-6 * norm**2))
    ref_m = s * reference.rotate_matrix(q, pos, inv, interleaved=rope.interleaved)
    ref_c = s * reference.rotate_complex(q, pos, inv, interleaved=rope.interleaved)
    checks.append(Check("fast == block-diagonal matrix", float((qr - ref_m).abs().max()), 5e-7 * scale))
    checks.append(Check("fast == complex form", float((qr - ref_c).abs().max()), 5e-7 * scale))
    checks.append(Check("matrix == complex form", float((ref_m - ref_c).abs().max()), 1e-12 * scale))
    cos, sin = rope.cos_sin(pos)
    try:
        check_tables(cos, sin, interleaved=rope.interleaved)
        pairing_err = 0.0
    except ValueError:
        pairing_err = math.inf
    checks.append(Check(f"tables match the {'interleaved' if rope.interleaved else 'half'} pairing", pairing_err, 0.0))
    theta = pos.double()[:, None] * inv.double()[None, :]
    exact_cos = s * theta.cos()
    half = cos[:, 0::2] if rope.interleaved else cos[:, : rope.rotary_dim // 2]
    checks.append(Check("fp32 cos table == float64 angles", float((half.double() - exact_cos).abs().max()), 2**-24 * max(s, 1.0)))
    x = torch.randn(1, 1, seq_len, d, generator=g, dtype=torch.float64)
    fn = apply_rotary(x, cos, sin, interleaved=rope.interleaved)
    checks.append(Check("apply_rotary(x, cos, sin) == RoPE.rotate", float((fn - rope.rotate(x)).abs().max()), 0.0))
    return checks
