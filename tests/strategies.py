"""Hypothesis strategies and settings shared by the property tests (importable as ``strategies``).

Kept apart from helpers.py, which is also imported where hypothesis is not installed (the GPU machine).

- :func:`tensors`: tensors of any rank, size and dtype, as plain, transposed, sliced or expanded views;
- :func:`positions_strategy`: position ids as users pass them, right and wrong (negative, huge, float, lists);
- :data:`odd_values`: numbers, bools, strings and NaN where an argument wants a count;
- :data:`FAST`: the settings of the quick property tests (25 examples).
- :data:`PROPERTIES`, :data:`NASTY`, :data:`VALID`, :func:`perturbed_blocks`: the configuration layer's
  property tests: their settings, the values YAML files, command lines and careless edits put into
  configs, a valid block per built-in ``rope_type``, and such a block with one key set, deleted or spoiled.
"""

import copy
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


def removal(block: dict, key: str) -> str | None:
    """For a draw of :func:`perturbed_blocks`: ``"required"`` when it deleted a key the block's type cannot do
    without (its ``required`` keys, and LongRoPE's factor when no max_position_embeddings gives it),
    ``"optional"`` when it deleted another key (the block is still valid), ``None`` when it set a value or
    deleted rope_type (the other keys belong to the type it named)."""
    rope_type = block.get("rope_type") if key != "rope_type" else None
    if key in block or rope_type not in ROPE_TYPES:
        return None
    if key in ROPE_TYPES[rope_type].required:
        return "required"
    if rope_type == "longrope" and key == "factor" and "max_position_embeddings" not in block:
        return "required"
    return "optional"


#: values that keep a :data:`VALID` block valid (at rotary_dim 64) when they replace its key's value; a draw
#: of :func:`perturbed_blocks` that sets one is classified valid up front (:func:`replaced`)
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

#: the keys whose value is one real number (or, for truncate, a bool)
NUMBER_KEYS = frozenset(REPLACEMENTS) - {"truncate"} | {"max_position_embeddings", "short_mscale", "long_mscale"}


def replaced(block: dict, key: str, value) -> bool:
    """For a draw of :func:`perturbed_blocks`: ``key`` set to one of :data:`REPLACEMENTS` (same type, same value)
    in a block of a built-in type that takes the key (the block is still valid)."""
    rope_type = block.get("rope_type")
    if not isinstance(rope_type, str) or rope_type not in VALID:
        return False
    spec = ROPE_TYPES[rope_type]
    if key not in spec.required | spec.optional | {"partial_rotary_factor"}:
        return False
    return any(type(value) is type(r) and value == r for r in REPLACEMENTS.get(key, ()))


#: the key :func:`perturbed_blocks` adds that no type takes (a typo of factor): refused when strict, else ignored
UNKNOWN_KEY = "facter"


def spoiled(block: dict, key: str, value) -> bool:
    """For a draw of :func:`perturbed_blocks`: ``key``, one number in a block of a built-in type that takes it,
    set to something that is not a finite real number (a string, a bool, a list, a dict, NaN or ±inf; None, which
    reads as "not given" for an optional key, is left out); or ``rope_type`` set to what names no registered type."""
    if key == "rope_type":  # set to what is not the name of a registered type
        return key in block and (not isinstance(value, str) or value not in ROPE_TYPES)
    rope_type = block.get("rope_type")
    if not isinstance(rope_type, str) or rope_type not in VALID:
        return False
    spec = ROPE_TYPES[rope_type]
    if key not in NUMBER_KEYS or key not in spec.required | spec.optional | {"partial_rotary_factor"}:
        return False
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    return isinstance(value, (bool, str, list, dict))


@st.composite
def perturbed_blocks(draw):
    rope_type = draw(st.sampled_from(sorted(VALID)))
    block = copy.deepcopy(VALID[rope_type])
    keys = sorted(
        ROPE_TYPES[rope_type].required | ROPE_TYPES[rope_type].optional | {"rope_type", "partial_rotary_factor"}
    )
    key = draw(st.sampled_from([*keys, "type", "rope_theta", UNKNOWN_KEY]))
    action = draw(st.sampled_from(["set", "set", "replace", "delete", "entry"]))
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
        value = draw(NASTY)
        block[key][draw(st.integers(0, 31))] = value
    else:
        value = draw(NASTY)
        block[key] = value
    return block, key, value
