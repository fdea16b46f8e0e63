"""Hugging Face transformers: reading configs (:mod:`.config`, :mod:`.layers`, :mod:`.own_keys`), the table of
model types (:mod:`.architectures`, :mod:`.coverage`), the vision encoders' RoPE (:mod:`.vision`), and patching a
loaded model (:mod:`.patching`). Nothing here imports transformers at import time.
"""

from __future__ import annotations

from . import patching_encoders, patching_vision  # noqa: F401  (add the encoders and vision towers to SUPPORTED)
from .architectures import MROPE_MODELS, NO_ROPE_DEFAULTS, PAIRING, TEXT_MODEL_TYPES, UNSUPPORTED
from .config import MODEL_DEFAULTS, RopeSettings, model_defaults, read_hf_config
from .layers import read_hf_layers
from .patching import SUPPORTED, is_patched, patch, unpatch
from .vision import ENCODER_STATUS, VISION_ROPE, VisionRoPE, vision_rope

__all__ = [
    "ENCODER_STATUS",
    "MODEL_DEFAULTS",
    "MROPE_MODELS",
    "NO_ROPE_DEFAULTS",
    "PAIRING",
    "SUPPORTED",
    "TEXT_MODEL_TYPES",
    "UNSUPPORTED",
    "VISION_ROPE",
    "VisionRoPE",
    "RopeSettings",
    "is_patched",
    "model_defaults",
    "patch",
    "read_hf_config",
    "read_hf_layers",
    "unpatch",
    "vision_rope",
]
