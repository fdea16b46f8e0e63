"""Variants of RoPE, each a producer of :class:`~rotary.tables.RotaryTables` on the one pipeline.

A variant changes what the tables hold (per-axis positions, per-position scales, per-head
frequencies, ...) and reuses positions, tables, :func:`rotary.rotate` and the fused kernels unchanged.

- :class:`AxialRoPE` (:mod:`.axial`): N-D axial RoPE for images and video, with the published
  models' conventions as presets (:data:`PRESETS`);
- :class:`RoPEMixed` (:mod:`.mixed`): learnable per-head 2-D frequencies (RoPE-Mixed);
- :class:`MRoPE` (:mod:`.mrope`): multimodal RoPE of the vision-language models (Qwen-VL, Qwen3.5, GLM-4V,
  ERNIE-4.5-VL, HunYuan-VL's XD-RoPE, ...), and
  :func:`multimodal_positions` (:mod:`.multimodal`): the position ids of their prompts;
- :class:`XPos` (:mod:`.xpos`): xPos, separate query and key tables with an exponential decay;
- :class:`DualChunkRoPE` (:mod:`.dual_chunk`): the query and key rotations of dual chunk attention;
- :class:`FoPE` (:mod:`.fope`): Fourier position embedding, per-head Fourier-series tables;
- :mod:`.nope`: NoPE layers and Llama 4's NoPE query temperature.
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
