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

import sys
from collections.abc import Callable

import torch

from . import triton as triton_kernel
from .contract import Rotation
from .eager import run_torch, table_grad_torch
from .extension import load_cpu_extension

__all__ = ["run", "table_grads", "Rotate", "RotateInplace", "owned_gradient", "rotation_op", "rotation_op_"]

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
    return rotation.replace(xs=tuple(xs), outs=tuple(xs), cos=tuple(cos), sin=tuple(sin))


class Rotate(torch.autograd.Function):
    """Out-of-place rotation under eager autograd: ``Rotate.apply(rotation, *xs, *cos, *sin)``.

    Same kernel and same backward as the registered op ``rotary::rope`` (which ``torch.compile``
    uses), minus the custom op's Python dispatch: at decode shapes that dispatch costs more than
    the kernel. Gradients flow to the tables when they require them (learnable frequencies).

    Memory: the forward allocates one output per input, the backward one gradient per input,
    rotated straight from the incoming gradient (any strides) into memory laid out like the input
    (so autograd accumulates it into ``x.grad`` without a copy); nothing else of q/k's size.
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
        return outs

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        rot: Rotation = ctx.rotation
        saved = ctx.saved_tensors
        n = len(grads)
        xs = saved[:n] if ctx.tables_need_grad else ()
        cos, sin = saved[-2 * n : -n], saved[-n:]
        conj = rot.replace(xs=grads, outs=grads, cos=cos, sin=sin, conjugate=not rot.conjugate)
        if torch.is_grad_enabled() or torch.compiler.is_compiling():  # create_graph: differentiable
            grad_xs = Rotate.apply(conj, *grads, *cos, *sin)
        else:
            grad_xs = tuple(
                torch.empty_strided(g.shape, stride, dtype=g.dtype, device=g.device) for g, stride in zip(grads, ctx.strides)
            )
            run(conj.replace(outs=grad_xs))
        if not ctx.tables_need_grad:
            return (None, *grad_xs, *([None] * (2 * n)))
        pairs = table_grads(rot.replace(xs=xs, outs=xs, cos=cos, sin=sin), grads)
        return (None, *grad_xs, *(p[0] for p in pairs), *(p[1] for p in pairs))


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


_EXCLUSIVE: set[tuple[int, ...]] | None = None  # signatures of gradients nobody else holds


def _signature(grad: torch.Tensor) -> tuple[int, ...] | None:
    """Who holds ``grad`` (and its base, for a view): C++ use counts, storage users, Python references."""
    base = grad._base
    own = (grad._use_count(), torch._C._storage_Use_Count(grad.untyped_storage()._cdata), sys.getrefcount(grad))
    if base is None:
        return own
    if base._base is not None:
        return None
    return (*own, base._use_count(), sys.getrefcount(base))


class _Probe(torch.autograd.Function):
    """Calibration of :func:`owned_gradient`: gradients nobody else holds, seen from a backward."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x * 1

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        _calibrate(grad)  # called as RotateInplace.backward calls owned_gradient: the same references
        return grad


def _calibrate(grad: torch.Tensor) -> None:
    signature = _signature(grad)
    if _EXCLUSIVE is not None and signature is not None:
        _EXCLUSIVE.add(signature)


def owned_gradient(grad: torch.Tensor) -> bool:
    """Whether a backward may overwrite the incoming ``grad``: nothing else holds it.

    Autograd hands one gradient tensor to several consumers (the two inputs of an addition), keeps
    the user's ``grad_tensors``, stores what tensor hooks keep, and passes views (a reshaped
    gradient) whose base others may hold. Overwriting is safe only when the tensor, its memory and,
    for a view, its base have no user but the engine's one reference: the C++ use counts and the
    Python reference counts must equal those of gradients known to be exclusive, measured once by
    two probe backwards (a fresh gradient and a view of one) that ask in the same way. Call this
    first thing in a backward, before making views of ``grad``. When the private counters are
    unavailable the answer is ``False``: the caller allocates, which is always safe.
    """
    global _EXCLUSIVE
    try:
        if _EXCLUSIVE is None:
            _EXCLUSIVE = set()
            with torch.enable_grad():
                probe = torch.zeros(2, requires_grad=True)
                torch.autograd.backward(_Probe.apply(probe) * 2, torch.ones(2))  # a fresh gradient
                torch.autograd.backward((_Probe.apply(probe).view(1, 2) * 2).sum())  # a view of one
        return _signature(grad) in _EXCLUSIVE and torch._debug_has_internal_overlap(grad) == 0
    except (AttributeError, RuntimeError, TypeError):  # pragma: no cover - a PyTorch without these counters
        return False


#: how an in-place target maps to the kernel's ``[B, S, H, D]`` view and back, by view operations only
Views = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


class RotateInplace(torch.autograd.Function):
    """In-place rotation of one tensor under autograd: ``RotateInplace.apply(rotation, x, cos, sin, views)``.

    ``views``: ``(to_kernel, from_kernel)``, functions mapping ``x`` (and a gradient shaped like it) to
    the kernel's ``[B, S, H, D]`` view and back by view operations only, e.g. ``transpose(1, 2)`` for
    ``[B, H, S, D]`` storage, or splitting the last dim of a projection output ``[B, S, H * D]`` into
    heads; ``None``: ``x`` already is that view.

    The backward rotates the incoming gradient in place when nothing else holds it (see
    :func:`owned_gradient`; attention's backward produces such gradients), so a training step
    allocates nothing of q/k's size here; otherwise it rotates into one new tensor.

    The rotated tensor comes first among the tensor inputs: for a view (q as a slice of qkv) autograd
    rebases the view's history onto its base with CopySlices, which expects the dirty view to be the
    first input, and accepts an in-place Function on a view only if it returns a single tensor.
    """

    @staticmethod
    def forward(ctx, rotation: Rotation, x, cos, sin, views: Views | None = None):  # type: ignore[override]
        views = views or (_identity, _identity)
        view = views[0](x)
        rot = rotation.replace(xs=(view,), outs=(view,), cos=(cos,), sin=(sin,))
        if torch.compiler.is_compiling():
            rotation_op_([view], [cos], [sin], rot.positions, rot.batch_rows, rot.interleaved, rot.conjugate)
        else:
            run(rot)
        ctx.mark_dirty(x)
        ctx.rotation = rot.replace(xs=(), outs=())
        ctx.views = views
        ctx.save_for_backward(cos, sin)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        to_kernel, from_kernel = ctx.views
        conj = ctx.rotation.replace(cos=(cos,), sin=(sin,), conjugate=not ctx.rotation.conjugate)
        owned = not (torch.is_grad_enabled() or torch.compiler.is_compiling()) and owned_gradient(grad)
        g = to_kernel(grad)  # a view of grad: asked after owned_gradient, which counts grad's users
        if owned:
            run(conj.replace(xs=(g,), outs=(g,)))
            return None, from_kernel(g), None, None, None
        out = Rotate.apply(conj.replace(xs=(g,), outs=(g,)), g, cos, sin)[0]
        return None, from_kernel(out), None, None, None


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
