"""Reading RoPE settings from Hugging Face configs (transformers 4.x and 5.x) into one :class:`RopeSettings`.

4.x writes ``rope_theta`` beside a ``rope_scaling`` block (type key ``type``, later ``rope_type``); 5.x writes
``rope_parameters`` with ``rope_theta`` inside, possibly per attention layer type (Gemma-3). The object given is
never modified. The pairing comes from :data:`PAIRING` (checked against transformers' modeling code,
tests/test_hf_architectures.py; :data:`UNSUPPORTED` says which architectures are not built and why), the values
a config.json may omit from :func:`model_defaults`. Mistakes transformers only logs are a :class:`ConfigError`
naming the fix (``strict=False``: a warning). The keys read: docs/scaling.md.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._checks import MAX_HEAD_DIM, check_bool, is_number, is_positive_int
from ..errors import InputError, InputTypeError
from ..rope_types import ROPE_TYPES, ConfigError, canonical_rope_type, complain
from .architectures import (
    MROPE_MODELS,
    NO_ROPE_DEFAULTS,
    PAIRING,
    PARTIAL_READERS,
    TEXT_MODEL_TYPES,
    UNSUPPORTED,
    read_mrope,
    read_pairing,
    read_rope_layers,
)
from .encoder_tables import ENCODER_PART
from .ignored_keys import IGNORED_ROPE_KEYS, drop_ignored_keys
from .own_keys import common_keys

__all__ = [
    "ConfigError",
    "IGNORED_ROPE_KEYS",
    "MODEL_DEFAULTS",
    "MROPE_MODELS",
    "NO_ROPE_DEFAULTS",
    "PAIRING",
    "RopeSettings",
    "TEXT_MODEL_TYPES",
    "UNSUPPORTED",
    "model_defaults",
    "read_hf_config",
]


@dataclass(frozen=True)
class RopeSettings:
    """What :meth:`rotary.RoPE.from_hf_config` needs, read from one config (one layer type).

    ``head_dim``, ``base`` (``rope_theta``); ``scaling``, the block (``rope_type``, its keys,
    ``partial_rotary_factor``); ``rotary_dim``, an explicit rotated width (GPT-J) or ``None``; ``interleaved``, the
    pairing (:data:`PAIRING` or the caller's); ``max_position_embeddings`` and ``model_type`` (``""`` when absent) as
    the config states them; ``mrope_section``, ``mrope_interleaved``, ``mrope_layout`` for :data:`MROPE_MODELS` (else
    ``None``); ``rope_layers``, one flag per layer (``False``: NoPE; ``None``: all rotate); ``nope_temperature``, Llama
    4's ``{"floor_scale", "attn_scale"}`` or ``None``; ``head_dim_from``, where a head width the config does not state
    came from (``"hidden_size=768 / num_attention_heads=64 (gpt_neox's default: ...)"``), ``""`` when it states it.
    """

    head_dim: int
    base: float
    scaling: dict[str, Any] = field(default_factory=dict)
    rotary_dim: int | None = None
    interleaved: bool = False
    max_position_embeddings: int | None = None
    model_type: str = ""
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    rope_layers: tuple[bool, ...] | None = None
    nope_temperature: dict[str, float] | None = None
    mrope_layout: str = "chunked"
    head_dim_from: str = field(default="", compare=False)


# ------------------------------------------------------------------------------------------------
# values a config.json may omit: transformers fills them from the model's config class

#: top-level keys read_hf_config falls back to the model's defaults for (field defaults of the config class)
DEFAULTED_KEYS = (
    "head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings", "qk_rope_head_dim",
    "rope_interleave", "rotary_dim", "n_embd", "n_head", "n_positions", "original_max_position_embeddings",
)  # fmt: skip

#: model_type -> defaults, for when transformers is not installed (tests compare them with transformers).
#: Keys: those of :data:`DEFAULTED_KEYS`, ``rope_theta`` (the default base), ``partial_rotary_factor``,
#: ``layer_rope_theta`` (per layer type, for models with one block per layer type),
#: ``rope_parameters`` (a default scaling block, used when the file has none) and ``rope_ignore_keys``
#: (keys the model keeps in its RoPE block for its attention, which the rotary tables do not use).
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 2048, "rope_theta": 10000.0},
    "mistral": {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
                "rope_theta": 10000.0},
    "mixtral": {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
                "rope_theta": 1000000.0},
    "qwen2": {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 32768, "rope_theta": 10000.0},
    "qwen3": {"head_dim": 128, "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 32768,
              "rope_theta": 10000.0},
    "phi3": {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 4096, "rope_theta": 10000.0,
             "partial_rotary_factor": 1.0, "original_max_position_embeddings": 4096},
    "phi": {"hidden_size": 2048, "num_attention_heads": 32, "max_position_embeddings": 2048, "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5},
    "gpt_neox": {"hidden_size": 6144, "num_attention_heads": 64, "max_position_embeddings": 2048, "rope_theta": 10000.0,
                 "partial_rotary_factor": 0.25},
    "gptj": {"rotary_dim": 64, "n_embd": 4096, "n_head": 16, "n_positions": 2048},
    "gemma3_text": {"head_dim": 256, "hidden_size": 2304, "num_attention_heads": 8, "max_position_embeddings": 131072,
                    "layer_rope_theta": {"sliding_attention": 10000.0, "full_attention": 1000000.0}},
    "gpt_oss": {"head_dim": 64, "hidden_size": 2880, "num_attention_heads": 64, "max_position_embeddings": 131072,
                "rope_theta": 150000.0,
                "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                    "truncate": False, "original_max_position_embeddings": 4096}},
    "deepseek_v3": {"hidden_size": 7168, "num_attention_heads": 128, "max_position_embeddings": 4096,
                    "qk_rope_head_dim": 64, "rope_interleave": True, "rope_theta": 10000.0},
    "deepseek_v2": {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 2048,
                    "qk_rope_head_dim": 64, "rope_theta": 10000.0},
    "cohere": {"hidden_size": 8192, "num_attention_heads": 64, "max_position_embeddings": 8192, "rope_theta": 500000.0},
    "glm": {"head_dim": 128, "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}  # fmt: skip


def _transformers_installed() -> bool:
    return importlib.util.find_spec("transformers") is not None


@functools.cache
def _transformers_defaults(model_type: str) -> dict[str, Any] | None:
    """The defaults of ``model_type``'s config class in the installed transformers (``None`` if unknown)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        return None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    fields = {f.name: f.default for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    out = {
        k: fields[k] for k in DEFAULTED_KEYS if fields.get(k, dataclasses.MISSING) not in (None, dataclasses.MISSING)
    }
    # the RoPE defaults are set in the class's __post_init__ (default_theta, Phi-2's partial factor, Gemma-3's
    # per-layer bases): build the default config object (numbers only, no weights) and read them off it
    try:
        instance = cls()
    except Exception:  # a few config classes cannot build their own defaults (nougat, gemma4_assistant)
        return out
    # keys the model keeps in its RoPE block for its attention, not for the rotary tables (Mistral-4's
    # llama_4_scaling_beta scales queries by position); transformers' own validation skips them
    ignored = set(getattr(instance, "ignore_keys_at_rope_validation", None) or ())
    ignored = sorted(ignored - {"mrope_section", "partial_rotary_factor", "rope_theta", "rope_type", "type"})
    if ignored:
        out["rope_ignore_keys"] = ignored
    block = getattr(instance, "rope_parameters", None)
    if not isinstance(block, Mapping) or not block:
        return out
    nested = {k: v for k, v in block.items() if isinstance(v, Mapping)}
    if nested:
        out["layer_rope_theta"] = {k: v["rope_theta"] for k, v in nested.items() if "rope_theta" in v}
        return out
    block = dict(block)
    out["rope_theta"] = block.pop("rope_theta")
    partial = block.pop("partial_rotary_factor", None)
    if partial is not None:
        out["partial_rotary_factor"] = partial
    block.pop("type", None)
    if block.get("rope_type", "default") != "default":
        out["rope_parameters"] = block
        # a class whose default block states its own base (Apertus, CWM, Ministral 3) keeps it over a rope_theta
        # the config gives beside no block: the block then carries the base, as transformers reads it
        try:
            probe = cls(rope_theta=out["rope_theta"] * 2 + 1).rope_parameters
        except Exception:  # noqa: BLE001 - a class that refuses the probe: the stated base is read, as before
            probe = None
        if isinstance(probe, Mapping) and probe.get("rope_theta") == out["rope_theta"]:
            block["rope_theta"] = out["rope_theta"]
    return out


