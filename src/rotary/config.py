"""Reading RoPE settings from Hugging Face configs (transformers 4.x and 5.x) and validating them.

Two config generations exist on the Hub. 4.x writes ``rope_theta`` next to a ``rope_scaling`` block
whose type key is ``type`` (later ``rope_type``); 5.x writes ``rope_parameters`` with ``rope_theta``
(and ``partial_rotary_factor``) inside, possibly nested per attention layer type (Gemma-3:
``{"sliding_attention": {...}, "full_attention": {...}}``). Both are read here into one
:class:`RopeSettings`, without touching the object given (transformers' own standardisation
mutates the config in place).

transformers only logs most mistakes in these blocks; here each one is a :class:`ConfigError`
whose message says what to change, unless ``strict=False`` turns it into a warning.
"""

from __future__ import annotations

import copy
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConfigError",
    "ROPE_PARAMETER_KEYS",
    "RopeSettings",
    "validate_rope_parameters",
    "rotary_dim_from",
    "read_hf_config",
]


class ConfigError(ValueError):
    """A RoPE configuration that cannot be right; the message names the value and the fix."""


#: keys any block may carry, whatever its type
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})

#: rope_type -> (required keys, optional keys), Hugging Face's names. ``max_position_embeddings`` is
#: the model's context length (a config attribute in transformers, a block key here).
ROPE_PARAMETER_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "default": (frozenset(), frozenset()),
    "linear": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor", "max_position_embeddings"}), frozenset()),
    "ntk": (frozenset({"factor"}), frozenset()),
    "yarn": (
        frozenset({"factor", "original_max_position_embeddings"}),
        frozenset(
            {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", "max_position_embeddings"}
        ),
    ),
    "longrope": (
        frozenset({"short_factor", "long_factor", "original_max_position_embeddings"}),
        frozenset({"factor", "attention_factor", "max_position_embeddings"}),
    ),
    "llama3": (
        frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
        frozenset(),
    ),
    "proportional": (frozenset(), frozenset({"factor"})),
}


#: what a required key means, for the error naming it
KEY_MEANINGS = {
    "factor": "the context extension ratio (new length / trained length), >= 1",
    "max_position_embeddings": "the model's context length (config.max_position_embeddings)",
    "original_max_position_embeddings": "the context length the model was pretrained with",
    "low_freq_factor": "Llama 3.1 uses 1.0",
    "high_freq_factor": "Llama 3.1 uses 4.0",
    "short_factor": "one rescale factor per rotated pair, for sequences within the trained length",
    "long_factor": "one rescale factor per rotated pair, for longer sequences",
}


def _complain(message: str, strict: bool) -> None:
    if strict:
        raise ConfigError(message)
    warnings.warn(message + " (accepted because strict=False)", UserWarning, stacklevel=3)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_positive_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _owners(key: str) -> list[str]:
    return sorted(t for t, (req, opt) in ROPE_PARAMETER_KEYS.items() if key in req or key in opt)


def rotary_dim_from(head_dim: int, params: Mapping[str, Any], *, strict: bool = True) -> int:
    """Channels rotated: ``int(head_dim * partial_rotary_factor)`` (Hugging Face's rounding).

    An odd result is a :class:`ConfigError`; with ``strict=False`` it is returned as is (a warning),
    and the frequencies follow transformers, which then rotates ``rotary_dim + 1`` channels.
    """
    factor = params.get("partial_rotary_factor", 1.0)
    if factor is None:
        factor = 1.0
    if not _is_number(factor) or not 0 < factor <= 1:
        raise ConfigError(f"partial_rotary_factor must be a number in (0, 1], got {factor!r}")
    dim = int(head_dim * factor)
    if dim < 2:
        raise ConfigError(
            f"partial_rotary_factor={factor} with head_dim={head_dim} rotates {dim} channels; raise it so that "
            "at least 2 channels rotate"
        )
    if dim % 2:
        _complain(
            f"head_dim={head_dim} * partial_rotary_factor={factor} gives an odd rotary dimension {dim}; channels "
            f"rotate in pairs, so pick partial_rotary_factor giving an even count (e.g. {(dim - 1) / head_dim:g} "
            f"for {dim - 1} channels)",
            strict,
        )
    return dim


