"""The path a rotation takes: straight to the kernel, through eager autograd, or through the custom ops.

Without autograd (inference, or ``torch.no_grad()``) the kernel is called directly; with eager
autograd through plain ``autograd.Function`` s (:class:`.ops.Rotate`, :class:`.ops.RotateInplace`);
while ``torch.compile`` traces, through the registered custom ops, which it can see through. A
custom op's Python dispatch costs tens of microseconds, more than the kernel at decode shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InputError
from . import ops
from .contract import Rotation

__all__ = ["rotate", "INPLACE_LEARNED_TABLES_COMPILED"]

#: the one combination refused under torch.compile (see :func:`rotate`)
INPLACE_LEARNED_TABLES_COMPILED = (
    "rotary: in-place rotation with tables that require grad (learnable frequencies, RoPE-Mixed) is not "
    "supported under torch.compile: the tables' gradient needs the unrotated input, and Inductor (PyTorch "
    "2.13) drops the copy of it that a compiled in-place rotation must save, which gives wrong gradients. "
    "Pass inplace=False (RotaryAttention and Decoder already rotate out of place under torch.compile)"
)


def rotate(
    rotation: Rotation, *, inplace: bool, targets: Sequence[tuple[torch.Tensor, ops.Views] | None] | None = None
) -> list[torch.Tensor]:
    """Rotate every ``[B, S, H, D]`` tensor of ``rotation.xs`` (its ``outs`` ignored): new tensors, or the inputs in
    place.

    ``targets`` (in place under eager autograd): per tensor, ``(target, (to_kernel, from_kernel))`` to record the
    rotation on ``target`` rather than the kernel view (avoiding CopySlices); its result is ``to_kernel(target)``.
    """
    xs = rotation.xs
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*xs, *rotation.cos, *rotation.sin))
    compiling = torch.compiler.is_compiling()
    args = (rotation.positions, rotation.batch_rows, rotation.interleaved, rotation.conjugate)
    if compiling:
        # the custom ops, which torch.compile sees through. In place under autograd is the out-of-place
        # op and copy_ (AOT autograd differentiates copy_ into a view of a graph input correctly; an
        # in-place Function on such a view lost its backward there); without autograd, the mutating op
        if inplace and not grad:
            ops.rotation_op_(list(xs), list(rotation.cos), list(rotation.sin), *args)
            return list(xs)
        if inplace and any(t.requires_grad for t in (*rotation.cos, *rotation.sin)):
            raise InputError(INPLACE_LEARNED_TABLES_COMPILED)
        outs = list(ops.rotation_op(list(xs), list(rotation.cos), list(rotation.sin), *args))
        if inplace:
            for x, out in zip(xs, outs):
                x.copy_(out)
            return list(xs)
        return outs
    if not grad:
        outs = xs if inplace else tuple(torch.empty_like(x) for x in xs)
        ops.run(rotation.replace(outs=outs))
        if inplace:
            ops.mark_written(*xs)
        return list(outs)
    tables_need_grad = any(t.requires_grad for t in (*rotation.cos, *rotation.sin))
    if inplace and not tables_need_grad:
        entries = [(x, None) if targets is None or targets[i] is None else targets[i] for i, x in enumerate(xs)]
        # one call for all, when none is a view and all need gradients; otherwise one per tensor:
        # autograd takes an in-place Function on a view (q sliced from qkv) only if it returns one
        # tensor, and a Function that marks a tensor needing no gradient dirty together with one that
        # needs it would tie the first into the graph (it would come back requiring grad)
        if len(entries) == 1 or all(t._base is None and t.requires_grad for t, _ in entries):
            groups = [list(range(len(entries)))]
        else:
            groups = [[i] for i in range(len(entries))]
        results: list[torch.Tensor] = [xs[0]] * len(entries)
        for group in groups:
            rotated = ops.RotateInplace.apply(
                rotation,
                tuple(entries[i][1] for i in group),
                *(entries[i][0] for i in group),
                *(rotation.cos[i] for i in group),
                *(rotation.sin[i] for i in group),
            )
            for i, r in zip(group, (rotated,) if len(group) == 1 else rotated):
                views = entries[i][1]
                results[i] = r if views is None else views[0](r)
        return results
    # in place here: gradients into the tables need the unrotated input, which autograd saves, so a
    # copy of it is rotated out of place and the result copied back
    sources = tuple(x.clone() for x in xs) if inplace else xs
    outs = list(ops.Rotate.apply(rotation, *sources, *rotation.cos, *rotation.sin))
    if inplace:
        for x, out in zip(xs, outs):
            x.copy_(out)
        return list(xs)
    return outs
