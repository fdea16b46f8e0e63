"""Hypothesis strategies and settings shared by the property tests (importable as ``strategies``).

Kept apart from helpers.py, which is also imported where hypothesis is not installed (the GPU machine).

- :func:`tensors`: tensors of any rank, size and dtype, as plain, transposed, sliced or expanded views;
- :func:`positions_strategy`: position ids as users pass them, right and wrong (negative, huge, float, lists);
- :data:`odd_values`: numbers, bools, strings and NaN where an argument wants a count;
- :data:`FAST`: the settings of the quick property tests (25 examples).
- :data:`PROPERTIES`, :data:`NASTY`, :data:`NUMBERS`, :data:`VALID`, :func:`perturbed_blocks`: the configuration
  layer's property tests: their settings, the values YAML files, command lines and careless edits put into
  configs, finite numbers in and around the parameters' ranges, a valid block per built-in ``rope_type``, and
  such a block with one key set, deleted or spoiled;
- :func:`in_range`, :func:`block_verdict`, :func:`frequencies_verdict`, :func:`accepted`: the documented
  contract of a scaling block (docs/scaling.md), for those tests to decide up front whether a draw is valid.
"""

import copy
import math
import os

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from rotary.rope_types import ROPE_TYPES

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool]


@st.composite
def tensors(draw, rank=None, dtype=None, max_size=5, last=None):
    rank = draw(st.integers(0, 5)) if rank is None else rank
    shape = draw(st.lists(st.integers(0, max_size), min_size=rank, max_size=rank))
    if last is not None and rank:
        shape[-1] = last
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g).to(dtype) if dtype != torch.bool else torch.zeros(shape, dtype=torch.bool)
    kind = draw(st.sampled_from(["plain", "transposed", "sliced", "expanded"]))
    if kind == "transposed" and x.dim() >= 2:
        x = x.transpose(0, 1)
    elif kind == "sliced" and x.dim() >= 1 and x.shape[0] > 1:
        x = x[::2]
    elif kind == "expanded" and x.dim() >= 2 and x.shape[1] == 1:
        x = x.expand(x.shape[0], 3, *x.shape[2:])
    return x


def positions_strategy():
    return st.one_of(
        st.none(),
        st.integers(-3, 2**41).map(lambda n: torch.tensor([n])),
        st.lists(st.integers(-2, 70), min_size=0, max_size=6).map(torch.tensor),
        st.lists(st.integers(0, 70), min_size=1, max_size=6).map(lambda v: torch.tensor(v, dtype=torch.int32)),
        st.lists(st.integers(0, 9), min_size=1, max_size=6).map(lambda v: torch.tensor(v, dtype=torch.float32)),
        st.lists(st.lists(st.integers(0, 40), min_size=3, max_size=3), min_size=1, max_size=3).map(torch.tensor),
        st.just([0, 1, 2]),
    )


FAST = settings(max_examples=25, deadline=None)


odd_values = st.sampled_from([0, -1, 1, 2, 3, 4, 7, 8, 2**20, 2.0, 1.5, True, None, "4", float("nan"), float("inf")])


PROPERTIES = settings(
    max_examples=int(os.environ.get("ROTARY_CONFIG_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# values YAML files, command lines and careless edits put into configs
NASTY = st.one_of(
    st.sampled_from([
        float("nan"), float("inf"), float("-inf"), 0, 0.0, -0.0, -1, -1.0, -5, 0.5, 1, 1.0, 2, 1e300, -1e300, 1e-300,
        2**63, 2**24 + 1, True, False, None, "", "1.0", "true", "false", "yarn", [], [1.0], [1.0, "x"], {}, {"a": 1},
    ]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20),
    st.text(max_size=4),
    st.lists(st.floats(-2, 70), max_size=3),
)  # fmt: skip


#: finite numbers in and around the ranges of the parameters (docs/scaling.md): the edges (0, 1, 2**24, a length
#: of 1 token), fractions, ints and floats of every size up to where float32 frequencies overflow or underflow
NUMBERS = st.one_of(
    st.sampled_from([0, 0.0, 1, 1.0, 0.5, 2, 4.0, 32, 2**24, 2**24 + 1, 4096, 4096.0, 4096.5, 1e-30, 1e30, 1e38, 1e40]),
    st.integers(-2, 10**6),
    st.floats(-2.0, 1e6, allow_nan=False),
    st.floats(1e-45, 1e45, allow_nan=False).map(lambda v: float(f"{v:.3g}")),
)

#: a valid block per built-in type, with rotary_dim 64 (32 pairs)
VALID = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
    "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [4.0] * 32, "factor": 4.0,
                 "original_max_position_embeddings": 4096},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192},
    "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
}  # fmt: skip