def model_defaults(model_type: str, *, source: Literal["auto", "transformers", "table"] = "auto") -> dict[str, Any]:
    """The values transformers fills in when a config.json of ``model_type`` omits them, as a new dict.

    ``source``: ``"transformers"`` (the installed config class; nothing downloaded), ``"table"``
    (:data:`MODEL_DEFAULTS`), or ``"auto"`` (the first when transformers is installed). The keys are
    :data:`DEFAULTED_KEYS` and, where the model has them, ``rope_theta``, ``partial_rotary_factor``,
    ``layer_rope_theta``, ``rope_parameters``, ``rope_ignore_keys`` (empty if unknown).

    Example:
        >>> d = model_defaults("gemma3_text", source="table")
        >>> d["head_dim"], d["layer_rope_theta"]["sliding_attention"]
        (256, 10000.0)
    """
    if source not in ("auto", "transformers", "table"):
        raise InputError(f"source must be 'auto', 'transformers' or 'table', got {source!r}")
    if not isinstance(model_type, str) or not model_type:
        return {}
    if source == "transformers" or (source == "auto" and _transformers_installed()):
        found = _transformers_defaults(model_type)
        return copy.deepcopy(found) if found is not None else {}
    return copy.deepcopy(MODEL_DEFAULTS.get(model_type, {}))


