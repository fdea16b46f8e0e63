"""Reading RoPE settings from Hugging Face configs (transformers 4.x and 5.x).

Two config generations exist on the Hub. 4.x writes ``rope_theta`` next to a ``rope_scaling`` block
whose type key is ``type`` (later ``rope_type``); 5.x writes ``rope_parameters`` with ``rope_theta``
(and ``partial_rotary_factor``) inside, possibly nested per attention layer type (Gemma-3:
``{"sliding_attention": {...}, "full_attention": {...}}``). Both are read here into one
:class:`RopeSettings`, without touching the object given (transformers' own standardisation
mutates the config in place).

transformers only logs most mistakes in these blocks; here each one is a :class:`ConfigError`
whose message says what to change, unless ``strict=False`` turns it into a warning (the checks of
each ``rope_type`` are in :mod:`rotary.rope_types`).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._checks import is_int, is_number
from .rope_types import ROPE_TYPES, ConfigError, complain

__all__ = ["ConfigError", "RopeSettings", "read_hf_config"]


# ------------------------------------------------------------------------------------------------
# reading Hugging Face configs

#: model_types whose attention pairs channels (2i, 2i+1); every other architecture pairs (i, i + r/2)
INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "roformer", "cohere", "cohere2", "glm", "glm4", "chatglm"})


@dataclass(frozen=True)
class RopeSettings:
    """What :meth:`rotary.RoPE.from_hf_config` needs, read from one config (one layer type).

    Attributes:
        head_dim: channels per head.
        base: ``rope_theta``.
        scaling: the validated-to-be block (``rope_type`` and its keys, ``partial_rotary_factor``).
        rotary_dim: an explicit rotated width (GPT-J's ``rotary_dim``), else ``None``.
        interleaved: the architecture's pairing.
        max_position_embeddings: the model's context length, if the config states one.
        model_type: the config's ``model_type`` (``""`` when absent).
    """

    head_dim: int
    base: float
    scaling: dict[str, Any] = field(default_factory=dict)
    rotary_dim: int | None = None
    interleaved: bool = False
    max_position_embeddings: int | None = None
    model_type: str = ""


def _positive_int(x: Any) -> bool:
    return is_int(x) and x > 0


def _as_dict(config: Any) -> dict[str, Any]:
    """A deep copy of ``config`` as a plain dict: a path to config.json, a dict, or a PretrainedConfig."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no config file at {path!r}; pass a config.json path, a dict or a PretrainedConfig")
        with open(path, encoding="utf-8") as fh:
            try:
                data = json.load(fh)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path} is not valid JSON ({exc}); pass a Hugging Face config.json") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} does not hold a JSON object; pass a Hugging Face config.json")
        return data
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        # to_dict() returns a deep copy in transformers 4.x and 5.x; copy again to be safe
        return copy.deepcopy(to_dict())
    raise TypeError(
        f"config must be a transformers PretrainedConfig, a dict or a path to config.json, got {type(config).__name__}"
    )


def _is_nested(block: Mapping[str, Any], layer_types: Iterable[str] | None) -> bool:
    if "rope_type" in block or "type" in block or not block:
        return False
    labels = set(layer_types or ())
    return all(isinstance(v, Mapping) or v is None for v in block.values()) and (
        bool(labels & set(block)) or not labels
    )


def _head_dim(d: Mapping[str, Any]) -> int:
    # DeepSeek-V2/V3 (MLA) rotate only a qk_rope_head_dim-wide slice of each head
    for key in ("qk_rope_head_dim", "head_dim"):
        if d.get(key) is not None:
            value = d[key]
            if not _positive_int(value):
                raise ConfigError(f"config {key} must be a positive int, got {value!r}")
            return value
    hidden = d.get("hidden_size", d.get("n_embd"))
    heads = d.get("num_attention_heads", d.get("n_head"))
    if not (_positive_int(hidden) and _positive_int(heads)):
        raise ConfigError(
            "the config states neither head_dim nor hidden_size and num_attention_heads "
            f"(got hidden_size={hidden!r}, num_attention_heads={heads!r}); add head_dim"
        )
    return hidden // heads


def _interleaved(d: Mapping[str, Any], model_type: str) -> bool:
    if model_type in ("deepseek_v2", "deepseek_v3"):
        # MLA checkpoints store q/k rope channels interleaved unless rope_interleave is false
        return bool(d.get("rope_interleave", True))
    return model_type in INTERLEAVED_MODEL_TYPES


def _gemma3_blocks(d: dict[str, Any]) -> dict[str, Any]:
    """Gemma-3's 4.x layout (rope_theta global, rope_local_base_freq local, rope_scaling on full layers)."""
    full = dict(d.get("rope_scaling") or {})
    full.setdefault("rope_theta", d.get("rope_theta", 1_000_000.0))
    sliding = {"rope_type": "default", "rope_theta": d.get("rope_local_base_freq", 10_000.0)}
    full.setdefault("rope_type", full.pop("type", "default"))
    return {"sliding_attention": sliding, "full_attention": full}


