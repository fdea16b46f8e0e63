"""Numerical checks of RoPE's defining properties through the fast path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .. import reference
from .._checks import check_int
from .._limits import check_bytes
from ..apply import apply_rotary, check_tables
from ..module import RoPE
from ..tables import cos_sin_table
from ._args import check_rope

__all__ = ["Check", "verify", "verify_axial"]


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
    check_rope(rope, "verify")
    check_int(seq_len, "seq_len", minimum=1)
    # float64 [2, 3, S, S] scores twice, and a dozen [2, 3, S, D] rotations
    check_bytes(48.0 * seq_len * (2 * seq_len + 12 * rope.head_dim), f"verify(seq_len={seq_len})", "use a smaller seq_len")
    shift = 4096 if offset is None else check_int(offset, "offset", minimum=0)
    check_int(seed, "seed")
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
    x = torch.randn(1, 1, seq_len, d, generator=g)  # fp32: the same fp32 tables on both paths
    fn = apply_rotary(x, cos, sin, interleaved=rope.interleaved, validate=False)
    checks.append(Check("apply_rotary(x, cos, sin) == RoPE.rotate", float((fn - rope.rotate(x)).abs().max()), 0.0))
    return checks


def verify_axial(rope: Any, *, sizes: tuple[int, ...] | None = None, shift: float = 1000.0, seed: int = 0) -> list[Check]:
    """Check an N-D RoPE (:class:`rotary.AxialRoPE`, :class:`rotary.RoPEMixed`) through its fast path.

    Checks, on a small grid plus one identity token: norms preserved; the N-D relative property per
    axis (every token moved by ``shift`` coordinate units along one axis, then along all axes at
    once, keeps every score: scores depend only on the offsets (Δt, Δh, Δw)); fast == the
    block-diagonal N-D matrix (:func:`rotary.reference.rotate_matrix_nd`); identity tokens
    unchanged; the tables are rotations laid out for the module's pairing.

    Args:
        rope: the module (evaluated in eval mode: no coordinate augmentation).
        sizes: the grid, one size per axis (default 3 x 4 for images, 2 x 3 x 4 for video).
        shift: how far the tokens are moved.
        seed: of the random q, k.

    Example:
        >>> from rotary import AxialRoPE
        >>> all(c.passed for c in verify_axial(AxialRoPE.preset("dinov3", 16)))
        True
    """
    sizes = sizes if sizes is not None else (2, 3, 4, 5)[-rope.axes :] if rope.axes <= 4 else (2,) * rope.axes
    training = rope.training
    rope.eval()
    try:
        return _verify_axial(rope, sizes, float(shift), seed)
    finally:
        rope.train(training)


def _verify_axial(rope: Any, sizes: tuple[int, ...], shift: float, seed: int) -> list[Check]:
    g = torch.Generator().manual_seed(seed)
    grid = rope.grid(*sizes, prefix=1, suffix=0)  # one identity token (CLS) first
    values, identity = grid.values, grid.identity
    heads = rope.heads or 3
    d = rope.head_dim
    q = torch.randn(2, heads, values.shape[0], d, generator=g, dtype=torch.float64)
    k = torch.randn(2, heads, values.shape[0], d, generator=g, dtype=torch.float64)
    with torch.no_grad():
        qr, kr = rope(q, k, grid)
        scores = qr @ kr.transpose(-1, -2)
        norm = float(q.norm(dim=-1).max())
        tol = 1e-12 * norm * norm * max(1.0, shift)  # float64 tables: angles of up to ~shift rad, rounded once
        checks = [Check("norm preserved", float((qr.norm(dim=-1) - q.norm(dim=-1)).abs().max()), 1e-12 * norm)]
        names = ["t", "h", "w"][-rope.axes :] if rope.axes <= 3 else [f"axis {a}" for a in range(rope.axes)]
        moves = [torch.zeros(rope.axes, dtype=torch.float64) for _ in range(rope.axes)]
        for a, move in enumerate(moves):
            move[a] = shift
        moves.append(torch.full((rope.axes,), shift, dtype=torch.float64))
        for a, move in enumerate(moves):
            where = f"along {names[a]}" if a < rope.axes else "along every axis"
            moved = rope.coordinates(values + move, identity=identity)
            qs, ks = rope(q, k, moved)
            # among the tokens on the grid (the identity token stays put, unrotated)
            diff = (qs @ ks.transpose(-1, -2) - scores)[:, :, ~identity][:, :, :, ~identity]
            err = float(diff.abs().max())
            checks.append(Check(f"scores depend on the offsets only (tokens moved {shift:g} {where})", err, tol))
        freq = rope.frequencies().detach()
        ref = reference.rotate_matrix_nd(q, values.masked_fill(identity[:, None], 0.0), freq, interleaved=rope.interleaved)
        checks.append(Check("fast == block-diagonal N-D matrix", float((qr - ref).abs().max()), 1e-12 * max(1.0, float(q.abs().max()))))
        checks.append(Check("identity tokens not rotated", float((qr[:, :, identity] - q[:, :, identity]).abs().max()), 0.0))
        tables = rope.tables(grid)
        try:
            tables.check(sample=None)
            pairing_err = 0.0
        except ValueError:
            pairing_err = math.inf
        checks.append(Check(f"tables match the {'interleaved' if rope.interleaved else 'half'} pairing", pairing_err, 0.0))
    return checks
