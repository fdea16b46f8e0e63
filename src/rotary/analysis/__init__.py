"""The numbers behind every figure and report (decay, wavelengths, scaling profile, precision limits, scores, a
PCA of the tables, verification checks), as tensors, dataclasses or dicts: :mod:`rotary.tools.plots` only draws
them, so tests assert the numbers.
"""

from .decay import decay_bound, measured_decay
from .profile import (
    Inspection,
    PairProfile,
    PrecisionLimit,
    inspect_rope,
    jsonable,
    precision_limits,
    scaling_profile,
)
from .scores import position_pca, score_matrix
from .variants import MRoPELayout, mrope_layout, nope_temperature_curve, p_rope_wavelengths, xpos_scores
from .verify import Check, verify, verify_axial, verify_mrope

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
    "verify_axial",
    "verify_mrope",
    "jsonable",
    "MRoPELayout",
    "mrope_layout",
    "xpos_scores",
    "p_rope_wavelengths",
    "nope_temperature_curve",
]