def without(rope_type: str, key: str) -> tuple[dict, str, None]:
    """A valid block with ``key`` deleted, as :func:`perturbed_blocks` draws it (for ``@example``)."""
    return {k: v for k, v in VALID[rope_type].items() if k != key}, key, None


def setting(rope_type: str, key: str, value) -> tuple[dict, str, object]:
    """A valid block with ``key`` set to ``value``, as :func:`perturbed_blocks` draws it (for ``@example``)."""
    return {**copy.deepcopy(VALID[rope_type]), key: value}, key, value


#: values that keep a :data:`VALID` block valid (at rotary_dim 64) when they replace its key's value
REPLACEMENTS = {
    "factor": [2.0, 8.0, 16],
    "original_max_position_embeddings": [2048, 8192],
    "beta_fast": [16.0, 64.0],
    "beta_slow": [0.5, 2.0],
    "mscale": [0.5, 1.0],
    "mscale_all_dim": [0.707, 1.0],
    "low_freq_factor": [0.5, 2.0],
    "high_freq_factor": [8.0],
    "partial_rotary_factor": [1.0],
    "attention_factor": [0.5, 1.0],
    "truncate": [True, False],
}

#: the key :func:`perturbed_blocks` adds that no type takes (a typo of factor): refused when strict, else ignored
UNKNOWN_KEY = "facter"

# ------------------------------------------------------------------------------------------------
# the documented contract of a scaling block (docs/scaling.md, "Validation" and "What each parameter may
# be"), written here once for the property tests: they decide from it, before calling rotary, whether a
# block is accepted, and never ask rotary's own validator

#: accepted with strict=True and strict=False
VALID_BLOCK = 0
#: a value mistake whose frequencies stay finite and rotating: refused with strict=True, a warning with
#: strict=False (which then computes what transformers computes)
WARNED = 1
#: refused with strict=True and strict=False (nothing finite to compute, a missing key, an unknown type, ...)
REFUSED = 2

#: the keys of each built-in type (docs/scaling.md, each method's heading), (required, optional): required
#: are those its formula cannot do without
TYPE_KEYS = {
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "ntk": ({"factor"}, set()),
    "dynamic": ({"factor", "max_position_embeddings"}, set()),
    "yarn": (
        {"factor", "original_max_position_embeddings"},
        {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate",
         "max_position_embeddings"},
    ),
    "longrope": (
        {"short_factor", "long_factor", "original_max_position_embeddings"},
        {"factor", "attention_factor", "max_position_embeddings", "short_mscale", "long_mscale"},
    ),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}, set()),
    "proportional": (set(), {"factor"}),
}  # fmt: skip
#: the built-in types, as docs/scaling.md's "Methods" lists them (ntk_alpha: described there, not by these rules)
BUILT_IN_TYPES = {*TYPE_KEYS, "ntk_alpha"}
#: keys any block may carry
COMMON_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
#: the types whose factor may be an explicit null (docs/scaling.md: "A null factor means max_position_embeddings /
#: original_max_position_embeddings"; proportional's reads as 1)
NULLABLE_FACTOR = {"yarn", "longrope", "proportional"}
#: the numbers a block may leave out or write as null ("not given")
OPTIONAL_NUMBERS = {
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "short_mscale",
    "long_mscale",
}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    """A finite real number (an int or a float, not a bool): what every numeric parameter must be."""
    return (_int(v) or isinstance(v, float)) and -math.inf < v < math.inf


