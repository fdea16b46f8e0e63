"""Hugging Face transformers: reading configs, the table of model types, and patching a loaded model.

:mod:`.config` (:func:`read_hf_config` -> :class:`RopeSettings`, what :meth:`rotary.RoPE.from_hf_config` builds
from), :mod:`.layers` (the RoPE of each layer type), :mod:`.own_keys` (architectures with keys of their own),
:mod:`.architectures` (per ``model_type``: pairing, M-RoPE types, refusals), :mod:`.coverage` (every RoPE model
type of transformers and what builds it), :mod:`.vision` (:func:`vision_rope`, the vision encoders' RoPE), and
:mod:`.patching` (:func:`patch` / :func:`unpatch`). Nothing here imports transformers at import time.
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
