"""Variants of RoPE, each a producer of :class:`~rotary.tables.RotaryTables` on the one pipeline.

A variant changes what the tables hold (per-axis positions, per-position scales, ...) and reuses
positions, tables, :func:`rotary.rotate` and the fused kernels unchanged.
"""

from .mrope import MRoPE, MultimodalPositions, check_mrope_section, mrope_axes, multimodal_positions
from .nope import NoPETemperature, default_no_rope_layers, nope_temperature, rope_layer_flags
from .xpos import XPos, xpos_zeta

__all__ = [
    "MRoPE",
    "MultimodalPositions",
    "NoPETemperature",
    "XPos",
    "check_mrope_section",
    "default_no_rope_layers",
    "mrope_axes",
    "multimodal_positions",
    "nope_temperature",
    "rope_layer_flags",
    "xpos_zeta",
]
