"""The ``rope_type`` registry: per type, its init function, accepted keys, value checks, length dependence and a
plot example; and the value checks the built-in types share.

An init function has Hugging Face's ``modeling_rope_utils`` shape, with plain values instead of a config::

    fn(head_dim, base, rotary_dim, params, seq_len) -> (inv_freq [rotary_dim // 2] fp32, attention_scaling)

A user type is one decorator (:func:`register_rope_type`) away and gets the built-ins' key checks, messages,
config reading and plots; length-dependent types are recomputed by :mod:`rotary.schedule`.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._checks import check_bool, check_positive_int, is_int, is_number
from .._registry import Registry
from ..errors import ConfigError, InputError, InputTypeError

__all__ = [
    "ConfigError",
    "RopeType",
    "RopeExample",
    "ROPE_TYPES",
    "ROPE_INIT_FUNCTIONS",
    "register_rope_type",
    "default_inv_freq",
    "rotary_dim_from",
    "validate_rope_parameters",
    "canonical_rope_type",
    "complain",
    "check_factor",
    "optional_number",
]


RopeInitFn = Callable[[int, float, int, Mapping[str, Any], Any], "tuple[torch.Tensor, float]"]
#: ``check(params, rotary_dim, complain)``: value checks of one type; ``complain(message)`` raises a
#: :class:`ConfigError` (or warns when ``strict=False``); raise ``ConfigError`` directly for values
#: nothing can be computed from.
RopeCheckFn = Callable[[dict[str, Any], int, Callable[[str], None]], None]


@dataclass(frozen=True)
class RopeExample:
    """Illustrative parameters of a type, for ``rotary plot scaling`` without a config."""

    block: dict[str, Any]
    base: float = 10000.0
    max_position: int = 4096
    #: the sequence length to show a length-dependent type at
    seq_len: int | None = None
    note: str = ""


@dataclass(frozen=True)
class RopeType:
    """One registered ``rope_type``; the fields are :func:`register_rope_type`'s arguments.

    Attributes:
        name, init: the ``rope_type`` string; the init function (see the module docstring).
        required, optional: keys the block must carry; further keys it may carry (besides the common keys).
        check, example: value checks beyond presence; ``head_dim -> RopeExample`` for plots (either ``None``).
        length_dependent: the frequencies depend on ``seq_len``; then ``target_length`` (``params -> the longest
            length the block is for``), ``update`` (``"grow"``: dynamic NTK; ``"switch"``: LongRoPE's two sets, replayed
            by :class:`rotary.schedule.FrequencySchedule`) and ``trained_key`` (the trained length's key).
        trained_length: the type needs ``original_max_position_embeddings`` (filled from the config's top level).
        rotates_every_pair: ``partial_rotary_factor`` parameterises the frequencies, not the width (``proportional``).
        check_keys: refuse keys outside ``required``, ``optional`` and the common ones (``None``: when the type
            states a key set or a check).
    """

    name: str
    init: RopeInitFn
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    check: RopeCheckFn | None = None
    length_dependent: bool = False
    trained_length: bool = False
    rotates_every_pair: bool = False
    example: Callable[[int], RopeExample] | None = None
    target_length: Callable[[Mapping[str, Any]], int] | None = None
    update: Literal["grow", "switch"] = "grow"
    trained_key: str = "max_position_embeddings"
    check_keys: bool = True


#: the update rules of length-dependent types, and the block key each reads the trained length from by default
UPDATE_RULES = {"grow": "max_position_embeddings", "switch": "original_max_position_embeddings"}

#: ``rope_type`` -> :class:`RopeType`. Extended by :func:`register_rope_type`; ``with ROPE_TYPES.scope():``
#: undoes the registrations made inside the block.
ROPE_TYPES: Registry[RopeType] = Registry()

#: keys any block may carry, whatever its type
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


def register_rope_type(
    name: str,
    *,
    required: Iterable[str] = (),
    optional: Iterable[str] = (),
    check: RopeCheckFn | None = None,
    length_dependent: bool = False,
    trained_length: bool = False,
    rotates_every_pair: bool = False,
    example: Callable[[int], RopeExample] | None = None,
    target_length: Callable[[Mapping[str, Any]], int] | None = None,
    update: Literal["grow", "switch"] = "grow",
    trained_key: str | None = None,
    check_keys: bool | None = None,
) -> Callable[[RopeInitFn], RopeInitFn]:
    """Decorator registering an init function as ``rope_type`` ``name`` (replacing any previous one; see RopeType).

    Example:
        >>> @register_rope_type("doc-halved", required={"factor"})
        ... def _halved(head_dim, base, rotary_dim, params, seq_len):
        ...     return default_inv_freq(base, rotary_dim) / params["factor"], 1.0
        >>> ROPE_TYPES["doc-halved"].required
        frozenset({'factor'})
        >>> del ROPE_TYPES["doc-halved"]
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"a rope_type name must be a non-empty string, got {name!r}")
    keys: dict[str, frozenset[str]] = {}
    for what, given in (("required", required), ("optional", optional)):
        # a string is iterable: required="factor" would become the keys 'f', 'a', 'c', ...
        if (
            isinstance(given, (str, bytes))
            or not isinstance(given, Iterable)
            or not all(isinstance(k, str) for k in given)
        ):
            raise InputTypeError(f"{what} must be a collection of key names, e.g. {{'factor'}}, got {given!r}")
        keys[what] = frozenset(given)
    for what, fn in (("check", check), ("example", example), ("target_length", target_length)):
        if fn is not None and not callable(fn):
            raise InputTypeError(f"{what} must be a function or None, got {fn!r}")
    length_dependent = check_bool(length_dependent, "length_dependent")
    if check_keys is None:
        check_keys = bool(keys["required"] or keys["optional"] or check)
    check_keys = check_bool(check_keys, "check_keys")
    trained_length, rotates_every_pair = (
        check_bool(trained_length, "trained_length"),
        check_bool(rotates_every_pair, "rotates_every_pair"),
    )
    if update not in UPDATE_RULES:
        raise InputError(f"update must be 'grow' (dynamic NTK's rule) or 'switch' (LongRoPE's), got {update!r}")
    trained_key = UPDATE_RULES[update] if trained_key is None else trained_key
    if length_dependent and trained_key not in keys["required"]:
        raise InputError(
            f"rope_type {name!r} is length-dependent: its block must hold the trained length the {update!r} rule "
            f"compares with; add {trained_key!r} to required= (or name the key that holds it with trained_key=)"
        )

    def deco(fn: RopeInitFn) -> RopeInitFn:
        if not callable(fn):
            raise InputTypeError(f"register_rope_type({name!r}) decorates an init function, got {fn!r}")
        ROPE_TYPES[name] = RopeType(
            name,
            fn,
            keys["required"],
            keys["optional"],
            check,
            length_dependent,
            trained_length,
            rotates_every_pair,
            example,
            target_length,
            update,
            trained_key,
            check_keys,
        )
        return fn

    return deco


class _InitFunctions(MutableMapping):
    """``rope_type`` -> init function, a live view of :data:`ROPE_TYPES` (Hugging Face's name)."""

    def __getitem__(self, name: str) -> RopeInitFn:
        return ROPE_TYPES[name].init

    def __setitem__(self, name: str, fn: RopeInitFn) -> None:
        register_rope_type(name, check_keys=False)(fn)

    def __delitem__(self, name: str) -> None:
        del ROPE_TYPES[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(ROPE_TYPES))

    def __len__(self) -> int:
        return len(ROPE_TYPES)

    def __repr__(self) -> str:
        return f"ROPE_INIT_FUNCTIONS({sorted(ROPE_TYPES)})"


#: ``rope_type`` -> init function (a view of :data:`ROPE_TYPES`; assigning registers a type without checks)
ROPE_INIT_FUNCTIONS: MutableMapping[str, RopeInitFn] = _InitFunctions()


def complain(message: str, strict: bool) -> None:
    """Raise :class:`ConfigError`, or warn when ``strict`` is ``False``."""
    if strict:
        raise ConfigError(message)
    warnings.warn(message + " (accepted because strict=False)", UserWarning, stacklevel=3)


def default_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    """``1 / base ** (arange(0, r, 2) / r)`` in fp32, bit-identical to Hugging Face (checkpoints trained with it).

    Example:
        >>> default_inv_freq(10000.0, 128)[:3]
        tensor([1.0000, 0.8660, 0.7499])
    """
    # device="cpu": frequencies are always computed on the CPU (also inside `with torch.device("meta")`)
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / rotary_dim
    return 1.0 / (base**exponent)


def rotary_dim_from(head_dim: int, params: Mapping[str, Any], *, strict: bool = True) -> int:
    """Channels rotated: ``int(head_dim * partial_rotary_factor)``; odd: ConfigError (``strict=False``: a warning)."""
    factor = params.get("partial_rotary_factor", 1.0)
    if factor is None:
        factor = 1.0
    if not is_number(factor) or not 0 < factor <= 1:
        raise ConfigError(f"partial_rotary_factor must be a number in (0, 1], got {factor!r}")
    dim = int(head_dim * factor)
    if dim < 2:
        raise ConfigError(
            f"partial_rotary_factor={factor} with head_dim={head_dim} rotates {dim} channels; raise it so that "
            "at least 2 channels rotate"
        )
    if dim % 2:
        complain(
            f"head_dim={head_dim} * partial_rotary_factor={factor} gives an odd rotary dimension {dim}; channels "
            f"rotate in pairs, so pick partial_rotary_factor giving an even count (e.g. {(dim - 1) / head_dim:g} "
            f"for {dim - 1} channels)",
            strict,
        )
    return dim


#: what a required key means, for the error naming it
KEY_MEANINGS = {
    "factor": "the context extension ratio (new length / trained length), >= 1",
    "max_position_embeddings": "the model's context length (config.max_position_embeddings)",
    "original_max_position_embeddings": "the context length the model was pretrained with",
    "low_freq_factor": "Llama 3.1 uses 1.0",
    "high_freq_factor": "Llama 3.1 uses 4.0",
    "short_factor": "one rescale factor per rotated pair, for sequences within the trained length",
    "long_factor": "one rescale factor per rotated pair, for longer sequences",
    "alpha": "the base grows by alpha ** (d / (d - 2)); HunYuan uses 1000",
}


def canonical_rope_type(block: Mapping[str, Any]) -> Any:
    """The ``rope_type`` a block means: ``rope_type`` (4.x: ``type``); ``"dynamic"`` with ``alpha`` is ``"ntk_alpha"``.

    HunYuan labels its fixed NTK stretch ``"dynamic"`` with ``alpha`` (docs/scaling.md, ``ntk_alpha``).

    Example:
        >>> canonical_rope_type({"type": "dynamic", "alpha": 1000.0, "factor": 1.0})
        'ntk_alpha'
    """
    legacy = block.get("type")
    rope_type = block.get("rope_type", legacy if legacy is not None else "default")
    if rope_type == "dynamic" and block.get("alpha"):
        return "ntk_alpha"
    return rope_type


def _owners(key: str) -> list[str]:
    return sorted(t.name for t in ROPE_TYPES.values() if key in t.required or key in t.optional)


def validate_rope_parameters(
    params: Mapping[str, Any],
    *,
    rotary_dim: int,
    valid_types: Iterable[str] | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Check a scaling block against its ``rope_type``; a normalised copy (``rope_type`` set, ``type`` dropped).

    ``rotary_dim``: channels rotated (LongRoPE's lists need ``rotary_dim // 2`` entries); ``valid_types``: default
    every registered type; ``strict=False`` turns value checks into warnings (unknown types and missing keys stay
    errors). Raises ``ConfigError`` naming the key, the value and what to change.

    Example:
        >>> validate_rope_parameters({"type": "linear", "factor": 2}, rotary_dim=64)
        {'factor': 2, 'rope_type': 'linear'}
    """
    if not isinstance(params, Mapping):
        raise ConfigError(
            f"the scaling block must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {params!r}"
        )
    check_bool(strict, "strict")
    check_positive_int(rotary_dim, "rotary_dim")
    out = copy.deepcopy(dict(params))
    legacy = out.pop("type", None)
    rope_type = out.get("rope_type", legacy if legacy is not None else "default")
    if legacy is not None and rope_type != legacy:
        complain(f"the block sets both rope_type={rope_type!r} and type={legacy!r}; keep one", strict)
    if rope_type == "dynamic" and out.get("alpha"):
        rope_type = "ntk_alpha"  # HunYuan's static NTK-alpha, labelled "dynamic" (see canonical_rope_type)
    out["rope_type"] = rope_type
    valid = sorted(ROPE_TYPES if valid_types is None else valid_types)
    if not isinstance(rope_type, str) or rope_type not in valid or rope_type not in ROPE_TYPES:
        raise ConfigError(f"unknown rope_type {rope_type!r}; valid rope_types: {', '.join(valid)}")
    spec = ROPE_TYPES[rope_type]
    if not spec.check_keys:  # registered without key sets or checks (e.g. ROPE_INIT_FUNCTIONS[k] = fn)
        return out

    # yarn's factor may be an explicit null: transformers then takes the ratio of the two lengths
    missing = sorted(
        k for k in spec.required if out.get(k) is None and not (k == "factor" and rope_type == "yarn" and k in out)
    )
    if missing:
        hints = "".join(f"; {k}: {KEY_MEANINGS[k]}" for k in missing if k in KEY_MEANINGS)
        raise ConfigError(f"rope_type {rope_type!r} needs the key(s) {missing}; add them to the scaling block{hints}")
    for key in sorted(set(out) - spec.required - spec.optional - COMMON_KEYS):
        owners = _owners(key)
        if owners:
            complain(
                f"key {key!r} belongs to rope_type {' / '.join(owners)}, not {rope_type!r}; remove it or set "
                f"rope_type to {owners[0]!r}",
                strict,
            )
        else:
            allowed = sorted(spec.required | spec.optional | {"rope_theta", "partial_rotary_factor"})
            complain(f"unknown key {key!r} for rope_type {rope_type!r}; valid keys: {', '.join(allowed)}", strict)

    for key in ("original_max_position_embeddings", "max_position_embeddings"):
        if key in out and not (is_int(out[key]) and out[key] > 0):
            message = f"{key} must be a positive int (a length in tokens), got {out[key]!r}"
            if not (is_number(out[key]) and out[key] >= 1):
                raise ConfigError(message)  # no length to compute with (less than one token), even leniently
            complain(message, strict)
    if spec.check is not None:
        spec.check(out, rotary_dim, lambda message: complain(message, strict))
    return out


# ------------------------------------------------------------------------------------------------
# shared checks


def optional_number(p: Mapping[str, Any], key: str, rope_type: str, *, allowed: str) -> float | None:
    """``p[key]`` checked to be a finite real number (even with ``strict=False``); ``None`` when absent or null."""
    value = p.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise ConfigError(
            f"{key} of rope_type {rope_type!r} must be a finite number ({allowed}), got "
            f"{value!r} ({type(value).__name__})"
        )
    return value


def check_factor(p: dict[str, Any], rope_type: str, complain: Callable[[str], None], *, nullable: bool = False) -> None:
    """``p["factor"]``, when present, is a number >= 1 (below 1: ``complain``; ``nullable``: ``None`` is allowed)."""
    if "factor" not in p or (nullable and p["factor"] is None):
        return
    if p["factor"] is None:
        raise ConfigError(f"factor of rope_type {rope_type!r} must be a number >= 1, got None")
    factor = optional_number(
        p, "factor", rope_type, allowed=">= 1, the ratio of the new context length to the trained one"
    )
    if factor <= 0:
        raise ConfigError(
            f"factor={factor} for rope_type {rope_type!r} must be > 0 (the frequencies are divided by it); use "
            "factor >= 1, the ratio of the new context length to the trained one"
        )
    if factor < 1:
        complain(
            f"factor={factor} < 1 for rope_type {rope_type!r} would shrink the context; use factor >= 1 "
            "(the ratio of the new context length to the trained one)"
        )
