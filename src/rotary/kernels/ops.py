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

from collections.abc import Callable

import torch

from .._checks import TRANSFORMED
from ..errors import InputTypeError
from . import triton as triton_kernel
from .contract import INPUT_DTYPES, Rotation
from .eager import run_torch, table_grad_torch
from .extension import load_cpu_extension

__all__ = [
    "backend",
    "mark_written",
    "run",
    "table_grads",
    "Rotate",
    "RotateInplace",
    "rotation_op",
    "rotation_op_",
]


def mark_written(*tensors: torch.Tensor) -> None:
    """Tell autograd that a kernel wrote ``tensors`` in place: their version counters move on, as after torch's ops.

    Example:
        >>> x = torch.zeros(3)
        >>> before = x._version
        >>> mark_written(x)
        >>> x._version > before
        True
    """
    torch.autograd.graph.increment_version(tensors)


def backend(rotation: Rotation, tensors: tuple[torch.Tensor, ...]) -> str | None:
    """The kernel :func:`run` takes for ``rotation`` writing ``tensors``: ``"cpu"``, ``"triton"`` or ``None``
    (torch).
    """
    x0 = rotation.xs[0]
    if not all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in tensors):
        return None
    if not all(c.stride(-1) == 1 and c.stride() == s.stride() for c, s in zip(rotation.cos, rotation.sin)):
        return None
    if x0.device.type == "cpu" and x0.dtype in INPUT_DTYPES:
        return "cpu" if load_cpu_extension() is not None else None
    if x0.device.type == "cuda" and triton_kernel.available():
        return "triton"
    return None


def run(rotation: Rotation) -> None:
    """Write the rotation of each x into the matching out (which may be x itself) with the best kernel."""
    chosen = backend(rotation, (*rotation.xs, *rotation.outs))
    if chosen == "cpu":
        ext = load_cpu_extension()
        ext.rope(  # type: ignore[union-attr]
            list(rotation.xs),
            list(rotation.outs),
            list(rotation.cos),
            list(rotation.sin),
            rotation.positions,
            rotation.batch_rows,
            rotation.interleaved,
            rotation.conjugate,
            rotation.frequencies,
        )
    elif chosen == "triton":
        triton_kernel.run_triton(rotation)
    else:
        run_torch(rotation)


