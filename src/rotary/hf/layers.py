"""The RoPE of each layer type of a model whose layers do not all rotate alike (Gemma 2/3/4, DeepSeek-V4, ...).

:func:`read_hf_layers` returns each one keyed by layer type, as ``read_hf_config(config, layer_type=...)``
reads it: Gemma 3's sliding layers use base 10 000 and its full-attention layers 1 000 000; Gemma 4's full
layers also have wider heads and proportional RoPE; DeepSeek-V4 has its ``main`` and ``compress`` RoPEs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..rope_types import ConfigError
from .config import GEMMA3_LAYER_TYPES, RopeSettings, config_model_type, load_config, read_hf_config, text_part_of
from .own_keys import DEEPSEEK_V4_LAYER_ROPE, SUB_CONFIGS

__all__ = ["read_hf_layers"]


def _layer_types(config: Any) -> list[str]:
    d, label = load_config(config)
    d = text_part_of(d, label)
    model_type = config_model_type(d, label)
    if model_type in SUB_CONFIGS and isinstance(d.get(SUB_CONFIGS[model_type]), Mapping):
        d = dict(d[SUB_CONFIGS[model_type]])
    kinds = d.get("layer_types")
    if model_type == "deepseek_v4" and not kinds:
        kinds = list(DEEPSEEK_V4_LAYER_ROPE)
    if model_type.startswith("gemma3") and not kinds:  # a 4.x config.json: both kinds, unlisted
        kinds = list(GEMMA3_LAYER_TYPES)
    return sorted({k for k in kinds or () if isinstance(k, str)})


def read_hf_layers(
    config: Any, *, strict: bool = True, interleaved: bool | None = None
) -> dict[str | None, RopeSettings]:
    """The RoPE settings of every layer type of ``config`` that has its own (``{None: ...}`` when all share one).

    Arguments and errors as :func:`rotary.hf.read_hf_config`; layer types without RoPE (linear attention) are left
    out.

    Example:
        >>> cfg = {"model_type": "gemma3_text", "head_dim": 256,
        ...        "layer_types": ["sliding_attention", "full_attention"]}
        >>> {k: s.base for k, s in read_hf_layers(cfg).items()}
        {'full_attention': 1000000.0, 'sliding_attention': 10000.0}
    """
    try:
        return {None: read_hf_config(config, strict=strict, interleaved=interleaved)}
    except ConfigError as whole:
        found = {}
        for kind in _layer_types(config):
            try:
                found[kind] = read_hf_config(config, layer_type=kind, strict=strict, interleaved=interleaved)
            except ConfigError as error:
                if "has no RoPE" not in str(error):  # a layer type without a RoPE block (linear attention)
                    raise
                continue
        if not found:
            raise whole from None
        return found
