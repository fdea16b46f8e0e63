"""The ``rope_type`` registry (:mod:`.registry`) and the built-in types, each init function beside its checks:
:mod:`.interpolation` (``default``, ``linear``, ``ntk``, ``dynamic``, ``ntk_alpha``), :mod:`.yarn_longrope`
(``yarn``, ``longrope``), :mod:`.llama3_proportional` (``llama3``, ``proportional``), registered on import in
that order.
"""

# importing registers the built-in types, in this order (ROPE_TYPES lists them so)
# isort: off
from . import interpolation, yarn_longrope, llama3_proportional  # noqa: F401
# isort: on

from .llama3_proportional import proportional_pairs
from .registry import (
    COMMON_KEYS,
    KEY_MEANINGS,
    ROPE_INIT_FUNCTIONS,
    ROPE_TYPES,
    UPDATE_RULES,
    ConfigError,
    RopeCheckFn,
    RopeExample,
    RopeInitFn,
    RopeType,
    canonical_rope_type,
    complain,
    default_inv_freq,
    register_rope_type,
    rotary_dim_from,
    validate_rope_parameters,
)
from .yarn_longrope import longrope_serving_block

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
    "proportional_pairs",
    "longrope_serving_block",
    "complain",
    "COMMON_KEYS",
    "KEY_MEANINGS",
    "UPDATE_RULES",
    "RopeCheckFn",
    "RopeInitFn",
]