# ------------------------------------------------------------------------------------------------
# reading


def load_config(config: Any) -> tuple[dict[str, Any], str]:
    """A deep copy of ``config`` as a plain dict, and a label for messages (the file's path)."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no config file at {path!r}; pass a config.json path, a dict or a PretrainedConfig"
            )
        with open(path, "rb") as fh:
            raw = fh.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); a Hugging Face "
                "config.json is UTF-8 JSON: re-save it as UTF-8"
            ) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc}); pass a Hugging Face config.json") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} does not hold a JSON object; pass a Hugging Face config.json")
        return data, path
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config)), "the config"
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if not isinstance(data, Mapping):
            raise InputTypeError(f"config.to_dict() must return a dict, got {type(data).__name__}")
        # to_dict() returns a deep copy in transformers 4.x and 5.x; copy again to be safe
        return copy.deepcopy(dict(data)), f"the {type(config).__name__}"
    raise InputTypeError(
        f"config must be a transformers PretrainedConfig, a dict or a path to config.json, got {type(config).__name__}"
    )


def config_model_type(d: Mapping[str, Any], label: str) -> str:
    value = d.get("model_type")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"{label}: model_type must be a string, got {value!r}")
    return value


#: keys whose presence at the top level says the RoPE is described there, not in text_config
_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "head_dim")


def text_part_of(d: dict[str, Any], label: str) -> dict[str, Any]:
    """The text config of a multimodal one, the encoder's config of a composite sequence encoder, else ``d``."""
    model_type = d.get("model_type")
    part = ENCODER_PART.get(model_type) if isinstance(model_type, str) else None
    if part is not None and d.get(part) is not None:
        inner = d[part]
        if not isinstance(inner, Mapping):
            raise ConfigError(f"{label}: {part} must be a dict, got {inner!r:.80}")
        return dict(inner)
    text = d.get("text_config")
    if text is None or any(k in d for k in _ROPE_KEYS):
        return d
    if isinstance(model_type, str) and model_type in PAIRING and _text_model_type(model_type) is None:
        return d  # a text model's config (its transformers config class has no text_config): not its text part
    if not isinstance(text, Mapping):
        raise ConfigError(f"{label}: text_config must be a dict, got {text!r}")
    inner = dict(text)
    if inner.get("model_type") is None:
        outer = config_model_type(d, label)
        inner["model_type"] = _text_model_type(outer) or outer
    return inner


