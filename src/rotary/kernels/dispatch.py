"""Choose the backend that rotates a tensor.

Every backend takes ``x`` and cos/sin already validated and viewed so they broadcast over ``x``'s
first ``r`` channels, and returns the rotated tensor (``x`` itself when ``inplace``).
"""

from __future__ import annotations

import torch

from .eager import rotate_torch

__all__ = ["rotate"]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, inplace: bool) -> torch.Tensor:
    """Rotate ``x`` with the best available backend (for now: pure torch)."""
    return rotate_torch(x, cos, sin, interleaved=interleaved, inplace=inplace)