def in_range(rope_type: str, key: str, value) -> int:
    """One key's value against its row of docs/scaling.md's "What each parameter may be", alone:
    :data:`VALID_BLOCK`, :data:`WARNED` or :data:`REFUSED`. The rules between keys (and the rotated width) are
    :func:`block_verdict`'s; ``rope_theta`` and ``partial_rotary_factor`` are read outside the block's type.
    """
    if key == "factor":
        if value is None:
            return VALID_BLOCK if rope_type in NULLABLE_FACTOR else REFUSED
        if not _number(value) or value <= 0:
            return REFUSED
        if rope_type == "dynamic" and value > 2**24:
            return REFUSED  # factor * l / L - (factor - 1) loses its + 1 in float32
        return WARNED if value < 1 else VALID_BLOCK
    if key in ("original_max_position_embeddings", "max_position_embeddings"):
        if _int(value) and value > 0:
            return VALID_BLOCK
        return WARNED if _number(value) and value >= 1 else REFUSED  # a float length; < 1 token, non-numbers
    if key == "truncate":
        return VALID_BLOCK if isinstance(value, bool) else REFUSED
    if key in ("short_factor", "long_factor"):
        ok = isinstance(value, (list, tuple)) and all(_number(x) and x > 0 for x in value)
        return VALID_BLOCK if ok else REFUSED  # the length is block_verdict's (one per pair)
    if value is None and key in OPTIONAL_NUMBERS:
        return VALID_BLOCK  # null reads as "not given"
    if not _number(value):
        return REFUSED
    if key in ("attention_factor", "low_freq_factor", "high_freq_factor", "short_mscale", "long_mscale"):
        return VALID_BLOCK if value > 0 else REFUSED
    if key in ("beta_fast", "beta_slow"):  # 0 is read as unset (the default), as transformers does
        return REFUSED if value < 0 else WARNED if value == 0 else VALID_BLOCK
    if key in ("mscale", "mscale_all_dim"):  # transformers reads 0 as unset
        return VALID_BLOCK if value > 0 else WARNED
    raise LookupError(f"no documented range for {key!r} of rope_type {rope_type!r}")


def _mscale(scale: float, mscale: float) -> float:
    # YaRN's attention temperature 0.1 mscale ln(s) + 1, 1 for s <= 1 (docs/scaling.md, yarn)
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rotated_width(block: dict, head_dim: int = 64) -> tuple[int, int | None]:
    """``(verdict, rotary_dim)`` of ``partial_rotary_factor`` read as :func:`rotary.frequencies` reads it for a
    type other than proportional: ``int(head_dim * p)`` for ``p`` in (0, 1] (null: 1); under 2 channels refused,
    an odd width warned (docs/scaling.md, ``partial_rotary_factor``)."""
    p = block.get("partial_rotary_factor")
    p = 1.0 if p is None else p
    if not _number(p) or not 0 < p <= 1:
        return REFUSED, None
    width = int(head_dim * p)
    if width < 2:
        return REFUSED, None
    return (WARNED if width % 2 else VALID_BLOCK), width


