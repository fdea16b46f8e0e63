"""The pure-torch rotation: the fallback of every backend and the oracle fused kernels are tested against."""

from __future__ import annotations

import torch

from .. import devices
from ..tables import gather_rows
from .contract import Rotation

__all__ = ["rotate_pairs", "rotate_torch", "token_tables", "run_torch", "table_grad_torch"]


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


def token_tables(rotation: Rotation, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos/sin rows of every token of ``xs[i]``, ``[B or 1, S, H or 1, r]``."""
    cos, sin = rotation.cos_sin(i)
    batch, seq_len = rotation.xs[i].shape[:2]
    if rotation.positions is not None:
        positions = rotation.positions
        if rotation.frequencies is not None or not devices.host_checks(positions.device):
            # as the kernels: a row the table does not hold is computed (with frequencies) or NaN, never read
            c, s = gather_rows(cos, sin, positions, rotation.frequencies, rotation.interleaved)
        else:
            c, s = cos[positions], sin[positions]  # [B, S, (H,) r]
    else:
        rows = batch if rotation.batch_rows else 1
        c = cos[: rows * seq_len].unflatten(0, (rows, seq_len))
        s = sin[: rows * seq_len].unflatten(0, (rows, seq_len))
    if cos.dim() == 2:  # shared by every head
        c, s = c.unsqueeze(2), s.unsqueeze(2)
    return c, s


def run_torch(rotation: Rotation) -> None:
    """The kernel contract in pure torch: write the rotation of each ``[B, S, H, D]`` x into its out."""
    for i, (x, out) in enumerate(zip(rotation.xs, rotation.outs)):
        c, s = token_tables(rotation, i)
        if rotation.conjugate:
            s = -s
        if out is x:
            rotate_torch(x, c, s, interleaved=rotation.interleaved, inplace=True)
        else:
            out.copy_(rotate_torch(x, c, s, interleaved=rotation.interleaved, inplace=False))


def table_grad_torch(rotation: Rotation, grads: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-token table gradients of each x (see :mod:`.contract`): ``[B, S, r]``, or ``[B, S, H, r]`` per head."""
    out = []
    for i, (x, g) in enumerate(zip(rotation.xs, grads)):
        cos = rotation.cos_sin(i)[0]
        r = cos.shape[-1]
        compute = torch.promote_types(x.dtype, torch.float32)
        part, g = x[..., :r].to(compute), g[..., :r].to(compute)
        gc, gs = g * part, g * rotate_pairs(part, rotation.interleaved)
        if rotation.conjugate:
            gs = -gs
        if cos.dim() == 2:
            gc, gs = gc.sum(2), gs.sum(2)
        out.append((gc.to(cos.dtype), gs.to(cos.dtype)))
    return out
