"""Architectures that state their RoPE in their own keys or layouts, turned into the common ones.

:func:`common_keys` rewrites a copy of such a config dict into the keys
:func:`rotary.hf.config.read_hf_config` reads, as each one's transformers config class does (Gemma 4's
``per_layer_config``, DeepSeek-V4's blocks, encoder-decoder sub-configs, Zamba2's ``use_mem_rope``, CLVP, the
config classes' ``attribute_map``).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from typing import Any

from .._checks import is_number, is_positive_int
from ..rope_types import ConfigError, complain

__all__ = [
    "ATTRIBUTE_MAPS",
    "DEEPSEEK_V4_LAYER_ROPE",
    "GLOBAL_HEAD_DIM",
    "ROPE_SWITCHES",
    "SUB_CONFIGS",
    "attribute_map",
    "common_keys",
]

#: model_type -> default ``global_head_dim`` of its full-attention layers, for a config.json that has no
#: ``per_layer_config`` yet (the config class builds one from ``global_head_dim`` when it is created)
GLOBAL_HEAD_DIM = {"gemma4_text": 512, "gemma4_unified_text": 512, "diffusion_gemma_text": 512}

#: model_type -> (the config key that turns its RoPE on, the value that does, the key's default): with any
#: other value the model applies no RoPE, and read_hf_config says so instead of building one
ROPE_SWITCHES: dict[str, tuple[str, Any, Any]] = {
    "zamba2": ("use_mem_rope", True, False),
    "esm": ("position_embedding_type", "rotary", "absolute"),
    "granitemoehybrid": ("position_embedding_type", "rope", None),
    "clvp_encoder": ("use_rotary_embedding", True, True),
}

#: encoder-decoder model_type -> the sub-config its decoder's RoPE is read from (the encoder's is the same kind;
#: the tests check both sides' attention against it)
SUB_CONFIGS = {"t5gemma": "decoder", "t5gemma2": "decoder", "dia": "decoder_config"}

#: DeepSeek-V4: attention layer type -> the RoPE block its layers use (sliding-window layers the plain
#: ``main`` one, compressed layers and their compressors and indexers the ``compress`` one)
DEEPSEEK_V4_LAYER_ROPE = {
    "sliding_attention": "main",
    "compressed_sparse_attention": "compress",
    "heavily_compressed_attention": "compress",
}

#: model_type -> {common name: its own name} for the keys read_hf_config reads, for when transformers is not
#: installed (with it, the config class's ``attribute_map`` is read; the tests compare the two)
ATTRIBUTE_MAPS: dict[str, dict[str, str]] = {
    "dbrx": {"hidden_size": "d_model", "num_attention_heads": "n_heads", "max_position_embeddings": "max_seq_len"},
    "jetmoe": {"head_dim": "kv_channels"},
}

#: the common names read_hf_config reads that an architecture may store under its own name
_READ = ("head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings", "rope_theta",
         "partial_rotary_factor", "rotary_dim")  # fmt: skip


@functools.cache
def attribute_map(model_type: str) -> dict[str, str]:
    """``{common name: own name}`` of ``model_type``'s config keys that read_hf_config reads.

    Example:
        >>> attribute_map("jetmoe")
        {'head_dim': 'kv_channels'}
    """
    if importlib.util.find_spec("transformers") is None:
        return dict(ATTRIBUTE_MAPS.get(model_type, {}))
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        return {}
    found = getattr(CONFIG_MAPPING[model_type], "attribute_map", None) or {}
    return {k: v for k, v in found.items() if k in _READ and isinstance(v, str)}


def _per_layer(d: dict[str, Any], model_type: str, layer_type: str | None, label: str) -> None:
    """Apply ``per_layer_config``'s overrides of ``layer_type``'s layers to ``d`` (in place)."""
    per_layer = d.pop("per_layer_config", None)
    layer_types = d.get("layer_types")
    if per_layer is None and model_type in GLOBAL_HEAD_DIM and isinstance(layer_types, (list, tuple)):
        width = d.pop("global_head_dim", GLOBAL_HEAD_DIM[model_type])
        per_layer = {i: {"head_dim": width} for i, t in enumerate(layer_types) if t == "full_attention"}
    if not per_layer:
        return
    if not isinstance(per_layer, Mapping):
        raise ConfigError(f"{label}: per_layer_config must be a dict of layer index -> overrides, got {per_layer!r}")
    if layer_type is None or not isinstance(layer_types, (list, tuple)):
        touched = sorted({k for v in per_layer.values() if isinstance(v, Mapping) for k in v})
        rope_keys = {"head_dim", "rope_parameters", "partial_rotary_factor", "rope_theta"}
        if rope_keys & set(touched):
            kinds = sorted(set(layer_types or ()))
            raise ConfigError(
                f"{label}: this config's per_layer_config changes {sorted(rope_keys & set(touched))} per layer, so "
                f"its RoPE depends on the layer; pass layer_type= one of {kinds or 'its layer types'}"
            )
        return
    try:  # keys are layer indices: ints, or strings of them ("05", as transformers writes them)
        per_layer = {int(k): v for k, v in per_layer.items()}
    except (TypeError, ValueError):
        raise ConfigError(
            f"{label}: per_layer_config keys must be layer indices, got {sorted(map(str, per_layer))}"
        ) from None
    overrides = {}
    for index, kind in enumerate(layer_types):
        if kind != layer_type:
            continue
        found = per_layer.get(index, {})
        if not isinstance(found, Mapping):
            raise ConfigError(f"{label}: per_layer_config[{index}] must be a dict of overrides, got {found!r}")
        if overrides and dict(found) != overrides[next(iter(overrides))]:
            first = next(iter(overrides))
            raise ConfigError(
                f"{label}: the {layer_type} layers {first} and {index} have different per_layer_config overrides "
                f"({overrides[first]} vs {dict(found)}), so they have no one RoPE; build each layer's RoPE from "
                "its own settings"
            )
        overrides.setdefault(index, dict(found))
    if overrides:
        d.update(next(iter(overrides.values())))


def _rope_slice(d: dict[str, Any], label: str) -> int:
    """DeepSeek-V4's rotated width: ``head_dim * partial_rotary_factor`` (64 of 512 by default)."""
    head_dim = d.get("head_dim", 512)
    partial = d.pop("partial_rotary_factor", None)
    legacy = d.pop("qk_rope_head_dim", None)
    if partial is None:
        partial = legacy / head_dim if is_positive_int(legacy) and is_positive_int(head_dim) else 64 / 512
    if not (is_positive_int(head_dim) and is_number(partial) and 0 < partial <= 1):
        raise ConfigError(
            f"{label}: DeepSeek-V4 rotates head_dim * partial_rotary_factor channels, but head_dim={head_dim!r} and "
            f"partial_rotary_factor={partial!r}; head_dim must be a positive int and the factor in (0, 1]"
        )
    width = int(head_dim * partial)
    if width < 2 or width % 2:
        raise ConfigError(
            f"{label}: DeepSeek-V4's rotated slice head_dim * partial_rotary_factor = {width} must be "
            "even and at least 2"
        )
    return width


