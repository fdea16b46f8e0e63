"""Hugging Face transformers: reading configs, the table of model types, and patching a loaded model.

- :mod:`rotary.hf.config`: :func:`read_hf_config` (transformers 4.x and 5.x configs, per-layer
  configs, model defaults) -> :class:`RopeSettings`, what :meth:`rotary.RoPE.from_hf_config` builds from;
- :mod:`rotary.hf.layers`: :func:`read_hf_layers`, the RoPE of each layer type of models whose layers
  differ (Gemma 2/3/4, DeepSeek-V4);
- :mod:`rotary.hf.own_keys`: the architectures that state their RoPE in keys of their own;
- :mod:`rotary.hf.coverage`: every RoPE-applying model type of transformers and what builds it;
- :mod:`rotary.hf.architectures`: per ``model_type``, the pairing of the rotated channels, the
  multimodal (M-RoPE) types, the types refused and why;
- :mod:`rotary.hf.vision`: :func:`vision_rope`, the RoPE of vision encoders (Qwen-VL, GLM-4V, Pixtral,
  DINOv3, …) from their vision configs; :data:`VISION_ROPE` the towers built, :data:`ENCODER_STATUS` why
  the other encoders are not;
- :mod:`rotary.hf.patching`: :func:`patch` / :func:`unpatch` run a loaded model's rotary application
  through rotary (``rotary.hf.patch(model)``).

Nothing here imports transformers at import time: :func:`patch` imports the model's own modeling module.
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