def _token_table_grads(rotation: Rotation, grads: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    chosen = backend(rotation, (*rotation.xs, *grads))
    if chosen is None:
        return table_grad_torch(rotation, grads)
    buffers = []
    for x, cos in zip(rotation.xs, rotation.cos):
        B, S, H = x.shape[:3]
        shape = (B, S, H, cos.shape[-1]) if cos.dim() == 3 else (B, S, cos.shape[-1])
        buffers.append(
            (torch.empty(shape, dtype=cos.dtype, device=x.device), torch.empty(shape, dtype=cos.dtype, device=x.device))
        )
    if chosen == "cpu":
        load_cpu_extension().rope_table_grad(  # type: ignore[union-attr]
            list(rotation.xs),
            list(grads),
            list(rotation.cos),
            list(rotation.sin),
            [b[0] for b in buffers],
            [b[1] for b in buffers],
            rotation.interleaved,
            rotation.conjugate,
        )
    else:
        triton_kernel.table_grad_triton(rotation, grads, buffers)
    return buffers


def _into_rows(rotation: Rotation, table: torch.Tensor, per_token: torch.Tensor) -> torch.Tensor:
    """Sum per-token gradients ``[B, S, (H,) r]`` into the rows of a table shaped like ``table``."""
    batch, seq_len = per_token.shape[:2]
    if rotation.positions is not None:
        out = torch.zeros_like(table)
        return out.index_add_(
            0, rotation.positions.reshape(-1), per_token.reshape(batch * seq_len, *per_token.shape[2:])
        )
    if rotation.batch_rows:
        rows = per_token.reshape(batch * seq_len, *per_token.shape[2:])
    else:
        rows = per_token.sum(0)
    if rows.shape[0] == table.shape[0]:
        return rows
    return torch.cat((rows, rows.new_zeros(table.shape[0] - rows.shape[0], *rows.shape[1:])))


def table_grads(rotation: Rotation, grads: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(d cos[i], d sin[i])`` shaped like each x's tables (per token from the kernel; pure torch under grad mode)."""
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
    return rotation.replace(xs=tuple(xs), outs=tuple(xs), cos=tuple(cos), sin=tuple(sin))


class Rotate(torch.autograd.Function):
    """Out-of-place rotation under eager autograd: ``Rotate.apply(rotation, *xs, *cos, *sin)``.

    The kernel and backward of ``rotary::rope`` without the custom op's dispatch (which costs more than the kernel
    at decode shapes); gradients reach tables that require them. The backward rotates the incoming gradient into
    one new tensor laid out like the input, never in place.
    """

    @staticmethod
    def forward(ctx, rotation: Rotation, *tensors):  # type: ignore[override]
        rot = _split(rotation, tensors)
        if torch.compiler.is_compiling():  # e.g. the backward of RotateInplace, traced
            args = (rot.positions, rot.batch_rows, rot.interleaved, rot.conjugate)
            outs = tuple(rotation_op(list(rot.xs), list(rot.cos), list(rot.sin), *args))
        else:
            outs = tuple(torch.empty_like(x) for x in rot.xs)
            run(rot.replace(outs=outs))
        tables_need_grad = any(ctx.needs_input_grad[1 + len(rot.xs) :])
        ctx.rotation = rot if tables_need_grad else rot.replace(xs=(), outs=())
        ctx.tables_need_grad = tables_need_grad
        ctx.strides = tuple(o.stride() for o in outs)  # the inputs' layout (empty_like keeps a dense one)
        ctx.save_for_backward(*(rot.xs if tables_need_grad else ()), *rot.cos, *rot.sin)
        ctx.set_materialize_grads(False)  # an output that gets no gradient gives its input none
        return outs

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        n = len(grads)
        saved = ctx.saved_tensors
        xs = saved[:n] if ctx.tables_need_grad else ()
        cos, sin = saved[-2 * n : -n], saved[-n:]
        grad_xs = _rotate_back(ctx.rotation, grads, cos, sin, ctx.strides)
        present = [i for i, g in enumerate(grads) if g is not None]
        if not ctx.tables_need_grad or not present:
            return (None, *grad_xs, *([None] * (2 * n)))
        rot = ctx.rotation
        pick = lambda seq: tuple(seq[i] for i in present)  # noqa: E731
        pairs = table_grads(rot.replace(xs=pick(xs), outs=pick(xs), cos=pick(cos), sin=pick(sin)), pick(grads))
        table_cos: list[torch.Tensor | None] = [None] * n
        table_sin: list[torch.Tensor | None] = [None] * n
        for i, (gc, gs) in zip(present, pairs):
            table_cos[i], table_sin[i] = gc, gs
        return (None, *grad_xs, *table_cos, *table_sin)


def _rotate_back(
    rotation: Rotation,
    grads: tuple[torch.Tensor | None, ...],
    cos: tuple[torch.Tensor, ...],
    sin: tuple[torch.Tensor, ...],
    strides: tuple[tuple[int, ...], ...] | None,
) -> list[torch.Tensor | None]:
    """A backward's rotation by -θ of each gradient into new tensors (``strides[i]``), never into the incoming ones."""
    present = [i for i, g in enumerate(grads) if g is not None]
    results: list[torch.Tensor | None] = [None] * len(grads)
    if not present:
        return results
    gs = tuple(grads[i] for i in present)
    cs, ss = tuple(cos[i] for i in present), tuple(sin[i] for i in present)
    conj = rotation.replace(xs=gs, outs=gs, cos=cs, sin=ss, conjugate=not rotation.conjugate)
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        outs = Rotate.apply(conj, *gs, *cs, *ss)
    else:
        if not all(torch._C._has_storage(g) for g in gs):  # the gradients of autograd.grad(..., is_grads_batched=True)
            raise InputTypeError(TRANSFORMED.format(name="a gradient"))
        outs = tuple(
            torch.empty_like(g) if strides is None else g.new_empty_strided(g.shape, strides[i])
            for i, g in zip(present, gs)
        )
        run(conj.replace(outs=outs))
    for i, out in zip(present, outs):
        results[i] = out
    return results


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


#: how an in-place target maps to the kernel's ``[B, S, H, D]`` view and back, by view operations only
Views = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


class RotateInplace(torch.autograd.Function):
    """In-place rotation under eager autograd: ``RotateInplace.apply(rotation, views, *xs, *cos, *sin)``.

    ``views``: per x, ``(to_kernel, from_kernel)`` view-only maps to the kernel's ``[B, S, H, D]`` and back, or
    ``None``. All xs rotate in one kernel call; the backward as :class:`Rotate`'s. Under ``torch.compile`` an
    in-place rotation is ``rotary::rope`` then ``copy_`` instead. A view (q sliced from qkv) must be rotated alone:
    autograd's CopySlices accepts an in-place Function on a view only with a single output.
    """

    @staticmethod
    def forward(ctx, rotation: Rotation, views: tuple[Views | None, ...], *tensors):  # type: ignore[override]
        n = len(views)
        xs, cos, sin = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        maps = tuple(v or (_identity, _identity) for v in views)
        kernel_views = tuple(m[0](x) for m, x in zip(maps, xs))
        rot = rotation.replace(xs=kernel_views, outs=kernel_views, cos=tuple(cos), sin=tuple(sin))
        run(rot)
        ctx.mark_dirty(*xs)
        ctx.rotation = rot.replace(xs=(), outs=())
        ctx.maps = maps
        ctx.save_for_backward(*cos, *sin)
        ctx.set_materialize_grads(False)  # an output that gets no gradient gives its input none
        return xs[0] if n == 1 else xs

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        n = len(grads)
        saved = ctx.saved_tensors
        gs = tuple(None if g is None else m[0](g) for m, g in zip(ctx.maps, grads))
        outs = _rotate_back(ctx.rotation, gs, saved[:n], saved[n:], None)
        back = (None if o is None else m[1](o) for m, o in zip(ctx.maps, outs))
        return (None, None, *back, *([None] * (2 * n)))


# custom ops (torch.compile) ---------------------------------------------------------------------


def _rotation(xs, cos, sin, positions, batch_rows, interleaved, conjugate, outs=None) -> Rotation:
    return Rotation(
        tuple(xs),
        tuple(xs if outs is None else outs),
        tuple(cos),
        tuple(sin),
        positions,
        batch_rows,
        interleaved,
        conjugate,
    )


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