def validate_rope_parameters(
    params: Mapping[str, Any],
    *,
    rotary_dim: int,
    valid_types: Iterable[str],
    strict: bool = True,
) -> dict[str, Any]:
    """Check a scaling block against its ``rope_type`` and return a normalised copy.

    The copy has ``rope_type`` set (the 4.x key ``type`` is read and dropped). Types registered
    without an entry in :data:`ROPE_PARAMETER_KEYS` get no key checks.

    Args:
        params: the block, e.g. ``{"rope_type": "linear", "factor": 4.0}``.
        rotary_dim: channels rotated (the length LongRoPE's factor lists are checked against is
            ``rotary_dim // 2``).
        valid_types: the registered rope_types.
        strict: ``False`` turns the value checks into warnings (unknown types and missing keys stay
            errors: the frequencies cannot be computed without them).

    Raises:
        ConfigError: with a message naming the key, the value and what to change.

    Example:
        >>> validate_rope_parameters({"type": "linear", "factor": 2}, rotary_dim=64, valid_types=["linear"])
        {'factor': 2, 'rope_type': 'linear'}
    """
    if not isinstance(params, Mapping):
        raise ConfigError(f"the scaling block must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {params!r}")
    out = dict(params)
    legacy = out.pop("type", None)
    rope_type = out.get("rope_type", legacy if legacy is not None else "default")
    if legacy is not None and rope_type != legacy:
        _complain(f"the block sets both rope_type={rope_type!r} and type={legacy!r}; keep one", strict)
    out["rope_type"] = rope_type
    valid = sorted(valid_types)
    if rope_type not in valid:
        raise ConfigError(f"unknown rope_type {rope_type!r}; valid rope_types: {', '.join(valid)}")
    if rope_type not in ROPE_PARAMETER_KEYS:
        return out
    required, optional = ROPE_PARAMETER_KEYS[rope_type]

    # yarn's factor may be an explicit null: transformers then takes the ratio of the two lengths
    missing = sorted(k for k in required if out.get(k) is None and not (k == "factor" and rope_type == "yarn" and k in out))
    if missing:
        hints = "".join(f"; {k}: {KEY_MEANINGS[k]}" for k in missing if k in KEY_MEANINGS)
        raise ConfigError(f"rope_type {rope_type!r} needs the key(s) {missing}; add them to the scaling block{hints}")
    for key in sorted(set(out) - required - optional - COMMON_KEYS):
        owners = _owners(key)
        if owners:
            _complain(
                f"key {key!r} belongs to rope_type {' / '.join(owners)}, not {rope_type!r}; remove it or set "
                f"rope_type to {owners[0]!r}",
                strict,
            )
        else:
            allowed = sorted(required | optional | {"rope_theta", "partial_rotary_factor"})
            _complain(f"unknown key {key!r} for rope_type {rope_type!r}; valid keys: {', '.join(allowed)}", strict)

    _check_values(out, rope_type, rotary_dim, strict)
    return out


