"""Variants of RoPE: producers of :class:`~rotary.tables.RotaryTables` on the one rotate path.

- :class:`AxialRoPE` (:mod:`.axial`): N-D axial RoPE for images and video, with the published
  models' conventions as presets (:data:`PRESETS`);
- :class:`RoPEMixed` (:mod:`.mixed`): learnable per-head 2-D frequencies (RoPE-Mixed).
"""

from .axial import PRESETS, AxialRoPE, CoordinateRoPE, Coordinates, relative_scores
from .mixed import RoPEMixed

__all__ = ["PRESETS", "AxialRoPE", "CoordinateRoPE", "Coordinates", "RoPEMixed", "relative_scores"]
