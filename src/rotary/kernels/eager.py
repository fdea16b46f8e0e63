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


def table_rows(
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None, batch_rows: int, batch: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos/sin rows of every (b, s), ``[B or 1, S, 1, r]``, from a ``[T, r]`` table (see ``dispatch.rotate``)."""
    if positions is not None:
        return cos[positions].unsqueeze(2), sin[positions].unsqueeze(2)
    rows = batch if batch_rows else 1
    return (cos[: rows * seq_len].view(rows, seq_len, 1, -1), sin[: rows * seq_len].view(rows, seq_len, 1, -1))


def rotate_rows_torch(
    xs: list[torch.Tensor],
    outs: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> None:
    """The kernel contract of ``dispatch.rotate`` in pure torch: write the rotation of each ``[B, S, H, D]`` x into out."""
    c, s = table_rows(cos, sin, positions, batch_rows, xs[0].shape[0], xs[0].shape[1])
    if conjugate:
        s = -s
    for x, out in zip(xs, outs):
        if out is x:
            rotate_torch(x, c, s, interleaved=interleaved, inplace=True)
        else:
            out.copy_(rotate_torch(x, c, s, interleaved=interleaved, inplace=False))