@functools.cache
def _text_model_type(outer: str) -> str | None:
    if outer and _transformers_installed():
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

        if outer in CONFIG_MAPPING_NAMES and "text_config" in (
            getattr(CONFIG_MAPPING[outer], "sub_configs", None) or {}
        ):
            # the wrapper's default text config (some name it only when built: Mistral-3's is an AutoConfig)
            try:
                name = getattr(getattr(CONFIG_MAPPING[outer](), "text_config", None), "model_type", None)
            except Exception:  # a wrapper that cannot build its own defaults: fall back to the table
                name = None
            if isinstance(name, str) and name:
                return name
    return TEXT_MODEL_TYPES.get(outer)


def _is_nested(block: Mapping[str, Any], layer_types: Iterable[str] | None) -> bool:
    if "rope_type" in block or "type" in block or not block:
        return False
    labels = set(layer_types or ())
    return all(isinstance(v, Mapping) or v is None for v in block.values()) and (
        bool(labels & set(block)) or not labels
    )


def head_dim_noted(exc: ConfigError, settings: RopeSettings) -> ConfigError:
    """``exc`` saying where the head width came from when the config does not state it (``settings.head_dim_from``):
    an error about a derived width ("an odd rotary dimension 3") names no key of the config by itself."""
    if not settings.head_dim_from:
        return exc
    return ConfigError(f"{exc} (head_dim={settings.head_dim} is {settings.head_dim_from})")


def _head_dim_from(d: Mapping[str, Any], stated: set[str], model_type: str) -> str:
    """Where a derived head width came from, for messages about it: ``hidden_size / num_attention_heads`` (or GPT-J's
    names), each a model type's default where the config does not state it."""
    parts = []
    for names in (("hidden_size", "n_embd"), ("num_attention_heads", "n_head")):
        key = next(k for k in names if k in d or k == names[-1])
        default = "" if key in stated else f" ({model_type}'s default: the config does not state {key})"
        parts.append(f"{key}={d.get(key)!r}{default}")
    return " / ".join(parts)


