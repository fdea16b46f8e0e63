"""Argument checks shared by the analysis functions."""

from __future__ import annotations

from typing import Any

from ..errors import InputTypeError
from ..rope import RoPE

__all__ = ["check_rope"]


def check_rope(rope: Any, call: str) -> RoPE:
    """``rope`` if it is a :class:`rotary.RoPE`, else a TypeError naming ``call`` and what it got."""
    if not isinstance(rope, RoPE):
        raise InputTypeError(
            f"{call} measures a rotary.RoPE, got rope={type(rope).__name__}; build one with rotary.RoPE(head_dim, ...)"
        )
    return rope
