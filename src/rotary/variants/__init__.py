"""Variants of RoPE, each a producer of :class:`~rotary.tables.RotaryTables` on the one pipeline.

A variant changes what the tables hold (per-axis positions, per-position scales, ...) and reuses
positions, tables, :func:`rotary.rotate` and the fused kernels unchanged.
"""

from .nope import NoPETemperature, default_no_rope_layers, nope_temperature, rope_layer_flags
from .xpos import XPos, xpos_zeta

__all__ = [
    "NoPETemperature",
    "XPos",
    "default_no_rope_layers",
    "nope_temperature",
    "rope_layer_flags",
    "xpos_zeta",
]
