"""Whole models built on :mod:`rotary.nn`: a LLaMA-style ``Decoder`` and ``RoFormer``."""

from .decoder import POSITION_ENCODINGS, Decoder, DecoderConfig, PositionEncoding, register_position_encoding
from .roformer import RoFormer, RoFormerConfig

__all__ = [
    "POSITION_ENCODINGS",
    "Decoder",
    "DecoderConfig",
    "PositionEncoding",
    "RoFormer",
    "RoFormerConfig",
    "register_position_encoding",
]
