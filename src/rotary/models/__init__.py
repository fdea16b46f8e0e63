"""Whole models built on :mod:`rotary.nn`: a LLaMA-style ``Decoder`` and ``RoFormer``, and moving a
trained ``Decoder`` to another position encoding (:func:`transfer_position_encoding`)."""

from .decoder import POSITION_ENCODINGS, Decoder, DecoderConfig, PositionEncoding, register_position_encoding
from .roformer import RoFormer, RoFormerConfig
from .transfer import position_state_names, transfer_position_encoding

__all__ = [
    "POSITION_ENCODINGS",
    "Decoder",
    "DecoderConfig",
    "PositionEncoding",
    "RoFormer",
    "RoFormerConfig",
    "position_state_names",
    "register_position_encoding",
    "transfer_position_encoding",
]
