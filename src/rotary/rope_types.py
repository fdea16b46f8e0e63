"""The ``rope_type`` registry: per type, its init function, accepted keys, value checks, length
dependence and an example for plots; and the built-in types, each init function beside its checks.

An init function has Hugging Face's ``modeling_rope_utils`` shape, but takes plain values instead of
reading (and mutating) a config object::

    fn(head_dim, base, rotary_dim, params, seq_len) -> (inv_freq [rotary_dim // 2] fp32, attention_scaling)

A user type is one decorator away::

    @register_rope_type("halved", required={"factor"}, check=my_check)
    def _halved(head_dim, base, rotary_dim, params, seq_len):
        return default_inv_freq(base, rotary_dim) / params["factor"], 1.0

and then gets the same key checks, error messages, ``from_hf_config`` reading and plotting as the
built-ins. Types with ``length_dependent=True`` are recomputed for the current sequence length by
:mod:`rotary.schedule`.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ._checks import check_bool, check_positive_int, is_int, is_number
from .errors import ConfigError

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
    "proportional_pairs",
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
    """One registered ``rope_type``.

    Attributes:
        name: the ``rope_type`` string.
        init: the init function (see the module docstring).
        required: keys the block must carry.
        optional: further keys it may carry (any block may carry ``rope_type``, ``type``,
            ``rope_theta`` and ``partial_rotary_factor``).
        check: value checks beyond presence, or ``None``.
        length_dependent: the frequencies depend on the current sequence length (``seq_len``).
        trained_length: the type needs ``original_max_position_embeddings`` (reading a config fills
            it from the config's top level, as transformers does).
        rotates_every_pair: ``partial_rotary_factor`` is a parameter of the frequencies (pairs past
            it get frequency 0), not the rotated width (Gemma's ``proportional``).
        example: ``head_dim -> RopeExample`` for plots, or ``None``.
        target_length: for length-dependent types, ``params -> the longest sequence length the block
            is meant for``; :func:`rotary.frequencies` checks the frequencies there too, so a block
            whose frequencies overflow only at long lengths is refused when it is read.
        update: for length-dependent types, how the frequencies follow the length (one of
            transformers' two rules, replayed by :class:`rotary.schedule.FrequencySchedule`):
            ``"grow"`` (dynamic NTK: recomputed when a call is longer than any before and past the
            trained length, back to the trained frequencies when a call is shorter than it) or
            ``"switch"`` (LongRoPE: one set up to the trained length, another past it).
        trained_key: the key of the block holding the trained length the rule compares with (default
            ``"max_position_embeddings"`` for ``"grow"``, ``"original_max_position_embeddings"`` for
            ``"switch"``); it must be one of the type's ``required`` keys.
        check_keys: a key the block carries outside ``required``, ``optional`` and the common keys is
            an error (a warning with ``strict=False``). ``False`` only for a type registered without
            any key sets or checks (``ROPE_INIT_FUNCTIONS[name] = fn``), whose keys rotary cannot know.
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

#: ``rope_type`` -> :class:`RopeType`. Extended by :func:`register_rope_type`.
ROPE_TYPES: dict[str, RopeType] = {}

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
    """Decorator registering an init function as ``rope_type`` ``name`` (replacing any previous one).

    The arguments are the fields of :class:`RopeType`. A length-dependent type (``length_dependent=True``)
    follows the length by one of transformers' rules (``update``), comparing with the trained length
    its block holds under ``trained_key``; its init function receives the current ``seq_len``.

    ``check_keys`` says whether a key outside ``required``, ``optional`` and the common keys
    (``rope_theta``, ``partial_rotary_factor``) is refused. ``None`` (the default) refuses them when
    the type states any key set or a ``check``, and accepts any key for a bare
    ``register_rope_type(name)`` (a stand-in whose keys rotary cannot know); pass ``True`` for a type
    that takes no keys at all (as the built-in ``"default"`` does).

    Example:
        >>> @register_rope_type("doc-halved", required={"factor"})
        ... def _halved(head_dim, base, rotary_dim, params, seq_len):
        ...     return default_inv_freq(base, rotary_dim) / params["factor"], 1.0
        >>> ROPE_TYPES["doc-halved"].required
        frozenset({'factor'})
        >>> del ROPE_TYPES["doc-halved"]
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a rope_type name must be a non-empty string, got {name!r}")
    keys: dict[str, frozenset[str]] = {}
    for what, given in (("required", required), ("optional", optional)):
        # a string is iterable: required="factor" would become the keys 'f', 'a', 'c', ...
        if isinstance(given, (str, bytes)) or not isinstance(given, Iterable) or not all(isinstance(k, str) for k in given):
            raise TypeError(f"{what} must be a collection of key names, e.g. {{'factor'}}, got {given!r}")
        keys[what] = frozenset(given)
    for what, fn in (("check", check), ("example", example), ("target_length", target_length)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{what} must be a function or None, got {fn!r}")
    length_dependent = check_bool(length_dependent, "length_dependent")
    if check_keys is None:
        check_keys = bool(keys["required"] or keys["optional"] or check)
    check_keys = check_bool(check_keys, "check_keys")
    trained_length, rotates_every_pair = check_bool(trained_length, "trained_length"), check_bool(rotates_every_pair, "rotates_every_pair")
    if update not in UPDATE_RULES:
        raise ValueError(f"update must be 'grow' (dynamic NTK's rule) or 'switch' (LongRoPE's), got {update!r}")
    trained_key = UPDATE_RULES[update] if trained_key is None else trained_key
    if length_dependent and trained_key not in keys["required"]:
        raise ValueError(
            f"rope_type {name!r} is length-dependent: its block must hold the trained length the {update!r} rule "
            f"compares with; add {trained_key!r} to required= (or name the key that holds it with trained_key=)"
        )

    def deco(fn: RopeInitFn) -> RopeInitFn:
        if not callable(fn):
            raise TypeError(f"register_rope_type({name!r}) decorates an init function, got {fn!r}")
        ROPE_TYPES[name] = RopeType(
            name, fn, keys["required"], keys["optional"], check, length_dependent, trained_length,
            rotates_every_pair, example, target_length, update, trained_key, check_keys,
        )  # fmt: skip
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
    """``1 / base ** (arange(0, r, 2) / r)`` in fp32, bit-identical to Hugging Face.

    The expression (fp32 exponent, fp32 power, fp32 reciprocal) is kept exactly as transformers writes
    it: checkpoints were trained with these rounded values, so "more accurate" ones would differ.

    Example:
        >>> default_inv_freq(10000.0, 128)[:3]
        tensor([1.0000, 0.8660, 0.7499])
    """
    # device="cpu": frequencies are always computed on the CPU (also inside `with torch.device("meta")`)
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / rotary_dim
    return 1.0 / (base**exponent)


def rotary_dim_from(head_dim: int, params: Mapping[str, Any], *, strict: bool = True) -> int:
    """Channels rotated: ``int(head_dim * partial_rotary_factor)`` (Hugging Face's rounding).

    An odd result is a :class:`ConfigError`; with ``strict=False`` it is returned as is (a warning),
    and the frequencies follow transformers, which then rotates ``rotary_dim + 1`` channels.
    """
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
}


def _owners(key: str) -> list[str]:
    return sorted(t.name for t in ROPE_TYPES.values() if key in t.required or key in t.optional)


def validate_rope_parameters(
    params: Mapping[str, Any],
    *,
    rotary_dim: int,
    valid_types: Iterable[str] | None = None,
    strict: bool = True,
) -> dict[str, Any]:
    """Check a scaling block against its ``rope_type`` and return a normalised copy.

    The copy has ``rope_type`` set (the 4.x key ``type`` is read and dropped).

    Args:
        params: the block, e.g. ``{"rope_type": "linear", "factor": 4.0}``.
        rotary_dim: channels rotated (the length LongRoPE's factor lists are checked against is
            ``rotary_dim // 2``).
        valid_types: the types to accept; default every registered one.
        strict: ``False`` turns the value checks into warnings (unknown types and missing keys stay
            errors: the frequencies cannot be computed without them).

    Raises:
        ConfigError: with a message naming the key, the value and what to change.

    Example:
        >>> validate_rope_parameters({"type": "linear", "factor": 2}, rotary_dim=64)
        {'factor': 2, 'rope_type': 'linear'}
    """
    if not isinstance(params, Mapping):
        raise ConfigError(f"the scaling block must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {params!r}")
    check_bool(strict, "strict")
    check_positive_int(rotary_dim, "rotary_dim")
    out = copy.deepcopy(dict(params))
    legacy = out.pop("type", None)
    rope_type = out.get("rope_type", legacy if legacy is not None else "default")
    if legacy is not None and rope_type != legacy:
        complain(f"the block sets both rope_type={rope_type!r} and type={legacy!r}; keep one", strict)
    out["rope_type"] = rope_type
    valid = sorted(ROPE_TYPES if valid_types is None else valid_types)
    if not isinstance(rope_type, str) or rope_type not in valid or rope_type not in ROPE_TYPES:
        raise ConfigError(f"unknown rope_type {rope_type!r}; valid rope_types: {', '.join(valid)}")
    spec = ROPE_TYPES[rope_type]
    if not spec.check_keys:  # registered without key sets or checks (e.g. ROPE_INIT_FUNCTIONS[k] = fn)
        return out

    # yarn's factor may be an explicit null: transformers then takes the ratio of the two lengths
    missing = sorted(k for k in spec.required if out.get(k) is None and not (k == "factor" and rope_type == "yarn" and k in out))
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


def _number(p: Mapping[str, Any], key: str, rope_type: str, *, allowed: str) -> float | None:
    """``p[key]`` if it is set, after checking it is a finite real number (``None`` when absent or null).

    A string, a bool, a list, NaN or an infinity leaves nothing to compute with, so it is an error
    even with ``strict=False``.
    """
    value = p.get(key)
    if value is None:
        return None
    if not is_number(value):
        raise ConfigError(
            f"{key} of rope_type {rope_type!r} must be a finite number ({allowed}), got {value!r} ({type(value).__name__})"
        )
    return value


def _check_factor(p: dict[str, Any], rope_type: str, complain: Callable[[str], None], *, nullable: bool = False) -> None:
    if "factor" not in p or (nullable and p["factor"] is None):
        return
    if p["factor"] is None:
        raise ConfigError(f"factor of rope_type {rope_type!r} must be a number >= 1, got None")
    factor = _number(p, "factor", rope_type, allowed=">= 1, the ratio of the new context length to the trained one")
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


def _check_factor_or_length(p: dict[str, Any], rope_type: str) -> None:
    if p.get("factor") is None and p.get("max_position_embeddings") is None:
        raise ConfigError(
            f"rope_type {rope_type!r} needs 'factor' or 'max_position_embeddings' (factor defaults to "
            "max_position_embeddings / original_max_position_embeddings); add one of them"
        )


def _implicit_factor(p: Mapping[str, Any]) -> float | None:
    """``max_position_embeddings / original_max_position_embeddings`` when both are usable lengths."""
    mpe, trained = p.get("max_position_embeddings"), p.get("original_max_position_embeddings")
    if is_number(mpe) and is_number(trained) and mpe > 0 and trained > 0:
        return mpe / trained
    return None


def _check_attention_factor(p: dict[str, Any], rope_type: str) -> None:
    att = _number(p, "attention_factor", rope_type, allowed="> 0, multiplied into cos and sin")
    if att is not None and att <= 0:
        raise ConfigError(
            f"attention_factor={att} for rope_type {rope_type!r} must be > 0 (it multiplies cos and sin; 0 erases "
            "q and k, a negative value flips them); remove it to use the default"
        )


def _check_ntk_width(rope_type: str, rotary_dim: int) -> None:
    if rotary_dim <= 2:
        raise ConfigError(
            f"rope_type {rope_type!r} scales the base by factor ** (d / (d - 2)), undefined for rotary_dim={rotary_dim}; "
            "use rotary_dim >= 4"
        )


def _check_bool_key(p: Mapping[str, Any], key: str, rope_type: str) -> None:
    # a string "false" is truthy: nothing but a real bool can be read safely, even leniently
    if key in p and not isinstance(p[key], bool):
        raise ConfigError(f"{key} of rope_type {rope_type!r} must be true or false, got {p[key]!r} ({type(p[key]).__name__})")


# ------------------------------------------------------------------------------------------------
# the built-in types


# no keys of its own: a factor, mrope_sections, ... in a default block is named (the user may believe it scales)
@register_rope_type("default", check_keys=True)
def _default(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    return default_inv_freq(base, rotary_dim), 1.0


def _check_linear(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "linear", complain)


@register_rope_type(
    "linear", required={"factor"}, check=_check_linear, example=lambda d: RopeExample({"rope_type": "linear", "factor": 4.0})
)
def _linear(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Position interpolation (Chen et al. 2023): position m becomes m / factor; dividing inv_freq instead
    # gives the same angles and keeps positions integer.
    return default_inv_freq(base, rotary_dim) / params["factor"], 1.0


def _ntk_base(base: Any, alpha: Any, rotary_dim: int) -> Any:
    # NTK-aware scaling: raising the base by alpha ** (d / (d - 2)) divides the lowest frequency by
    # exactly alpha and leaves the highest (pair 0) untouched.
    return base * alpha ** (rotary_dim / (rotary_dim - 2))


def _check_ntk(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "ntk", complain)
    _check_ntk_width("ntk", rotary_dim)
    try:
        grown = p["factor"] ** (rotary_dim / (rotary_dim - 2))
    except OverflowError:
        grown = math.inf
    if not math.isfinite(grown):
        raise ConfigError(
            f"factor={p['factor']} for rope_type 'ntk' overflows the base (base * factor ** (d / (d - 2))): the "
            "frequencies become 0 and nothing rotates; use a factor below 1e100 (real models use 2 to 64)"
        )


@register_rope_type(
    "ntk", required={"factor"}, check=_check_ntk, example=lambda d: RopeExample({"rope_type": "ntk", "factor": 4.0})
)
def _ntk(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    return default_inv_freq(_ntk_base(base, params["factor"], rotary_dim), rotary_dim), 1.0


def _check_dynamic(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "dynamic", complain)
    _check_ntk_width("dynamic", rotary_dim)
    # alpha = factor * length / trained - (factor - 1) is 1 at the trained length only while factor - 1 is
    # exact; transformers' module computes it in float32 (a tensor length), where that holds up to 2**24
    if p["factor"] > 2**24:
        raise ConfigError(
            f"factor={p['factor']} for rope_type 'dynamic' is too large: factor * length / max_position_embeddings "
            "- (factor - 1) loses its + 1 to float32 rounding (the base collapses to 0 or inf); use a factor "
            "<= 2**24 (real models use 2 to 64)"
        )


@register_rope_type(
    "dynamic",
    required={"factor", "max_position_embeddings"},
    check=_check_dynamic,
    length_dependent=True,
    example=lambda d: RopeExample(
        {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 4096}, seq_len=16384
    ),
    target_length=lambda p: max(math.ceil(p["factor"] * p["max_position_embeddings"]), p["max_position_embeddings"]),
)
def _dynamic(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Dynamic NTK: alpha grows with the current length, factor * L / L_train - (factor - 1), and is 1 up to
    # L_train. transformers' module passes seq_len as a 0-dim int64 tensor (max(position_ids) + 1), which
    # makes the base an fp32 tensor; a Python int keeps it in float64. Both are reproduced bit for bit.
    trained = params["max_position_embeddings"]
    factor = params["factor"]
    if seq_len is None:
        seq_len = trained
    elif isinstance(seq_len, torch.Tensor):
        seq_len = torch.maximum(seq_len, torch.tensor(trained, dtype=seq_len.dtype, device=seq_len.device))
    else:
        seq_len = max(seq_len, trained)
    alpha = (factor * seq_len / trained) - (factor - 1)
    return default_inv_freq(_ntk_base(base, alpha, rotary_dim), rotary_dim), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN's attention temperature sqrt(1/t) = 0.1 ln(s) + 1 (Peng et al. 2023, eq. 22)
    if scale <= 1:
        return 1.0
    value = 0.1 * mscale * math.log(scale) + 1.0
    return math.inf if value == 0 else value  # a zero denominator in the DeepSeek ratio: reported by the check


def _yarn_pair_index(rotations: float, rotary_dim: int, base: float, trained: int) -> float:
    # The (fractional) pair index whose wavelength fits `rotations` times into the trained context.
    return (rotary_dim * math.log(trained / (rotations * 2 * math.pi))) / (2 * math.log(base))


def _check_yarn(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "yarn", complain, nullable=True)
    _check_attention_factor(p, "yarn")
    _check_factor_or_length(p, "yarn")
    _check_bool_key(p, "truncate", "yarn")
    for key, default in (("beta_fast", 32), ("beta_slow", 1)):
        value = _number(p, key, "yarn", allowed=f"> 0, a number of turns over the trained context; default {default}")
        if value is not None and value < 0:
            raise ConfigError(
                f"{key}={value} for rope_type 'yarn' must be > 0 (a number of turns over the trained context; YaRN's "
                f"default is {default}); a negative count has no ramp position"
            )
        if value == 0:
            complain(f"{key}=0 for rope_type 'yarn' is read as unset (the default {default}, as transformers does); "
                     f"remove it or give a positive number")  # fmt: skip
    # transformers reads a missing (or falsy) beta as its default: 32 / 1
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
    if beta_fast <= beta_slow:
        complain(
            f"beta_fast={beta_fast} must be greater than beta_slow={beta_slow} (YaRN's defaults are 32 and 1); "
            "swap or fix them"
        )
    factor = p.get("factor")
    implicit = _implicit_factor(p)
    if factor is None:
        factor = implicit
    elif implicit is not None and implicit != 1 and implicit != factor:
        # transformers 5.23 logs the same mismatch once and uses the explicit factor; it skips a ratio of 1
        # (max_position_embeddings left at the trained length, as in Qwen2.5's documented block)
        complain(
            f"rope_type 'yarn' factor={factor} disagrees with max_position_embeddings / "
            f"original_max_position_embeddings = {p['max_position_embeddings']} / "
            f"{p['original_max_position_embeddings']} = {implicit:g}; set factor to {implicit:g} or fix the "
            "lengths (transformers uses factor and warns)"
        )
    if factor is not None and factor <= 0:
        raise ConfigError(f"rope_type 'yarn' factor (max_position_embeddings / original_max_position_embeddings) must be "
                          f"> 0, got {factor}")  # fmt: skip
    mscale, mscale_all_dim = (
        _number(p, key, "yarn", allowed="> 0, DeepSeek uses 1.0 or 0.707") for key in ("mscale", "mscale_all_dim")
    )
    if p.get("attention_factor") is None and mscale and mscale_all_dim and factor is not None:
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        if not (math.isfinite(attention) and attention > 0):
            raise ConfigError(
                f"mscale={mscale} and mscale_all_dim={mscale_all_dim} with factor={factor} give the attention factor "
                f"(0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1) = {attention}, which must be a "
                "finite number > 0; use positive mscale values (DeepSeek uses 1.0 or 0.707)"
            )
    for key, value in (("mscale", mscale), ("mscale_all_dim", mscale_all_dim)):
        if value is not None and value <= 0:
            complain(
                f"{key}={value} for rope_type 'yarn' must be > 0 (DeepSeek uses 1.0 or 0.707); transformers reads 0 as "
                "unset (the attention factor then falls back to 0.1 ln(factor) + 1)"
            )


@register_rope_type(
    "yarn",
    required={"factor", "original_max_position_embeddings"},
    optional={"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate", "max_position_embeddings"},
    check=_check_yarn,
    trained_length=True,
    example=lambda d: RopeExample(
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0},
        max_position=16384,
    ),
)
def _yarn(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    trained = params["original_max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:  # DeepSeek-style configs: the ratio of the two context lengths
        factor = params["max_position_embeddings"] / trained
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    # Pairs below `low` turn more than beta_fast times over the trained context: keep them (extrapolate).
    # Pairs above `high` turn less than beta_slow times: interpolate them by `factor`. A linear ramp between.
    low = _yarn_pair_index(beta_fast, rotary_dim, base, trained)
    high = _yarn_pair_index(beta_slow, rotary_dim, base, trained)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    keep = 1 - ramp

    # the operation order below is transformers' own, so inv_freq is bit-identical
    powers = base ** (torch.arange(0, rotary_dim, 2, device="cpu").to(dtype=torch.float) / rotary_dim)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, attention_factor


def _check_longrope(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "longrope", complain, nullable=True)
    _check_attention_factor(p, "longrope")
    _check_factor_or_length(p, "longrope")
    expected = (rotary_dim + 1) // 2
    for key in ("short_factor", "long_factor"):
        value = p[key]
        if not (isinstance(value, (list, tuple)) and all(is_number(x) for x in value)):
            raise ConfigError(f"{key} must be a list of {expected} numbers, got {value!r}")
        if len(value) != expected:  # not computable: an error even with strict=False
            raise ConfigError(
                f"{key} has {len(value)} entries but rotary_dim={rotary_dim} needs {expected} (one per pair); "
                "give one factor per rotated pair"
            )
        bad = [(i, x) for i, x in enumerate(value) if x <= 0]
        if bad:
            raise ConfigError(
                f"{key} entries divide the frequencies and must be > 0, got {', '.join(f'{key}[{i}]={x}' for i, x in bad[:4])}"
                f"{' ...' if len(bad) > 4 else ''}; fix the list (Phi-3's lie between 1 and about 64)"
            )
    factor = p.get("factor")
    if factor is None:
        factor = _implicit_factor(p)
    if factor is not None and factor <= 0:
        raise ConfigError(f"rope_type 'longrope' factor (max_position_embeddings / original_max_position_embeddings) must "
                          f"be > 0, got {factor}")  # fmt: skip
    trained = p.get("original_max_position_embeddings")
    if p.get("attention_factor") is None and factor is not None and factor > 1 and trained == 1:
        raise ConfigError(
            "rope_type 'longrope' with original_max_position_embeddings=1 has no attention factor: "
            "sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) divides by ln(1) = 0; give the trained "
            "context length (e.g. 4096) or an attention_factor"
        )


def _longrope_example(head_dim: int) -> RopeExample:
    # illustrative long_factor: 1 for the fast pairs rising to 4 for the slow ones (shape of Phi-3's)
    n = head_dim // 2
    long_factor = [1.0 + 3.0 * (i / max(n - 1, 1)) ** 2 for i in range(n)]
    block = {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 4096,
             "short_factor": [1.0] * n, "long_factor": long_factor}  # fmt: skip
    return RopeExample(block, max_position=16384, seq_len=16384, note="illustrative long_factor")


@register_rope_type(
    "longrope",
    required={"short_factor", "long_factor", "original_max_position_embeddings"},
    optional={"factor", "attention_factor", "max_position_embeddings"},
    check=_check_longrope,
    length_dependent=True,
    update="switch",
    trained_length=True,
    example=_longrope_example,
    target_length=lambda p: p["original_max_position_embeddings"] + 1,  # the long factors
)
def _longrope(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    trained = params["original_max_position_embeddings"]
    factor = params.get("factor")
    if factor is None:  # Phi-3 states the two context lengths instead
        factor = params["max_position_embeddings"] / trained
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(trained))
    # one searched rescale factor per pair; the long set once the sequence outgrows the trained context
    use_long = bool(seq_len is not None and seq_len > trained)
    rescale = torch.tensor(params["long_factor" if use_long else "short_factor"], dtype=torch.float32, device="cpu")
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
    return 1.0 / (rescale * base**exponent), attention_factor


def _check_llama3(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "llama3", complain)
    low, high = (
        _number(p, key, "llama3", allowed=f"> 0; Llama 3.1 uses {example}")
        for key, example in (("low_freq_factor", 1), ("high_freq_factor", 4))
    )
    for key, value in (("low_freq_factor", low), ("high_freq_factor", high)):
        if value <= 0:
            raise ConfigError(
                f"{key}={value} for rope_type 'llama3' must be > 0 (the band edges are original_max_position_embeddings"
                f" / {key}); Llama 3.1 uses low_freq_factor=1 and high_freq_factor=4"
            )
    if low >= high:
        complain(
            f"low_freq_factor={low} must be smaller than high_freq_factor={high} (Llama 3.1 uses 1 and 4); "
            "swap or fix them"
        )


@register_rope_type(
    "llama3",
    required={"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    check=_check_llama3,
    trained_length=True,
    example=lambda d: RopeExample(  # Llama 3.1's published values
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192},
        base=500000.0, max_position=131072,
    ),  # fmt: skip
)
def _llama3(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    inv_freq = default_inv_freq(base, rotary_dim)
    factor = params["factor"]
    low_freq_factor, high_freq_factor = params["low_freq_factor"], params["high_freq_factor"]
    trained = params["original_max_position_embeddings"]
    # wavelengths longer than trained / low_freq_factor are interpolated by `factor`, shorter than
    # trained / high_freq_factor are kept, and in between the two are blended smoothly
    low_freq_wavelen = trained / low_freq_factor
    high_freq_wavelen = trained / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (trained / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def _check_proportional(p: dict[str, Any], rotary_dim: int, complain: Callable[[str], None]) -> None:
    _check_factor(p, "proportional", complain, nullable=True)
    fraction = p.get("partial_rotary_factor")
    if fraction is not None and (not is_number(fraction) or not 0 < fraction <= 1):
        raise ConfigError(f"partial_rotary_factor of rope_type 'proportional' must be a number in (0, 1], got {fraction!r}")
    # rotary_dim is the head width here (every pair is kept; the ones past the fraction get frequency 0)
    if proportional_pairs(rotary_dim, p) < 1:
        raise ConfigError(
            f"partial_rotary_factor={fraction} with head_dim={rotary_dim} leaves no pair rotating for rope_type "
            f"'proportional' (int({fraction} * {rotary_dim} // 2) = 0); raise it to at least {2 / rotary_dim:g}"
        )


def proportional_pairs(head_dim: int, params: Mapping[str, Any]) -> int:
    """Pairs that turn under ``proportional``: ``int(partial_rotary_factor * head_dim // 2)`` (transformers' rounding)."""
    fraction = params.get("partial_rotary_factor")
    return int((1.0 if fraction is None else fraction) * head_dim // 2)


@register_rope_type(
    "proportional",
    optional={"factor"},
    check=_check_proportional,
    rotates_every_pair=True,
    example=lambda d: RopeExample({"rope_type": "proportional", "factor": 4.0, "partial_rotary_factor": 0.25}),
)
def _proportional(head_dim: int, base: float, rotary_dim: int, params: Mapping[str, Any], seq_len: Any):
    # Gemma-style: the first partial_rotary_factor of the pairs rotate with exponents over the whole
    # head_dim (not over the rotated width), the remaining pairs get frequency 0 (they never turn).
    rotating = proportional_pairs(head_dim, params)
    exponent = torch.arange(0, 2 * rotating, 2, dtype=torch.int64, device="cpu").to(dtype=torch.float) / head_dim
    inv_freq = 1.0 / (base**exponent)
    still = head_dim // 2 - rotating
    if still > 0:
        inv_freq = torch.cat((inv_freq, torch.zeros(still, dtype=torch.float32, device="cpu")))
    factor = params.get("factor")
    return inv_freq / (1.0 if factor is None else factor), 1.0
