"""rotary: rotary position embeddings (RoPE) for PyTorch: exact, complete, fast, inspectable."""

# hf, models, nn: layers and models built on RoPE (rotary.hf imports transformers only inside patch())
from . import analysis, errors, hf, models, nn, positions, qk_norm, reference, variants
from .errors import ConfigError, InputError, InputTypeError
from .frequencies import Frequencies, frequencies
from .functional import apply_rotary, apply_rotary_, apply_rotary_kv_, apply_rotary_qkv_, check_tables
from .pairing import permute_qk_weight, to_half, to_interleaved
from .positions import Positions
from .qk_norm import rmsnorm_rotate
from .rope import RoPE
from .rope_types import ROPE_INIT_FUNCTIONS, ROPE_TYPES, register_rope_type
from .rotation import rotate
from .serving import rotate_and_cache
from .tables import RotaryTables
from .variants import AxialRoPE, MRoPE, MultimodalPositions, RoPEMixed, XPos, multimodal_positions

__version__ = "0.1.0"

__all__ = [
    "AxialRoPE",
    "ConfigError",
    "InputError",
    "InputTypeError",
    "ROPE_INIT_FUNCTIONS",
    "ROPE_TYPES",
    "Frequencies",
    "MRoPE",
    "MultimodalPositions",
    "Positions",
    "RoPE",
    "RoPEMixed",
    "RotaryTables",
    "XPos",
    "analysis",
    "apply_rotary",
    "apply_rotary_",
    "apply_rotary_kv_",
    "apply_rotary_qkv_",
    "check_tables",
    "errors",
    "frequencies",
    "hf",
    "models",
    "multimodal_positions",
    "nn",
    "permute_qk_weight",
    "positions",
    "qk_norm",
    "reference",
    "register_rope_type",
    "rmsnorm_rotate",
    "rotate",
    "rotate_and_cache",
    "to_half",
    "to_interleaved",
    "variants",
]
