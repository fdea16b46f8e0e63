"""rotary: rotary position embeddings (RoPE) for PyTorch: exact, complete, fast, inspectable."""

# hf, models, nn: layers and models built on RoPE (rotary.hf imports transformers only inside patch())
from . import analysis, hf, models, nn, reference
from .apply import (
    apply_rotary,
    apply_rotary_,
    check_tables,
    permute_qk_weight,
    to_half,
    to_interleaved,
)
from .config import ConfigError
from .frequencies import ROPE_INIT_FUNCTIONS, Frequencies, frequencies
from .module import RoPE

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ROPE_INIT_FUNCTIONS",
    "Frequencies",
    "RoPE",
    "analysis",
    "apply_rotary",
    "apply_rotary_",
    "check_tables",
    "frequencies",
    "hf",
    "models",
    "nn",
    "permute_qk_weight",
    "reference",
    "to_half",
    "to_interleaved",
]
