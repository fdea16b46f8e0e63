"""Choose the backend that rotates q/k tensors, and the path through autograd.

The kernel contract (shared by the CPU extension, the Triton kernel and the pure-torch fallback):

- ``xs``: tensors viewed as ``[B, S, H, D]`` (any strides; the kernels want a unit stride over D),
  possibly different head counts (GQA), the same B, S and D;
- ``cos``, ``sin``: fp32 tables ``[T, r]`` (rows contiguous), rotating the first ``r`` channels;
- ``positions``: int64 ``[B, S]`` (any strides, e.g. an expanded ``[S]``) giving the table row of
  token (b, s); or ``None``, when the row is ``b * batch_rows + s`` (``batch_rows`` is 0 for one
  table shared by the batch, S for per-batch tables stacked as ``[B * S, r]``).

Without autograd (inference, or ``torch.no_grad()``) the kernel is called directly; with eager
autograd through plain ``autograd.Function`` s (:class:`.ops.Rotate`, :class:`.ops.RotateInplace`);
while ``torch.compile`` traces, through the registered custom ops, which it can see through. A
custom op's Python dispatch costs tens of microseconds, more than the kernel at decode shapes.
"""

from __future__ import annotations

import torch

from . import ops
from .eager import rotate_torch, table_rows

__all__ = ["rotate"]


def rotate(
    xs: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    inplace: bool,
) -> list[torch.Tensor]:
    """Rotate every ``[B, S, H, D]`` tensor of ``xs``; returns the results (``xs`` themselves when ``inplace``)."""
    compiling = torch.compiler.is_compiling()
    tables_need_grad = torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad)
    if tables_need_grad or cos.dtype != torch.float32:
        # gradients with respect to the tables, or tables in another precision (e.g. float64
        # oracles): only the pure-torch path handles them
        c, s = table_rows(cos, sin, positions, batch_rows, xs[0].shape[0], xs[0].shape[1])
        return [rotate_torch(x, c, s, interleaved=interleaved, inplace=inplace) for x in xs]
    graph = compiling or (torch.is_grad_enabled() and any(x.requires_grad for x in xs))
    if not graph:
        outs = xs if inplace else [torch.empty_like(x) for x in xs]
        ops.run(xs, outs, cos, sin, positions, batch_rows, interleaved, False)
        return outs
    if inplace:
        # autograd accepts an in-place Function on a view (q sliced from qkv) only if it returns a
        # single tensor: one call per tensor here, fused q/k everywhere else
        return [ops.RotateInplace.apply(x, cos, sin, positions, batch_rows, interleaved, False)[0] for x in xs]
    if compiling:
        return list(ops.rope(xs, cos, sin, positions, batch_rows, interleaved, False))
    return list(ops.Rotate.apply(cos, sin, positions, batch_rows, interleaved, False, *xs))
