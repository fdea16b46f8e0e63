"""Variants of RoPE, each a producer of :class:`~rotary.tables.RotaryTables` on the one pipeline.

A variant changes what the tables hold (per-axis positions, per-position scales, ...) and reuses
positions, tables, :func:`rotary.rotate` and the fused kernels unchanged.
"""

from .xpos import XPos, xpos_zeta

__all__ = ["XPos", "xpos_zeta"]
