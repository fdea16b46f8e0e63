"""The pure-torch rotation: the fallback of every backend and the oracle fused kernels are tested against."""

from __future__ import annotations

import torch

__all__ = ["rotate_pairs", "rotate_torch"]


def rotate_pairs(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The 90-degree turn of every pair: (a, b) -> (-b, a)."""
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotate_torch(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, inplace: bool
) -> torch.Tensor:
    """Pure-torch rotation of the first ``cos.shape[-1]`` channels; cos/sin already broadcastable."""
    r = cos.shape[-1]
    compute = torch.promote_types(x.dtype, torch.float32)
    part = x[..., :r].to(compute)
    rotated = part * cos.to(compute) + rotate_pairs(part, interleaved) * sin.to(compute)
    if inplace:
        x[..., :r].copy_(rotated)
        return x
    rotated = rotated.to(x.dtype)
    if r == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., r:]), dim=-1)
