"""Variants of RoPE, each a producer of :class:`~rotary.tables.RotaryTables` on the one pipeline (docs/variants.md).

:class:`AxialRoPE` (images, video; :data:`PRESETS`), :class:`RoPEMixed` (learnable per-head 2-D frequencies),
:class:`MRoPE` and :func:`multimodal_positions` (the vision-language models), :class:`XPos`,
:class:`DualChunkRoPE`, :class:`FoPE`, and :mod:`.nope` (NoPE layers, Llama 4's temperature). Each changes what
the tables hold and reuses positions, tables, :func:`rotary.rotate` and the kernels unchanged.
"""

from .axial import PRESETS, AxialRoPE, relative_scores
from .coordinate_rope import CoordinateRoPE
from .coordinates import Coordinates
from .dual_chunk import DualChunkRoPE, DualChunkTables, dual_chunk_attention
from .fope import FoPE, fope_kept_frequencies
from .mixed import RoPEMixed
from .mrope import MRoPE, check_mrope_section, mrope_axes
from .multimodal import FAMILIES, MultimodalPositions, family_settings, multimodal_positions
from .nope import NoPETemperature, default_no_rope_layers, nope_temperature, rope_layer_flags
from .xpos import XPos, xpos_zeta

__all__ = [
    "FAMILIES",
    "PRESETS",
    "AxialRoPE",
    "CoordinateRoPE",
    "Coordinates",
    "DualChunkRoPE",
    "DualChunkTables",
    "FoPE",
    "MRoPE",
    "MultimodalPositions",
    "NoPETemperature",
    "RoPEMixed",
    "XPos",
    "check_mrope_section",
    "default_no_rope_layers",
    "dual_chunk_attention",
    "fope_kept_frequencies",
    "family_settings",
    "mrope_axes",
    "multimodal_positions",
    "nope_temperature",
    "relative_scores",
    "rope_layer_flags",
    "xpos_zeta",
]
