"""The numbers behind the figures of the text variants: M-RoPE's slot layout, xPos's decay, p-RoPE's
frequencies and Llama 4's NoPE temperature (drawn by :mod:`rotary.tools.plots`, documented in docs/variants.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..rope import RoPE
from ..rotation import rotate
from ..variants.mrope import MRoPE
from ..variants.nope import nope_temperature
from ..variants.xpos import XPos

__all__ = ["MRoPELayout", "mrope_layout", "nope_temperature_curve", "p_rope_wavelengths", "xpos_scores"]


@dataclass(frozen=True)
class MRoPELayout:
    """Per slot of an :class:`~rotary.variants.MRoPE`: the axis it reads and its wavelength.

    ``axes``: ``"T"``, ``"H"`` or ``"W"`` per slot; ``wavelength``: ``2π / θ_i`` in steps of its axis; ``span``: per
    axis, the (shortest, longest) wavelength.
    """

    axes: str
    wavelength: list[float]
    span: dict[str, tuple[float, float]]


def mrope_layout(mrope: MRoPE) -> MRoPELayout:
    """The axis and wavelength of every slot of ``mrope``.

    Example:
        >>> layout = mrope_layout(MRoPE(16, mrope_section=[2, 3, 3]))
        >>> layout.axes, round(layout.span["T"][0], 4)
        ('TTHHHWWW', 6.2832)
    """
    wavelength = (2 * math.pi / mrope.inv_freq.double()).tolist()
    axes = mrope.slot_axes()
    span = {}
    for axis in "THW":
        mine = [w for a, w in zip(axes, wavelength) if a == axis]
        span[axis] = (min(mine), max(mine))
    return MRoPELayout(axes, wavelength, span)


def xpos_scores(xpos: XPos, distances: Sequence[int]) -> torch.Tensor:
    """``⟨q, k⟩`` after xPos for ``q = k = all ones``, query ``Δ`` after the key: float64 ``[len(distances)]``.

    Example:
        >>> xpos_scores(XPos(8), [0]).tolist()  # ⟨1, 1⟩ = 8 at distance 0
        [8.0]
    """
    dist = torch.as_tensor(list(distances), dtype=torch.int64)
    if dist.numel() == 0 or int(dist.min()) < 0:
        raise InputError("distances must be a non-empty sequence of ints >= 0")
    d = xpos.head_dim
    q = torch.ones(1, 1, dist.numel(), d, dtype=torch.float64)
    k = torch.ones(1, 1, 1, d, dtype=torch.float64)
    q_rot = rotate([q], xpos.tables(xpos.center + dist, dtype=torch.float64))[0]
    k_rot = rotate([k], xpos.tables(torch.tensor([xpos.center]), dtype=torch.float64), kinds=("k",))[0]
    return (q_rot * k_rot).sum(-1)[0, 0]


def nope_temperature_curve(
    positions: Sequence[int] | torch.Tensor, *, floor_scale: int = 8192, attn_scale: float = 0.1
) -> torch.Tensor:
    """Llama 4's NoPE query temperature at ``positions``, float64 (see :func:`rotary.variants.nope_temperature`)."""
    return nope_temperature(
        torch.as_tensor(positions, dtype=torch.int64), floor_scale=floor_scale, attn_scale=attn_scale
    )


def p_rope_wavelengths(head_dim: int, fraction: float, *, base: float = 10000.0) -> list[float]:
    """Wavelength per pair of p-RoPE (the ``proportional`` rope_type): ``inf`` for the pairs that never turn."""
    rope = RoPE(head_dim, base=base, scaling={"rope_type": "proportional", "partial_rotary_factor": fraction})
    return [2 * math.pi / f if f > 0 else math.inf for f in rope.inv_freq.double().tolist()]
