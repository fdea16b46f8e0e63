"""The path a rotation takes: straight to the kernel, through eager autograd, or through the custom ops.

Without autograd (inference, or ``torch.no_grad()``) the kernel is called directly; with eager
autograd through plain ``autograd.Function`` s (:class:`.ops.Rotate`, :class:`.ops.RotateInplace`);
while ``torch.compile`` traces, through the registered custom ops, which it can see through. A
custom op's Python dispatch costs tens of microseconds, more than the kernel at decode shapes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from . import ops
from .contract import Rotation

__all__ = ["rotate"]


def rotate(rotation: Rotation, *, inplace: bool) -> list[torch.Tensor]:
    """Rotate every ``[B, S, H, D]`` tensor of ``rotation.xs`` (its ``outs`` are ignored).

    Returns the results: new tensors, or the inputs themselves when ``inplace``.
    """
    xs = rotation.xs
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*xs, *rotation.cos, *rotation.sin))
    compiling = torch.compiler.is_compiling()
    if not (grad or compiling):
        outs = xs if inplace else tuple(torch.empty_like(x) for x in xs)
        ops.run(replace(rotation, outs=outs))
        return list(outs)
    tables_need_grad = grad and any(t.requires_grad for t in (*rotation.cos, *rotation.sin))
    args = (rotation.positions, rotation.batch_rows, rotation.interleaved, rotation.conjugate)
    if inplace and not tables_need_grad:
        # one call per tensor: autograd takes an in-place Function on a view (q sliced from qkv)
        # only if it returns a single tensor
        return [ops.RotateInplace.apply(rotation, x, c, s) for x, c, s in zip(xs, rotation.cos, rotation.sin)]
    if compiling:
        outs = list(ops.rotation_op(list(xs), list(rotation.cos), list(rotation.sin), *args))
    else:
        outs = list(ops.Rotate.apply(rotation, *xs, *rotation.cos, *rotation.sin))
    if inplace:  # gradients into the tables need the unrotated input: rotate out of place, then copy
        for x, out in zip(xs, outs):
            x.copy_(out)
        return list(xs)
    return outs
