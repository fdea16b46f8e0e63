"""Running a :class:`~.contract.Rotation` on the best kernel, with autograd and ``torch.compile``.

- :func:`run`: the device picks the kernel (the compiled CPU extension, Triton for CUDA, or the
  pure-torch path when neither is available).
- :func:`table_grads`: gradients with respect to the tables, per token from the kernel, summed into
  the tables' rows here.
- Autograd: the backward of a rotation by θ is the rotation by -θ, the same kernel with ``conjugate``
  flipped (as in flash-attn). Eager autograd goes through plain ``autograd.Function`` s
  (:class:`Rotate`, :class:`RotateInplace`), whose Python dispatch is cheaper than a custom op's; while
  ``torch.compile`` traces, through the registered custom ops ``rotary::rope`` (out of place),
  ``rotary::rope_`` (in place) and ``rotary::rope_table_grad``, which it can see through (their fake
  implementations trace with ``fullgraph=True``).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from . import triton as triton_kernel
from .contract import Rotation
from .eager import run_torch, table_grad_torch
from .extension import load_cpu_extension

__all__ = ["run", "table_grads", "Rotate", "RotateInplace", "rotation_op", "rotation_op_"]

_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _fused(rotation: Rotation, tensors: tuple[torch.Tensor, ...]) -> str | None:
    """``"cpu"``, ``"triton"`` or ``None`` (pure torch) for these tensors."""
    x0 = rotation.xs[0]
    if not all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in tensors):
        return None
    if not all(c.stride(-1) == 1 and c.stride() == s.stride() for c, s in zip(rotation.cos, rotation.sin)):
        return None
    if x0.device.type == "cpu" and x0.dtype in _CPU_DTYPES:
        return "cpu" if load_cpu_extension() is not None else None
    if x0.device.type == "cuda" and triton_kernel.available():
        return "triton"
    return None


def run(rotation: Rotation) -> None:
    """Write the rotation of each x into the matching out (which may be x itself) with the best kernel."""
    backend = _fused(rotation, (*rotation.xs, *rotation.outs))
    if backend == "cpu":
        ext = load_cpu_extension()
        ext.rope(  # type: ignore[union-attr]
            list(rotation.xs), list(rotation.outs), list(rotation.cos), list(rotation.sin), rotation.positions,
            rotation.batch_rows, rotation.interleaved, rotation.conjugate,
        )  # fmt: skip
    elif backend == "triton":
        triton_kernel.run_triton(rotation)
    else:
        run_torch(rotation)


def _token_table_grads(rotation: Rotation, grads: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    backend = _fused(rotation, (*rotation.xs, *grads))
    if backend is None:
        return table_grad_torch(rotation, grads)
    buffers = []
    for x, cos in zip(rotation.xs, rotation.cos):
        B, S, H = x.shape[:3]
        shape = (B, S, H, cos.shape[-1]) if cos.dim() == 3 else (B, S, cos.shape[-1])
        buffers.append((torch.empty(shape, dtype=cos.dtype, device=x.device), torch.empty(shape, dtype=cos.dtype, device=x.device)))
    if backend == "cpu":
        load_cpu_extension().rope_table_grad(  # type: ignore[union-attr]
            list(rotation.xs), list(grads), list(rotation.cos), list(rotation.sin), [b[0] for b in buffers],
            [b[1] for b in buffers], rotation.interleaved, rotation.conjugate,
        )  # fmt: skip
    else:
        triton_kernel.table_grad_triton(rotation, grads, buffers)
    return buffers


def _into_rows(rotation: Rotation, table: torch.Tensor, per_token: torch.Tensor) -> torch.Tensor:
    """Sum per-token gradients ``[B, S, (H,) r]`` into the rows of a table shaped like ``table``."""
    batch, seq_len = per_token.shape[:2]
    if rotation.positions is not None:
        out = torch.zeros_like(table)
        return out.index_add_(0, rotation.positions.reshape(-1), per_token.reshape(batch * seq_len, *per_token.shape[2:]))
    if rotation.batch_rows:
        rows = per_token.reshape(batch * seq_len, *per_token.shape[2:])
    else:
        rows = per_token.sum(0)
    if rows.shape[0] == table.shape[0]:
        return rows
    return torch.cat((rows, rows.new_zeros(table.shape[0] - rows.shape[0], *rows.shape[1:])))


def table_grads(rotation: Rotation, grads: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(d cos[i], d sin[i])`` shaped like each x's tables, for output gradients ``grads``.

    Differentiable (a pure-torch computation) when grad mode is on, i.e. inside a backward with
    ``create_graph=True``; otherwise computed per token by the kernel.
    """
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        per_token = table_grad_torch(rotation, grads)
    else:
        per_token = _token_table_grads(rotation, grads)
    return [
        (_into_rows(rotation, c, gc), _into_rows(rotation, s, gs))
        for c, s, (gc, gs) in zip(rotation.cos, rotation.sin, per_token)
    ]