def block_verdict(block: dict, rotary_dim: int) -> int:
    """The documented verdict on a scaling block whose pairs rotate over ``rotary_dim`` channels (the head
    width for proportional), as :func:`rotary.rope_types.validate_rope_parameters` checks it: the type named
    (``type`` is 4.x's name; both given and different: warned), its required keys (null is missing), keys of
    no type or of another type (warned), each value's range (:func:`in_range`) and the rules between keys.
    Raises LookupError for a type these rules do not describe (ntk_alpha, or one a caller registered). Which types
    exist is the documented list, not rotary's registry: a built-in type missing from it would be refused."""
    legacy = block.get("type")
    rope_type = block.get("rope_type", legacy if legacy is not None else "default")
    verdicts = [WARNED if legacy is not None and rope_type != legacy else VALID_BLOCK]
    if not isinstance(rope_type, str) or (rope_type not in BUILT_IN_TYPES and rope_type not in ROPE_TYPES):
        return REFUSED
    if rope_type not in TYPE_KEYS or (rope_type == "dynamic" and block.get("alpha")):
        raise LookupError(f"no documented rules for rope_type {rope_type!r}")
    required, optional = TYPE_KEYS[rope_type]
    p = {k: v for k, v in block.items() if k != "type"}
    null_factor = rope_type == "yarn" and "factor" in p  # yarn's explicit null factor: the ratio of the lengths
    if any(p.get(k) is None and not (k == "factor" and null_factor) for k in required):
        return REFUSED
    verdicts += [WARNED for k in p if k not in required | optional | COMMON_KEYS]
    # the lengths are checked in any block (a length is a length whichever type it is given to)
    lengths = {"original_max_position_embeddings", "max_position_embeddings"}
    verdicts += [in_range(rope_type, k, v) for k, v in p.items() if k in required | optional | lengths]
    factor = p.get("factor")
    mpe, trained = p.get("max_position_embeddings"), p.get("original_max_position_embeddings")
    implicit = mpe / trained if _number(mpe) and _number(trained) and mpe > 0 and trained > 0 else None
    if max(verdicts) == REFUSED:
        return REFUSED  # the rules below compare values that are numbers
    if rope_type in ("ntk", "dynamic") and rotary_dim <= 2:
        return REFUSED  # factor ** (d / (d - 2)) is undefined
    if rope_type == "ntk":
        try:
            grown = factor ** (rotary_dim / (rotary_dim - 2))
        except OverflowError:
            grown = math.inf
        verdicts.append(REFUSED if grown == math.inf else VALID_BLOCK)  # the base overflows
    if rope_type in ("yarn", "longrope"):
        if factor is None and mpe is None:
            return REFUSED  # neither the factor nor the lengths it is the ratio of
        if factor is None:
            factor = implicit
    if rope_type == "yarn":
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1  # 0 and null: the defaults
        verdicts.append(WARNED if beta_fast <= beta_slow else VALID_BLOCK)
        given = p.get("factor")
        if given is not None and implicit is not None and implicit not in (1, given):
            verdicts.append(WARNED)  # factor disagrees with the lengths (a ratio of 1 is skipped, as transformers)
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if p.get("attention_factor") is None and mscale and mscale_all_dim and factor is not None:
            low = _mscale(factor, mscale_all_dim)
            attention = math.inf if low == 0 else _mscale(factor, mscale) / low
            if not (math.isfinite(attention) and attention > 0):
                return REFUSED
    if rope_type == "longrope":
        if any(len(p[k]) != (rotary_dim + 1) // 2 for k in ("short_factor", "long_factor")):
            return REFUSED  # one factor per rotated pair
        if p.get("attention_factor") is not None and any(p.get(k) is not None for k in ("short_mscale", "long_mscale")):
            verdicts.append(WARNED)  # both an attention factor and a set's own
        if p.get("attention_factor") is None and factor is not None and factor > 1 and trained == 1:
            return REFUSED  # sqrt(1 + ln(s) / ln(1)) divides by 0
    if rope_type == "llama3":
        verdicts.append(WARNED if p["low_freq_factor"] >= p["high_freq_factor"] else VALID_BLOCK)
    if rope_type == "proportional":
        fraction = p.get("partial_rotary_factor")
        fraction = 1.0 if fraction is None else fraction
        if not _number(fraction) or not 0 < fraction <= 1 or int(fraction * rotary_dim // 2) < 1:
            return REFUSED  # no pair left turning
    return max(verdicts)


def frequencies_verdict(block: dict, base, head_dim: int = 64) -> tuple[int, int | None, float | None]:
    """``(verdict, rotary_dim, base)`` of ``rotary.frequencies(head_dim, base=base, scaling=block)``: the base (the
    argument, else the block's ``rope_theta``, else 10000; both given and different: refused) a finite number
    > 1; the rotated width from ``partial_rotary_factor`` (:func:`rotated_width`; proportional keeps the head
    width and reads the fraction itself); then :func:`block_verdict` at that width."""
    theta = block.get("rope_theta")
    if base is not None and theta is not None and theta != base:
        return REFUSED, None, None
    base = base if base is not None else 10000.0 if theta is None else theta
    if not _number(base) or base <= 1:
        return REFUSED, None, None
    if block.get("rope_type", block.get("type", "default")) == "proportional":
        width_verdict, rotary_dim = VALID_BLOCK, head_dim
    else:
        width_verdict, rotary_dim = rotated_width(block, head_dim)
        if width_verdict == REFUSED:
            return REFUSED, None, None
    return max(width_verdict, block_verdict(block, rotary_dim)), rotary_dim, float(base)


def accepted(verdict: int, strict: bool) -> bool:
    """Whether a block of this verdict is accepted: a valid one always, a warned one with ``strict=False``."""
    return verdict == VALID_BLOCK or (verdict == WARNED and strict is False)


@st.composite
def perturbed_blocks(draw):
    rope_type = draw(st.sampled_from(sorted(VALID)))
    block = copy.deepcopy(VALID[rope_type])
    keys = sorted(
        ROPE_TYPES[rope_type].required | ROPE_TYPES[rope_type].optional | {"rope_type", "partial_rotary_factor"}
    )
    key = draw(st.sampled_from([*keys, "type", "rope_theta", UNKNOWN_KEY]))
    action = draw(st.sampled_from(["set", "number", "replace", "delete", "entry"]))
    value = None
    if action == "delete":
        block.pop(key, None)
        value = None
    elif action == "replace":
        key = draw(st.sampled_from([k for k in sorted(REPLACEMENTS) if k in keys]))
        value = draw(st.sampled_from(REPLACEMENTS[key]))
        block[key] = value
    elif action == "entry" and rope_type == "longrope":
        key = draw(st.sampled_from(["short_factor", "long_factor"]))
        value = draw(st.one_of(NASTY, NUMBERS))
        block[key][draw(st.integers(0, 31))] = value
    else:
        value = draw(NASTY if action == "set" else NUMBERS)
        block[key] = value
    return block, key, value
