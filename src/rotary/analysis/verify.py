"""Numerical checks of RoPE's defining properties through the fast path."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .. import reference
from .._checks import check_int
from .._limits import check_bytes
from ..errors import InputError
from ..functional import apply_rotary, check_tables
from ..rope import RoPE
from ..tables import cos_sin_table
from ._args import check_rope

__all__ = ["Check", "verify", "verify_axial", "verify_mrope"]


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
    """Check RoPE's defining properties for one configuration through its fast path.

    Norms scaled exactly by ``attention_scaling``; scores depend on ``m - n`` only (from ``offset``); fast ==
    block-diagonal matrix == complex form; tables are rotations for the pairing; fp32 tables agree with float64.

    Example:
        >>> all(c.passed for c in verify(RoPE(16), seq_len=8))
        True
    """
    check_rope(rope, "verify")
    check_int(seq_len, "seq_len", minimum=1)
    # float64 [2, 3, S, S] scores twice, and a dozen [2, 3, S, D] rotations
    check_bytes(
        48.0 * seq_len * (2 * seq_len + 12 * rope.head_dim), f"verify(seq_len={seq_len})", "use a smaller seq_len"
    )
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
    checks = [
        Check(
            "norm preserved (× attention_scaling)",
            float((qr.norm(dim=-1) - s * q.norm(dim=-1)).abs().max()),
            1e-6 * norm,
        )
    ]
    # shifted tables straight from the table function: RoPE's cache would hold every position below
    # the shift (131072 of them for Llama 3.1) to check 64
    inv = rope.freqs.inv_freq
    cos_s, sin_s = cos_sin_table(
        torch.arange(shift, shift + seq_len), inv, attention_scaling=s, interleaved=rope.interleaved
    )
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
    checks.append(
        Check("fp32 cos table == float64 angles", float((half.double() - exact_cos).abs().max()), 2**-24 * max(s, 1.0))
    )
    x = torch.randn(1, 1, seq_len, d, generator=g)  # fp32: the same fp32 tables on both paths
    fn = apply_rotary(x, cos, sin, interleaved=rope.interleaved, validate=False)
    checks.append(Check("apply_rotary(x, cos, sin) == RoPE.rotate", float((fn - rope.rotate(x)).abs().max()), 0.0))
    return checks


def verify_axial(
    rope: Any, *, sizes: tuple[int, ...] | None = None, shift: float = 1000.0, seed: int = 0
) -> list[Check]:
    """Check an N-D RoPE (:class:`rotary.AxialRoPE`, :class:`rotary.RoPEMixed`, in eval mode) through its fast path.

    On a grid of ``sizes`` (default 3 x 4, video 2 x 3 x 4) plus an identity token: norms kept; scores unchanged when
    every token moves by ``shift`` along each axis and all; fast == the N-D matrix; identity tokens unchanged; tables
    are rotations.

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
        # the explicit matrices cost D² per token, axis and head: per-head frequencies (RoPE-Mixed) are
        # compared on four heads spread over the H, the relative property above covers every head
        heads_checked = torch.linspace(0, heads - 1, min(heads, 4)).round().long().unique() if rope.heads else None
        coords = values.masked_fill(identity[:, None], 0.0)
        if heads_checked is None:
            ref, fast = reference.rotate_matrix_nd(q, coords, freq, interleaved=rope.interleaved), qr
        else:
            ref = reference.rotate_matrix_nd(
                q[:, heads_checked], coords, freq[heads_checked], interleaved=rope.interleaved
            )
            fast = qr[:, heads_checked]
        checks.append(
            Check(
                "fast == block-diagonal N-D matrix",
                float((fast - ref).abs().max()),
                1e-12 * max(1.0, float(q.abs().max())),
            )
        )
        checks.append(
            Check("identity tokens not rotated", float((qr[:, :, identity] - q[:, :, identity]).abs().max()), 0.0)
        )
        tables = rope.tables(grid)
        try:
            tables.check(sample=None)
            pairing_err = 0.0
        except ValueError:
            pairing_err = math.inf
        checks.append(
            Check(f"tables match the {'interleaved' if rope.interleaved else 'half'} pairing", pairing_err, 0.0)
        )
    return checks