# eager autograd -------------------------------------------------------------------------------


def _split(rotation: Rotation, tensors: tuple[torch.Tensor, ...]) -> Rotation:
    n = len(rotation.xs)
    xs, cos, sin = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
    return replace(rotation, xs=tuple(xs), outs=tuple(xs), cos=tuple(cos), sin=tuple(sin))


class Rotate(torch.autograd.Function):
    """Out-of-place rotation under eager autograd: ``Rotate.apply(rotation, *xs, *cos, *sin)``.

    Same kernel and same backward as the registered op ``rotary::rope`` (which ``torch.compile``
    uses), minus the custom op's Python dispatch: at decode shapes that dispatch costs more than
    the kernel. Gradients flow to the tables when they require them (learnable frequencies).
    """

    @staticmethod
    def forward(ctx, rotation: Rotation, *tensors):  # type: ignore[override]
        rot = _split(rotation, tensors)
        if torch.compiler.is_compiling():  # e.g. the backward of RotateInplace, traced
            args = (rot.positions, rot.batch_rows, rot.interleaved, rot.conjugate)
            outs = tuple(rotation_op(list(rot.xs), list(rot.cos), list(rot.sin), *args))
        else:
            outs = tuple(torch.empty_like(x) for x in rot.xs)
            run(replace(rot, outs=outs))
        tables_need_grad = any(ctx.needs_input_grad[1 + len(rot.xs) :])
        ctx.rotation = rot if tables_need_grad else replace(rot, xs=(), outs=())
        ctx.tables_need_grad = tables_need_grad
        ctx.save_for_backward(*(rot.xs if tables_need_grad else ()), *rot.cos, *rot.sin)
        return outs

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        rot: Rotation = ctx.rotation
        saved = ctx.saved_tensors
        n = len(grads)
        xs = saved[:n] if ctx.tables_need_grad else ()
        cos, sin = saved[-2 * n : -n], saved[-n:]
        conj = replace(rot, xs=grads, outs=grads, cos=cos, sin=sin, conjugate=not rot.conjugate)
        grad_xs = Rotate.apply(conj, *grads, *cos, *sin)
        if not ctx.tables_need_grad:
            return (None, *grad_xs, *([None] * (2 * n)))
        pairs = table_grads(replace(rot, xs=xs, outs=xs, cos=cos, sin=sin), grads)
        return (None, *grad_xs, *(p[0] for p in pairs), *(p[1] for p in pairs))