def _deepseek_v4(d: dict[str, Any], layer_type: str | None, label: str, strict: bool) -> None:
    """Rewrite a DeepSeek-V4 config (in place) to the flat block of the RoPE ``layer_type`` uses."""
    labels = sorted(set(DEEPSEEK_V4_LAYER_ROPE) | {"main", "compress"})
    if layer_type is None:
        raise ConfigError(
            f"{label}: DeepSeek-V4 has two RoPEs, 'main' (sliding-window layers) and 'compress' (compressed layers, "
            f"their compressors and indexers); pass layer_type= one of {labels}"
        )
    which = DEEPSEEK_V4_LAYER_ROPE.get(layer_type, layer_type)
    if which not in ("main", "compress"):
        raise ConfigError(f"{label}: DeepSeek-V4 has no RoPE of layer_type {layer_type!r}; choose one of {labels}")
    params = d.pop("rope_parameters", None) or {}
    legacy = d.pop("rope_scaling", None) or {}
    if not isinstance(params, Mapping) or not isinstance(legacy, Mapping):
        raise ConfigError(f"{label}: rope_parameters and rope_scaling must be dicts, got {params!r} / {legacy!r}")
    width = _rope_slice(d, label)
    if isinstance(params.get(which), Mapping):
        block = dict(params[which])
    else:  # a flat (checkpoint) config: the config class's construction of the two blocks
        flat = {k: v for k, v in {**legacy, **params}.items() if k not in ("main", "compress")}
        if which == "main":
            block = {"rope_type": "default", "rope_theta": d.get("rope_theta", 10000.0)}
        else:
            block = {**flat, "rope_theta": d.get("compress_rope_theta", 160000.0)}
            block.setdefault("rope_type", block.pop("type", "default"))
            if block["rope_type"] == "yarn":
                block.setdefault("attention_factor", 1.0)  # V4 does not scale cos/sin by YaRN's mscale
    block.pop("partial_rotary_factor", None)  # the rotated slice is the whole of what the RoPE rotates
    d.pop("layer_types", None)
    d["rope_parameters"] = block
    d["head_dim"] = width