def _check_values(p: dict[str, Any], rope_type: str, rotary_dim: int, strict: bool) -> None:
    factor = p.get("factor")
    if "factor" in p and not (factor is None and rope_type in ("yarn", "longrope", "proportional")):
        if not _is_number(factor):
            _complain(f"factor must be a number >= 1 for rope_type {rope_type!r}, got {factor!r}", strict)
        elif factor < 1:
            _complain(
                f"factor={factor} < 1 for rope_type {rope_type!r} would shrink the context; use factor >= 1 "
                "(the ratio of the new context length to the trained one)",
                strict,
            )
    for key in ("original_max_position_embeddings", "max_position_embeddings"):
        if key in p and not _is_positive_int(p[key]):
            message = f"{key} must be a positive int (a length in tokens), got {p[key]!r}"
            if not (_is_number(p[key]) and p[key] > 0):
                raise ConfigError(message)  # no length to compute with, even leniently
            _complain(message, strict)
    if rope_type == "yarn":
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if p.get(key) is not None and not _is_number(p[key]):
                _complain(f"{key} must be a number, got {p[key]!r}", strict)
        # transformers reads a missing (or falsy) beta as its default: 32 / 1
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
        if _is_number(beta_fast) and _is_number(beta_slow) and beta_fast <= beta_slow:
            _complain(
                f"beta_fast={beta_fast} must be greater than beta_slow={beta_slow} (YaRN's defaults are 32 and 1); "
                "swap or fix them",
                strict,
            )
        if "truncate" in p and not isinstance(p["truncate"], bool):
            _complain(f"truncate must be true or false, got {p['truncate']!r}", strict)
    if rope_type in ("yarn", "longrope"):
        att = p.get("attention_factor")
        if att is not None and (not _is_number(att) or att <= 0):
            _complain(f"attention_factor must be a number > 0, got {att!r}", strict)
    if rope_type in ("yarn", "longrope") and p.get("factor") is None and p.get("max_position_embeddings") is None:
        raise ConfigError(
            f"rope_type {rope_type!r} needs 'factor' or 'max_position_embeddings' (factor defaults to "
            "max_position_embeddings / original_max_position_embeddings); add one of them"
        )
    if rope_type == "longrope":
        expected = (rotary_dim + 1) // 2
        for key in ("short_factor", "long_factor"):
            value = p[key]
            if not (isinstance(value, (list, tuple)) and all(_is_number(x) for x in value)):
                raise ConfigError(f"{key} must be a list of {expected} numbers, got {value!r}")
            if len(value) != expected:  # not computable: an error even with strict=False
                raise ConfigError(
                    f"{key} has {len(value)} entries but rotary_dim={rotary_dim} needs {expected} (one per pair); "
                    "give one factor per rotated pair"
                )
    if rope_type == "llama3":
        low, high = p["low_freq_factor"], p["high_freq_factor"]
        for key, value in (("low_freq_factor", low), ("high_freq_factor", high)):
            if not _is_number(value):
                _complain(f"{key} must be a number, got {value!r}", strict)
        if _is_number(low) and _is_number(high) and low >= high:
            _complain(
                f"low_freq_factor={low} must be smaller than high_freq_factor={high} (Llama 3.1 uses 1 and 4); "
                "swap or fix them",
                strict,
            )
    if rope_type in ("dynamic", "ntk") and rotary_dim <= 2:
        raise ConfigError(
            f"rope_type {rope_type!r} scales the base by factor ** (d / (d - 2)), undefined for rotary_dim={rotary_dim}; "
            "use rotary_dim >= 4"
        )


# ------------------------------------------------------------------------------------------------
# reading Hugging Face configs

#: model_types whose attention pairs channels (2i, 2i+1); every other architecture pairs (i, i + r/2)
INTERLEAVED_MODEL_TYPES = frozenset({"gptj", "roformer", "cohere", "cohere2", "glm", "glm4", "chatglm"})
#: rope_types that need the pretraining length original_max_position_embeddings (which transformers fills in)
_TRAINED_LENGTH_TYPES = ("llama3", "yarn", "longrope")


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
            if not _is_positive_int(value):
                raise ConfigError(f"config {key} must be a positive int, got {value!r}")
            return value
    hidden = d.get("hidden_size", d.get("n_embd"))
    heads = d.get("num_attention_heads", d.get("n_head"))
    if not (_is_positive_int(hidden) and _is_positive_int(heads)):
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
    if not _is_number(base) or base <= 0:
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
            if rotary_dim is not None and not _is_positive_int(rotary_dim):
                raise ConfigError(f"config rotary_dim must be a positive int, got {rotary_dim!r}")

    rt = block["rope_type"]
    if rt in _TRAINED_LENGTH_TYPES:
        if d.get("original_max_position_embeddings") is not None:
            # transformers lets a top-level original_max_position_embeddings (Phi-3) win over the block's
            block["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        elif block.get("original_max_position_embeddings") is None and mpe is not None:
            _complain(
                f"rope_type {rt!r} block has no original_max_position_embeddings (the trained context length); "
                f"add it (transformers would use max_position_embeddings={mpe})",
                strict,
            )
            block["original_max_position_embeddings"] = mpe
    if mpe is not None and rt in ROPE_PARAMETER_KEYS:
        required, optional = ROPE_PARAMETER_KEYS[rt]
        if "max_position_embeddings" in required | optional:
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