class RotateInplace(torch.autograd.Function):
    """In-place rotation of one tensor under autograd: ``RotateInplace.apply(rotation, x, cos, sin)``.

    The rotated tensor comes first among the tensor inputs: for a view (q as a slice of qkv) autograd
    rebases the view's history onto its base with CopySlices, which expects the dirty view to be the
    first input, and accepts an in-place Function on a view only if it returns a single tensor.
    """

    @staticmethod
    def forward(ctx, rotation: Rotation, x, cos, sin):  # type: ignore[override]
        rot = replace(rotation, xs=(x,), outs=(x,), cos=(cos,), sin=(sin,))
        if torch.compiler.is_compiling():
            rotation_op_([x], [cos], [sin], rot.positions, rot.batch_rows, rot.interleaved, rot.conjugate)
        else:
            run(rot)
        ctx.mark_dirty(x)
        ctx.rotation = replace(rot, xs=(), outs=())
        ctx.save_for_backward(cos, sin)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        conj = replace(ctx.rotation, xs=(grad,), outs=(grad,), cos=(cos,), sin=(sin,), conjugate=not ctx.rotation.conjugate)
        return None, Rotate.apply(conj, grad, cos, sin)[0], None, None


# custom ops (torch.compile) ---------------------------------------------------------------------


def _rotation(xs, cos, sin, positions, batch_rows, interleaved, conjugate, outs=None) -> Rotation:
    return Rotation(tuple(xs), tuple(xs if outs is None else outs), tuple(cos), tuple(sin), positions, batch_rows, interleaved, conjugate)


@torch.library.custom_op("rotary::rope", mutates_args=())
def rotation_op(
    xs: list[torch.Tensor],
    cos: list[torch.Tensor],
    sin: list[torch.Tensor],
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> list[torch.Tensor]:
    outs = [torch.empty_like(x) for x in xs]
    run(_rotation(xs, cos, sin, positions, batch_rows, interleaved, conjugate, outs))
    return outs


@rotation_op.register_fake
def _(xs, cos, sin, positions, batch_rows, interleaved, conjugate):
    return [torch.empty_like(x) for x in xs]


@torch.library.custom_op("rotary::rope_table_grad", mutates_args=())
def table_grad_op(
    xs: list[torch.Tensor],
    grads: list[torch.Tensor],
    cos: list[torch.Tensor],
    sin: list[torch.Tensor],
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> list[torch.Tensor]:
    pairs = table_grads(_rotation(xs, cos, sin, positions, batch_rows, interleaved, conjugate), tuple(grads))
    return [p[0] for p in pairs] + [p[1] for p in pairs]


@table_grad_op.register_fake
def _(xs, grads, cos, sin, positions, batch_rows, interleaved, conjugate):
    return [torch.empty_like(c) for c in cos] + [torch.empty_like(s) for s in sin]


def _setup(ctx, inputs, output):
    xs, cos, sin, positions, batch_rows, interleaved, conjugate = inputs
    ctx.tables_need_grad = any(t.requires_grad for t in (*cos, *sin))
    ctx.save_for_backward(*(xs if ctx.tables_need_grad else ()), *cos, *sin, positions)
    ctx.n, ctx.batch_rows, ctx.interleaved, ctx.conjugate = len(xs), batch_rows, interleaved, conjugate


def _backward(ctx, grads):
    n = ctx.n
    *rest, positions = ctx.saved_tensors
    xs = rest[:n] if ctx.tables_need_grad else []
    cos, sin = list(rest[-2 * n : -n]), list(rest[-n:])
    grads = list(grads)
    grad_xs = rotation_op(grads, cos, sin, positions, ctx.batch_rows, ctx.interleaved, not ctx.conjugate)
    if not ctx.tables_need_grad:
        return grad_xs, [None] * n, [None] * n, None, None, None, None
    table = table_grad_op(list(xs), grads, cos, sin, positions, ctx.batch_rows, ctx.interleaved, ctx.conjugate)
    return grad_xs, table[:n], table[n:], None, None, None, None


rotation_op.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("rotary::rope_", mutates_args=("xs",))
def rotation_op_(
    xs: list[torch.Tensor],
    cos: list[torch.Tensor],
    sin: list[torch.Tensor],
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> None:
    run(_rotation(xs, cos, sin, positions, batch_rows, interleaved, conjugate))


@rotation_op_.register_fake
def _(xs, cos, sin, positions, batch_rows, interleaved, conjugate):
    return None
