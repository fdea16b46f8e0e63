"""Old home of the rotate stage and the functional forms, kept so that imports of ``rotary.apply``
keep working: :func:`rotate` now lives in :mod:`rotary.rotation`, :func:`apply_rotary` and the
flash-attn-compatible forms in :mod:`rotary.functional`, the overlap tests in
:mod:`rotary.kernels.overlap`.
"""

from .functional import apply_rotary, apply_rotary_, apply_rotary_kv_, apply_rotary_qkv_, check_tables
from .kernels.overlap import overlaps_itself, shares_elements
from .rotation import LAYOUTS, Layout, check_layout, decode_seq_axis, rotate

__all__ = [
    "LAYOUTS",
    "Layout",
    "apply_rotary",
    "apply_rotary_",
    "apply_rotary_kv_",
    "apply_rotary_qkv_",
    "check_layout",
    "check_tables",
    "decode_seq_axis",
    "overlaps_itself",
    "rotate",
    "shares_elements",
]