def verify_mrope(mrope: Any, *, seq_len: int = 64, shift: int = 4096, seed: int = 0) -> list[Check]:
    """Check a multimodal RoPE (:class:`rotary.MRoPE`, XD-RoPE included) through its fast path, on random ids.

    Norms scaled by ``attention_scaling``; scores unchanged when every token moves by ``shift`` along t, h, w and all
    three; fast == the N-D matrix; a step along an axis turns exactly its slots; text ids give 1-D RoPE's tables bit
    for bit; tables are rotations.

    Example:
        >>> from rotary import MRoPE
        >>> all(c.passed for c in verify_mrope(MRoPE(16, mrope_section=[2, 3, 3]), seq_len=8))
        True
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise InputError(f"seq_len must be an int > 0, got {seq_len!r}")
    if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
        raise InputError(f"shift must be an int >= 0, got {shift!r}")
    g = torch.Generator().manual_seed(seed)
    d, s, interleaved = mrope.head_dim, mrope.attention_scaling, mrope.interleaved
    a = getattr(mrope, "num_axes", 3)  # 3 (t, h, w), or HunYuan-VL's four XD-RoPE axes
    names = ("t", "h", "w") if a == 3 else tuple(f"axis {i}" for i in range(a))
    ids = torch.randint(0, seq_len, (a, 2, seq_len), generator=g)
    q = torch.randn(2, 3, seq_len, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, seq_len, d, generator=g, dtype=torch.float64)
    with torch.no_grad():
        qr, kr = mrope(q, k, position_ids=ids)  # float64 tables for float64 inputs
        scores = qr @ kr.transpose(-1, -2)
        norm = float(q.norm(dim=-1).max()) * max(s, 1.0)
        checks = [
            Check(
                "norm preserved (× attention_scaling)",
                float((qr.norm(dim=-1) - s * q.norm(dim=-1)).abs().max()),
                1e-12 * norm,
            )
        ]
        # float64 angles p · f of up to (shift + seq_len) · max f rad, each rounded once (relative 2^-53), and
        # float64 sums over D channels: a score moves by at most a few 2^-53 · (angle + D) · |q| |k|
        largest = (shift + seq_len) * float(mrope.inv_freq.max())
        tol = norm * norm * 2.0**-53 * (8 * largest + 4 * d)
        moves = [(name, (i,)) for i, name in enumerate(names)]
        moves.append((f"{', '.join(names[:-1])} and {names[-1]} at once", tuple(range(a))))
        deltas = ", ".join(f"Δ{n}" if a == 3 else f"Δ{i}" for i, n in enumerate(names))
        for where, axes in moves:
            moved = ids.clone()
            moved[list(axes)] += shift
            qs, ks = mrope(q, k, position_ids=moved)
            err = float((qs @ ks.transpose(-1, -2) - scores).abs().max())
            checks.append(Check(f"scores depend on ({deltas}) only (tokens moved {shift} along {where})", err, tol))
        freq = mrope.inv_freq_axes.double()  # [3, r/2]: slot i's frequency in the row of the axis it reads
        n = min(seq_len, 16)  # the explicit matrices cost D² per token and axis: the first 16 tokens of each row
        ref = torch.stack(
            [
                s * reference.rotate_matrix_nd(q[b, :, :n], ids[:, b, :n].T.double(), freq, interleaved=interleaved)
                for b in range(2)
            ]
        )
        scale = max(1.0, float(q.abs().max())) * max(s, 1.0)
        checks.append(
            Check("fast == block-diagonal N-D matrix", float((qr[:, :, :n] - ref).abs().max()), 1e-12 * scale)
        )
        # the layout: moving one axis by 1 turns exactly the slots mrope_section gives that axis, each by its frequency
        start = mrope.tables(torch.zeros(a, 1, 1, dtype=torch.int64), dtype=torch.float64)
        err = 0.0
        for axis in range(a):
            step = torch.zeros(a, 1, 1, dtype=torch.int64)
            step[axis] = 1
            turned = mrope.tables(step, dtype=torch.float64)
            theta = torch.atan2(turned.sin, turned.cos) - torch.atan2(start.sin, start.cos)  # [1, 1, r]
            per_slot = theta[0, 0, 0::2] if interleaved else theta[0, 0, : mrope.rotary_dim // 2]
            want = torch.where(mrope.axes == axis, mrope.inv_freq.double(), 0.0)
            err = max(err, float((per_slot - want).abs().max()))
        layout = f"{getattr(mrope, 'mrope_layout', 'chunked')} mrope_section {list(mrope.mrope_section)}"
        checks.append(Check(f"each slot turns with its own axis only ({layout})", err, 1e-12))
        text = ids[0]  # [B, S]: text tokens have t = h = w
        m_cos, m_sin = mrope.tables(text.expand(a, -1, -1)).gather()
        r_cos, r_sin = cos_sin_table(text, mrope.inv_freq, attention_scaling=s, interleaved=interleaved)
        err = max(float((m_cos - r_cos).abs().max()), float((m_sin - r_sin).abs().max()))
        checks.append(Check("text ids (t = h = w) give the 1-D RoPE's tables", err, 0.0))
        tables = mrope.tables(ids)  # fp32
        cos, sin = tables.gather()
        theta = torch.einsum("bsa,aj->bsj", ids.permute(1, 2, 0).double(), freq)
        half = cos[..., 0::2] if interleaved else cos[..., : mrope.rotary_dim // 2]
        checks.append(
            Check(
                "fp32 cos table == float64 angles",
                float((half.double() - s * theta.cos()).abs().max()),
                2**-24 * max(s, 1.0),
            )
        )
        try:
            check_tables(cos, sin, interleaved=interleaved)
            pairing_err = 0.0
        except ValueError:
            pairing_err = math.inf
        checks.append(Check(f"tables match the {'interleaved' if interleaved else 'half'} pairing", pairing_err, 0.0))
    return checks
