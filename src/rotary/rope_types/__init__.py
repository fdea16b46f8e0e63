"""The ``rope_type`` registry and the built-in types (:mod:`.registry`)."""

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
    complain,
    default_inv_freq,
    proportional_pairs,
    register_rope_type,
    rotary_dim_from,
    validate_rope_parameters,
)

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
