"""Attention layers built on :class:`rotary.RoPE`, and the other position encodings they are compared with."""

from .attention import RotaryAttention, padding_position_ids, repeat_kv
from .cache import KVCache, StaticKVCache
from .linear_attention import (
    FEATURE_MAPS,
    RotaryLinearAttention,
    linear_attention_reference,
    rotary_linear_attention,
)
from .position import (
    ALiBi,
    LearnedPositionEmbedding,
    RelativePositionBias,
    SinusoidalPositionEmbedding,
    alibi_slopes,
)

__all__ = [
    "ALiBi",
    "FEATURE_MAPS",
    "KVCache",
    "LearnedPositionEmbedding",
    "RelativePositionBias",
    "RotaryAttention",
    "RotaryLinearAttention",
    "SinusoidalPositionEmbedding",
    "StaticKVCache",
    "alibi_slopes",
    "linear_attention_reference",
    "padding_position_ids",
    "repeat_kv",
    "rotary_linear_attention",
]