def _head_dim(d: Mapping[str, Any], label: str) -> int:
    # DeepSeek-V2/V3 (MLA) rotate only a qk_rope_head_dim-wide slice of each head
    for key in ("qk_rope_head_dim", "head_dim"):
        if d.get(key) is not None:
            value = d[key]
            if not is_positive_int(value):
                raise ConfigError(f"{label}: config {key} must be a positive int, got {value!r}")
            if value > MAX_HEAD_DIM:
                raise ConfigError(
                    f"{label}: config {key}={value} is wider than any attention head (at most "
                    f"{MAX_HEAD_DIM} channels); check the config"
                )
            if value % 2:
                raise ConfigError(f"{label}: config {key}={value} is odd; a head's channels rotate in pairs")
            return value
    hidden = d.get("hidden_size", d.get("n_embd"))
    heads = d.get("num_attention_heads", d.get("n_head"))
    if not (is_positive_int(hidden) and is_positive_int(heads)):
        model_type = d.get("model_type")
        raise ConfigError(
            f"{label}: the config states neither head_dim nor hidden_size and num_attention_heads "
            f"(got hidden_size={hidden!r}, num_attention_heads={heads!r}, and model_type {model_type!r} has no "
            "defaults for them here); add head_dim"
        )
    if hidden % heads:
        raise ConfigError(
            f"{label}: hidden_size={hidden} is not a multiple of num_attention_heads={heads}; add head_dim "
            "(channels per head)"
        )
    if (hidden // heads) % 2:
        raise ConfigError(
            f"{label}: hidden_size={hidden} / num_attention_heads={heads} gives an odd head width {hidden // heads} (a "
            "head's channels rotate in pairs); check the config or add head_dim"
        )
    if hidden // heads > MAX_HEAD_DIM:
        raise ConfigError(
            f"{label}: hidden_size={hidden} / num_attention_heads={heads} gives heads wider than any attention head "
            f"(at most {MAX_HEAD_DIM} channels); check the config or add head_dim"
        )
    return hidden // heads


def _normalised(block: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(block)
    legacy = out.pop("type", None)
    out.setdefault("rope_type", legacy if legacy is not None else "default")
    return out


def _one_block(d: dict[str, Any], model_type: str, defaults: Mapping[str, Any], label: str, strict: bool) -> Any:
    """The RoPE block: ``rope_parameters``, ``rope_scaling``, or both reconciled (disagreeing: an error, as strict)."""
    params, legacy = d.get("rope_parameters"), d.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"{label}: {key} must be a dict, got {value!r}")
    if not legacy:
        return copy.deepcopy(params) if params else {}
    if not params:
        return copy.deepcopy(legacy)
    params, legacy = copy.deepcopy(dict(params)), copy.deepcopy(dict(legacy))
    if model_type.startswith("gemma3") and _is_nested(params, d.get("layer_types")):
        # Gemma-3's config class updates the full-attention block with rope_scaling
        transformers_block = copy.deepcopy(params)
        transformers_block["full_attention"] = {**(params.get("full_attention") or {"rope_type": "default"}), **legacy}
        same = _normalised(transformers_block["full_attention"]) == _normalised(params.get("full_attention") or {})
    else:
        # the values both blocks would get from the rest of the config, so that only real differences count
        fallback = {
            "rope_theta": d.get("rope_theta", defaults.get("rope_theta", 10000.0)),
            "partial_rotary_factor": d.get("partial_rotary_factor", defaults.get("partial_rotary_factor")),
        }
        transformers_block = {**{k: v for k, v in fallback.items() if v is not None}, **legacy}
        same = _normalised({**fallback, **params}) == _normalised({**fallback, **legacy})
    if not same:
        complain(
            f"{label} has both rope_parameters={params} (transformers 5.x) and a legacy rope_scaling={legacy}; "
            "transformers 5.23 reads rope_scaling instead of rope_parameters, which would give "
            f"{transformers_block}; merge the keys you mean into rope_parameters and delete rope_scaling",
            strict,
        )
    return transformers_block


#: the model types whose transformers config class reads GPT-NeoX's names: rotary_emb_base for the base and rotary_pct
#: for the rotated part (a scaling block's own values first), and never the top-level rope_theta or
#: partial_rotary_factor
NEOX_MODEL_TYPES = ("gpt_neox", "gpt_neox_japanese")


def _neox_key(d: Mapping[str, Any], own: str, common: str, default: Any, label: str, strict: bool) -> Any:
    """GPT-NeoX's ``own`` key (null or absent: ``default``), as its config class reads it; a top-level ``common`` key
    (``rope_theta``, ``partial_rotary_factor``) the class never reads is an error where it says something else
    (``strict=False``: a warning, and the class's value)."""
    value = d.get(own)
    value = default if value is None else value
    other = d.get(common)
    if other is not None and other != value:
        complain(
            f"{label}: {common}={other!r}, but transformers' {d.get('model_type')!r} config never reads {common} and "
            f"uses {own}={value!r}; remove {common} or set {own}",
            strict,
        )
    return value


#: the model types whose attention builds its own tables (GPT-J, CodeGen): base 10000 over ``rotary_dim`` channels
#: (default 64; null: the whole head), the head width from the hidden size; no other RoPE key of the config is read
OWN_TABLE_MODEL_TYPES = ("gptj", "codegen")


def _drop_unread_keys(d: dict[str, Any], model_type: str, label: str, strict: bool) -> None:
    """Remove the RoPE keys GPT-J's and CodeGen's attention never reads from ``d``; one that says something else than
    what the attention uses is an error naming it (``strict=False``: a warning, and what the attention uses)."""
    hidden, heads = d.get("n_embd", d.get("hidden_size")), d.get("n_head", d.get("num_attention_heads"))
    width = hidden // heads if is_positive_int(hidden) and is_positive_int(heads) and hidden % heads == 0 else None
    for key in ("rope_theta", "partial_rotary_factor", "head_dim", "rope_scaling", "rope_parameters"):
        value = d.pop(key, None)
        if value is None:
            continue
        if isinstance(value, Mapping):  # a block: harmless when it states the default rotation at base 10000
            harmless = set(value) <= {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
            harmless = harmless and value.get("rope_type", value.get("type", "default")) == "default"
            harmless = harmless and value.get("rope_theta", 10_000.0) == 10_000.0
            harmless = harmless and value.get("partial_rotary_factor", 1.0) in (None, 1.0)
        elif key in ("rope_scaling", "rope_parameters"):
            harmless = False  # not a block at all
        else:
            used = {"rope_theta": 10_000.0, "partial_rotary_factor": 1.0, "head_dim": width}[key]
            harmless = value == used and not isinstance(value, bool)
        if not harmless:
            complain(
                f"{label}: {key}={value!r}, but transformers' {model_type!r} attention never reads it: it turns "
                "rotary_dim channels (default 64) of heads of n_embd / n_head at base 10000; remove it",
                strict,
            )


#: the layer types of Gemma-3's 4.x layout, whose config.json need not list them (:func:`_gemma3_blocks`)
GEMMA3_LAYER_TYPES = ("sliding_attention", "full_attention")


def _gemma3_blocks(d: dict[str, Any], block: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Gemma-3's 4.x layout (rope_theta global, rope_local_base_freq local, rope_scaling on full layers)."""
    thetas = defaults.get("layer_rope_theta") or {}
    full = _normalised(block)
    full.setdefault("rope_theta", d.get("rope_theta", thetas.get("full_attention", 1_000_000.0)))
    sliding = {
        "rope_type": "default",
        "rope_theta": d.get("rope_local_base_freq", thetas.get("sliding_attention", 10_000.0)),
    }
    return {GEMMA3_LAYER_TYPES[0]: sliding, GEMMA3_LAYER_TYPES[1]: full}


def read_hf_config(
    config: Any, *, layer_type: str | None = None, strict: bool = True, interleaved: bool | None = None
) -> RopeSettings:
    """Read the RoPE settings of a Hugging Face config into :class:`RopeSettings`, never modifying it.

    Args:
        config: a transformers config (4.x or 5.x; multimodal: its ``text_config``), a config.json path or a dict.
        layer_type: for configs with one block per attention layer type (Gemma-3), which one (required there). A
            config with one block for every layer reads alike whatever it says, unless it lists ``layer_types``
            without it.
        strict: ``False`` turns value mistakes into warnings where the frequencies stay computable.
        interleaved: the pairing of a ``model_type`` :data:`PAIRING` does not list (``True``: (2i, 2i+1)).

    Raises ``ConfigError`` for an invalid, ambiguous or unsupported config, saying what to change. Omitted values
    come from :func:`model_defaults`.

    Example:
        >>> s = read_hf_config({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        ...                     "rope_theta": 500000.0, "max_position_embeddings": 8192})
        >>> s.head_dim, s.base, s.scaling, s.interleaved
        (128, 500000.0, {'rope_type': 'default'}, False)
    """
    check_bool(strict, "strict")
    if layer_type is not None and not isinstance(layer_type, str):
        raise InputTypeError(f"layer_type must be a string or None, got {layer_type!r} ({type(layer_type).__name__})")
    d, label = load_config(config)
    d = text_part_of(d, label)
    model_type = config_model_type(d, label)
    if TEXT_MODEL_TYPES.get(model_type) in MROPE_MODELS:
        model_type = TEXT_MODEL_TYPES[model_type]  # a flat 4.x Qwen-VL config.json: the text settings at the top
    layer_type = common_keys(d, model_type, layer_type, label, strict)  # DeepSeek-V4, Gemma 4's per-layer keys
    defaults = model_defaults(model_type)
    stated = set(d)
    for key in DEFAULTED_KEYS:
        # an explicit null is "not given" (GPT-J's null rotary_dim excepted: it rotates the whole head)
        if (d.get(key) is None and key != "rotary_dim" or key not in d) and key in defaults:
            d[key] = defaults[key]
    pairing = read_pairing(d, model_type, interleaved, label)
    if model_type in OWN_TABLE_MODEL_TYPES:
        _drop_unread_keys(d, model_type, label, strict)

    if defaults and "qk_rope_head_dim" not in defaults:
        d.pop("qk_rope_head_dim", None)  # the rope head width of MLA models: another model's config never reads it
    head_dim = _head_dim(d, label)
    derived = d.get("qk_rope_head_dim") is None and d.get("head_dim") is None
    head_dim_from = _head_dim_from(d, stated, model_type) if derived else ""
    mpe = d.get("max_position_embeddings", d.get("n_positions"))
    if mpe is not None and not is_positive_int(mpe):
        raise ConfigError(f"{label}: max_position_embeddings must be a positive int (a length in tokens), got {mpe!r}")

    block = _one_block(d, model_type, defaults, label, strict)
    layer_types = d.get("layer_types")
    if layer_types is not None and not (
        isinstance(layer_types, (list, tuple)) and all(isinstance(t, str) for t in layer_types)
    ):
        raise ConfigError(f"{label}: layer_types must be a list of strings, got {layer_types!r}")
    if not block and defaults.get("rope_parameters"):
        # the class's default block (gpt-oss: its YaRN), which transformers uses whatever base the config states
        block = dict(defaults["rope_parameters"])
        top_theta = d.get("rope_theta")
        if "rope_theta" in block and top_theta is not None and top_theta != block["rope_theta"]:
            complain(
                f"{label}: rope_theta={top_theta!r}, but transformers' {model_type!r} config gives a config without a "
                f"RoPE block its default block, whose base {block['rope_theta']!r} it keeps; state the base in "
                "rope_parameters (with the block) or remove rope_theta",
                strict,
            )
    if model_type.startswith("gemma3") and not _is_nested(block, layer_types):
        block = _gemma3_blocks(d, block, defaults)
    if _is_nested(block, layer_types):
        available = sorted(k for k, v in block.items() if v is not None)
        if layer_type is None:
            raise ConfigError(
                f"{label}: this config has one RoPE block per layer type ({', '.join(available)}); pass "
                "layer_type= one of them"
            )
        if block.get(layer_type) is None:
            raise ConfigError(
                f"{label}: layer_type {layer_type!r} has no RoPE block; choose one of {', '.join(available)}"
            )
        layer_theta = (defaults.get("layer_rope_theta") or {}).get(layer_type)
        block = dict(block[layer_type])
        if layer_theta is not None:
            block.setdefault("rope_theta", layer_theta)
    elif layer_type is not None and layer_types and layer_type not in layer_types:
        raise ConfigError(
            f"{label}: layer_type {layer_type!r} is not in the config's layer_types {sorted(set(layer_types))}"
        )
    legacy = block.get("type")
    # 4.x names of the same type: M-RoPE's "mrope" (its frequencies are default's), Phi-3's "su" and "yarn" (longrope)
    aliases = {"mrope": "default", **({"su": "longrope", "yarn": "longrope"} if model_type == "phi3" else {})}
    if legacy is not None and "rope_type" in block:
        named = [aliases.get(t, t) if isinstance(t, str) else t for t in (block["rope_type"], legacy)]
        if named[0] != named[1]:
            complain(
                f"{label}: the block sets both rope_type={block['rope_type']!r} and type={legacy!r}; keep one", strict
            )
    block = _normalised(block)
    block["rope_type"] = canonical_rope_type(block)  # HunYuan's "dynamic" block with alpha is ntk_alpha
    mrope_section, mrope_layout = read_mrope(block, model_type, label, strict)
    drop_ignored_keys(block, defaults.get("rope_ignore_keys", ()), model_type, label, strict=strict)
    if model_type == "phi3" and block["rope_type"] in ("su", "yarn"):
        block["rope_type"] = "longrope"  # Phi-3's early names for LongRoPE, as transformers renames them

    base = block.pop("rope_theta", None)
    if base is None and model_type in NEOX_MODEL_TYPES:
        base = _neox_key(d, "rotary_emb_base", "rope_theta", defaults.get("rope_theta", 10_000.0), label, strict)
    elif base is None:
        # rotary_emb_base is GPT-NeoX's name: read for a model_type transformers does not know, not for another one
        fallback = d.get("rotary_emb_base") if model_type not in PAIRING and not defaults else None
        base = d.get("rope_theta", fallback if fallback is not None else defaults.get("rope_theta", 10_000.0))
    if not is_number(base) or base <= 0:
        raise ConfigError(f"{label}: rope_theta must be a finite number > 0, got {base!r}")

    rotary_dim = None
    if "partial_rotary_factor" not in block:
        if model_type in NEOX_MODEL_TYPES:
            part = _neox_key(
                d, "rotary_pct", "partial_rotary_factor", defaults.get("partial_rotary_factor"), label, strict
            )
            if part is not None:
                block["partial_rotary_factor"] = part
        elif d.get("partial_rotary_factor") is not None:
            block["partial_rotary_factor"] = d["partial_rotary_factor"]
        elif "rotary_pct" in d and model_type not in PAIRING and not defaults:
            block["partial_rotary_factor"] = d["rotary_pct"]  # GPT-NeoX's name, in a config of an unknown model_type
        elif model_type in OWN_TABLE_MODEL_TYPES:
            # GPT-J and CodeGen state the width (default 64; null rotates the whole head)
            rotary_dim = d.get("rotary_dim", 64)
            if rotary_dim is not None and not is_positive_int(rotary_dim):
                raise ConfigError(f"{label}: config rotary_dim must be a positive int, got {rotary_dim!r}")
        elif defaults.get("partial_rotary_factor") is not None:
            block["partial_rotary_factor"] = defaults["partial_rotary_factor"]
    if d.get("qk_rope_head_dim") is not None and block.get("partial_rotary_factor") not in (None, 1, 1.0):
        # MLA models (Mistral-4) state the rope slice twice: head_dim * partial_rotary_factor == qk_rope_head_dim
        partial, full = block.pop("partial_rotary_factor"), d.get("head_dim")
        if not (is_number(partial) and 0 < partial <= 1 and is_positive_int(full) and int(full * partial) == head_dim):
            raise ConfigError(
                f"{label}: qk_rope_head_dim={head_dim} but head_dim={full!r} * partial_rotary_factor={partial!r} "
                "rotates a different width; make them agree"
            )

    partial = block.get("partial_rotary_factor")
    if block["rope_type"] == "default" and model_type in PAIRING and model_type not in PARTIAL_READERS:
        if partial is not None and not (is_number(partial) and partial == 1):  # whatever it says: never read
            complain(
                f"{label}: partial_rotary_factor={partial!r} with rope_type 'default', but transformers' "
                f"{model_type!r} model never reads it and rotates the whole head; remove it",
                strict,
            )
            del block["partial_rotary_factor"]  # strict=False: what transformers rotates

    rope_type = ROPE_TYPES.get(block["rope_type"]) if isinstance(block["rope_type"], str) else None
    rt = block["rope_type"]
    if rope_type is not None and rope_type.trained_length:
        if d.get("original_max_position_embeddings") is not None:
            # transformers lets a top-level original_max_position_embeddings (Phi-3) win over the block's
            block["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        elif block.get("original_max_position_embeddings") is None and mpe is not None:
            complain(
                f"{label}: rope_type {rt!r} block has no original_max_position_embeddings (the trained context "
                f"length); add it (transformers would use max_position_embeddings={mpe})",
                strict,
            )
            block["original_max_position_embeddings"] = mpe
    if mpe is not None and rope_type is not None:
        if "max_position_embeddings" in rope_type.required | rope_type.optional:
            block.setdefault("max_position_embeddings", mpe)
    rope_layers = read_rope_layers(d, model_type, label)
    nope_temperature = None
    if model_type == "llama4_text" and rope_layers is not None and not all(rope_layers):
        if d.get("attn_temperature_tuning", True):  # the defaults of transformers' Llama4TextConfig
            nope_temperature = {"floor_scale": d.get("floor_scale", 8192), "attn_scale": d.get("attn_scale", 0.1)}
    return RopeSettings(
        head_dim=head_dim,
        base=float(base),
        scaling=block,
        rotary_dim=rotary_dim,
        interleaved=pairing,
        max_position_embeddings=mpe,
        model_type=model_type,
        mrope_section=mrope_section,
        mrope_interleaved=mrope_layout == "interleaved",
        mrope_layout=mrope_layout,
        rope_layers=rope_layers,
        nope_temperature=nope_temperature,
        head_dim_from=head_dim_from,
    )
