"""The argparse value types the subcommands share, and the largest sizes they accept; a bad value raises
``argparse.ArgumentTypeError`` (one usage line, exit status 2).
"""

from __future__ import annotations

import argparse
import math

__all__ = [
    "COMMAND_MAX_HEAD_DIM",
    "MAX_LENGTH",
    "MAX_SEQ_LEN",
    "count",
    "head_dim_count",
    "length_count",
    "positive_float",
    "positive_int",
    "seed",
    "seq_len_count",
]


def positive_int(text: str) -> int:
    """argparse type: an int > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


#: the largest sizes the commands accept; beyond them a command needs gigabytes of memory or minutes
# the commands' own limit (the library accepts up to _checks.MAX_HEAD_DIM); published models use 64 to 256
# channels per head (DeepSeek's MLA: 192 with 64 rotated)
COMMAND_MAX_HEAD_DIM = 1024
MAX_SEQ_LEN = 2048  # verify's block-diagonal reference and the [S, S] score matrices grow with seq_len and seq_len²
MAX_LENGTH = 2**40  # context lengths and positions: far beyond any model, still exact in float64 angles


def count(maximum: int, why: str):
    """argparse type: an int in ``1 .. maximum`` (``why`` explains the maximum in the error).

    >>> count(100, "a hundred is plenty")("101")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be at most 100 (a hundred is plenty), got 101
    """

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum} ({why}), got {text}")
        return value

    parse.__name__ = "count"
    return parse


def seed(text: str) -> int:
    """argparse type: a random seed, an int in ``0 .. 2**63 - 1`` (what ``torch.manual_seed`` takes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer seed, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer seed in 0 .. 2**63 - 1, got {text}")
    return value


head_dim_count = count(COMMAND_MAX_HEAD_DIM, "published models use 64 to 256 channels per head")
seq_len_count = count(MAX_SEQ_LEN, "the reference forms and the [S, S] score matrices grow with it")
length_count = count(MAX_LENGTH, "2**40 positions")