def _clvp(d: dict[str, Any], label: str) -> None:
    """CLVP's encoder: base 10 000, ``max(projection_dim // (2 * heads), 32)`` rotated channels (fixed in its code)."""
    hidden, heads, projection = (
        d.get("hidden_size", 768),
        d.get("num_attention_heads", 12),
        d.get("projection_dim", 768),
    )
    if not all(is_positive_int(v) for v in (hidden, heads, projection)) or hidden % heads:
        raise ConfigError(
            f"{label}: CLVP needs positive ints hidden_size={hidden!r} (a multiple of "
            f"num_attention_heads={heads!r}) and projection_dim={projection!r}"
        )
    width, head = max(projection // (2 * heads), 32), hidden // heads
    if width > head:
        raise ConfigError(
            f"{label}: CLVP rotates max(projection_dim // (2 * num_attention_heads), 32) = {width} channels, more "
            f"than its heads have ({head}); transformers cannot run this config either"
        )
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": width / head}


def common_keys(d: dict[str, Any], model_type: str, layer_type: str | None, label: str, strict: bool) -> str | None:
    """Rewrite ``d`` (a copy, in place) into the keys read_hf_config reads; return the layer_type left to read.

    Example:
        >>> d = {"model_type": "deepseek_v4", "head_dim": 512, "rope_theta": 10000.0}
        >>> common_keys(d, "deepseek_v4", "sliding_attention", "the config", True), d["head_dim"]
        (None, 64)
    """
    if model_type in SUB_CONFIGS and isinstance(d.get(SUB_CONFIGS[model_type]), Mapping):
        inner = dict(d[SUB_CONFIGS[model_type]])
        d.clear()
        d.update(inner, model_type=model_type)
    if model_type in ROPE_SWITCHES:
        flag, on, default = ROPE_SWITCHES[model_type]
        if d.get(flag, default) != on or type(d.get(flag, default)) is not type(on):
            raise ConfigError(
                f"{label}: {model_type} applies RoPE only when {flag}={on!r}, and this config has {flag}="
                f"{d.get(flag, default)!r}: its attention has no rotary embedding to build"
            )
    for common, own in attribute_map(model_type).items():
        if own in d and common not in d:
            d[common] = d[own]
    if model_type == "clvp_encoder":
        _clvp(d, label)
    if model_type == "dbrx":
        attn = d.get("attn_config")
        theta = attn.get("rope_theta") if isinstance(attn, Mapping) else None
        stated = (d.get("rope_parameters") or {}).get("rope_theta", d.get("rope_theta", 10000.0))
        if theta is not None and theta != stated:
            complain(
                f"{label}: attn_config.rope_theta={theta!r}, but transformers 5.23's DBRX builds its rotary tables "
                f"from rope_parameters' rope_theta={stated!r} and never reads attn_config's; state the base you "
                "mean as rope_parameters={'rope_type': 'default', 'rope_theta': ...}",
                strict,
            )
        return layer_type
    if model_type == "deepseek_v4":
        _deepseek_v4(d, layer_type, label, strict)
        return None
    if "per_layer_config" in d or model_type in GLOBAL_HEAD_DIM:
        _per_layer(d, model_type, layer_type, label)
    return layer_type