def read_hf_config(config: Any, *, layer_type: str | None = None, strict: bool = True) -> RopeSettings:
    """Read the RoPE settings of a Hugging Face config without modifying it.

    Args:
        config: a transformers ``PretrainedConfig`` (4.x or 5.x), a path to a config.json (or to its
            folder), or a dict of its contents. Multimodal configs are read from ``text_config``.
        layer_type: for configs with one block per attention layer type (Gemma-3), which one.
        strict: ``False`` fills a missing ``original_max_position_embeddings`` from
            ``max_position_embeddings`` with a warning, as transformers does silently.

    Returns:
        :class:`RopeSettings`.

    Example:
        >>> s = read_hf_config({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        ...                     "rope_theta": 500000.0, "max_position_embeddings": 8192})
        >>> s.head_dim, s.base, s.scaling
        (128, 500000.0, {'rope_type': 'default'})
    """
    d = _as_dict(config)
    if d.get("text_config") and not any(k in d for k in ("rope_parameters", "rope_scaling", "rope_theta", "head_dim")):
        d = {"model_type": d.get("model_type"), **d["text_config"]}
    model_type = str(d.get("model_type") or "")
    head_dim = _head_dim(d)
    mpe = d.get("max_position_embeddings", d.get("n_positions"))

    block = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(block, Mapping):
        raise ConfigError(f"rope_parameters / rope_scaling must be a dict, got {block!r}")
    block = dict(block)
    layer_types = d.get("layer_types")
    if model_type.startswith("gemma3") and not _is_nested(block, layer_types):
        block = _gemma3_blocks(d)
    if _is_nested(block, layer_types):
        available = sorted(k for k, v in block.items() if v is not None)
        if layer_type is None:
            raise ConfigError(
                f"this config has one RoPE block per layer type ({', '.join(available)}); pass layer_type= one of them"
            )
        if block.get(layer_type) is None:
            raise ConfigError(f"layer_type {layer_type!r} has no RoPE block; choose one of {', '.join(available)}")
        block = dict(block[layer_type])
    elif layer_type is not None and layer_types and layer_type not in layer_types:
        raise ConfigError(f"layer_type {layer_type!r} is not in the config's layer_types {sorted(set(layer_types))}")

    legacy = block.pop("type", None)  # the 4.x name of rope_type
    block.setdefault("rope_type", legacy or "default")
    if model_type == "phi3" and block["rope_type"] in ("su", "yarn"):
        block["rope_type"] = "longrope"  # Phi-3's early names for LongRoPE, as transformers renames them

    base = block.pop("rope_theta", None)
    if base is None:
        base = d.get("rope_theta", d.get("rotary_emb_base", 10_000.0))
    if not is_number(base) or base <= 0:
        raise ConfigError(f"rope_theta must be a number > 0, got {base!r}")

    rotary_dim = None
    if "partial_rotary_factor" not in block:
        if d.get("partial_rotary_factor") is not None:
            block["partial_rotary_factor"] = d["partial_rotary_factor"]
        elif model_type == "gpt_neox" or "rotary_pct" in d:
            block["partial_rotary_factor"] = d.get("rotary_pct", 0.25)  # GPT-NeoX's default
        elif model_type == "gptj" or d.get("rotary_dim") is not None:
            # GPT-J states the width (default 64; null rotates the whole head)
            rotary_dim = d.get("rotary_dim", 64)
            if rotary_dim is not None and not _positive_int(rotary_dim):
                raise ConfigError(f"config rotary_dim must be a positive int, got {rotary_dim!r}")

    rope_type = ROPE_TYPES.get(block["rope_type"]) if isinstance(block["rope_type"], str) else None
    rt = block["rope_type"]
    if rope_type is not None and rope_type.trained_length:
        if d.get("original_max_position_embeddings") is not None:
            # transformers lets a top-level original_max_position_embeddings (Phi-3) win over the block's
            block["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        elif block.get("original_max_position_embeddings") is None and mpe is not None:
            complain(
                f"rope_type {rt!r} block has no original_max_position_embeddings (the trained context length); "
                f"add it (transformers would use max_position_embeddings={mpe})",
                strict,
            )
            block["original_max_position_embeddings"] = mpe
    if mpe is not None and rope_type is not None:
        if "max_position_embeddings" in rope_type.required | rope_type.optional:
            block.setdefault("max_position_embeddings", mpe)
    return RopeSettings(
        head_dim=head_dim,
        base=float(base),
        scaling=block,
        rotary_dim=rotary_dim,
        interleaved=_interleaved(d, model_type),
        max_position_embeddings=mpe,
        model_type=model_type,
    )
