"""The fused rotation as ``torch.library`` custom ops, with autograd and fake (meta) implementations.

``rotary::rope`` (out of place) and ``rotary::rope_`` (in place) take a list of ``[B, S, H, D]``
tensors (q and k in one call) and the kernel arguments described in :func:`rotary.kernels.dispatch.rotate`.
Registering them as ops makes them opaque to ``torch.compile`` (``fullgraph=True`` traces through
the fake implementation) and lets autograd differentiate them: the backward of a rotation by theta
is the rotation by -theta, i.e. the same kernel with ``conjugate`` flipped (as in flash-attn).
In-place use under autograd goes through :class:`RotateInplace`, which marks the tensors dirty so
autograd's version counters catch any use of the overwritten values.

The device decides the kernel: the compiled CPU extension, Triton for CUDA, or the pure-torch
path when neither is available.
"""


import torch

from . import triton as triton_kernel
from .eager import rotate_rows_torch
from .extension import load_cpu_extension

__all__ = ["run", "Rotate", "RotateInplace"]

_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def run(
    xs: list[torch.Tensor],
    outs: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> None:
    """Write the rotation of each x into the matching out (which may be x itself) with the best kernel."""
    unit = all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (*xs, *outs))
    device = xs[0].device.type
    if device == "cpu" and unit and xs[0].dtype in _CPU_DTYPES:
        ext = load_cpu_extension()
        if ext is not None:
            ext.rope(xs, outs, cos, sin, positions, batch_rows, cos.shape[-1], interleaved, conjugate)
            return
    elif device == "cuda" and unit and triton_kernel.available():
        triton_kernel.rotate_triton(xs, outs, cos, sin, positions, batch_rows, interleaved, conjugate)
        return
    rotate_rows_torch(xs, outs, cos, sin, positions, batch_rows, interleaved, conjugate)


@torch.library.custom_op("rotary::rope", mutates_args=())
def rope(
    xs: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> list[torch.Tensor]:
    outs = [torch.empty_like(x) for x in xs]
    run(xs, outs, cos, sin, positions, batch_rows, interleaved, conjugate)
    return outs


@rope.register_fake
def _(xs, cos, sin, positions, batch_rows, interleaved, conjugate):
    return [torch.empty_like(x) for x in xs]


def _setup(ctx, inputs, output):
    _, cos, sin, positions, batch_rows, interleaved, conjugate = inputs
    ctx.save_for_backward(cos, sin, positions)
    ctx.batch_rows, ctx.interleaved, ctx.conjugate = batch_rows, interleaved, conjugate


def _backward(ctx, grads):
    cos, sin, positions = ctx.saved_tensors
    grads = list(grads)
    grad_xs = rope(grads, cos, sin, positions, ctx.batch_rows, ctx.interleaved, not ctx.conjugate)
    return grad_xs, None, None, None, None, None, None


rope.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("rotary::rope_", mutates_args=("xs",))
def rope_(
    xs: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> None:
    run(xs, xs, cos, sin, positions, batch_rows, interleaved, conjugate)


@rope_.register_fake
def _(xs, cos, sin, positions, batch_rows, interleaved, conjugate):
    return None


class RotateInplace(torch.autograd.Function):
    """In-place rotation of ``xs`` under autograd: ``rotary::rope_`` forward, conjugate ``rotary::rope`` backward."""

    @staticmethod
    def forward(ctx, *args):  # type: ignore[override]
        # the dirty tensors come first: for a view (q as a slice of qkv) autograd rebases the view's
        # history onto its base with CopySlices, which expects the view to be input 0
        *xs, cos, sin, positions, batch_rows, interleaved, conjugate = args
        if torch.compiler.is_compiling():
            rope_(list(xs), cos, sin, positions, batch_rows, interleaved, conjugate)
        else:  # eager: the kernel directly, without the custom op's Python dispatch
            run(list(xs), list(xs), cos, sin, positions, batch_rows, interleaved, conjugate)
        ctx.mark_dirty(*xs)
        ctx.save_for_backward(cos, sin, positions)
        ctx.batch_rows, ctx.interleaved, ctx.conjugate = batch_rows, interleaved, conjugate
        return tuple(xs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        cos, sin, positions = ctx.saved_tensors
        grad_xs = _differentiable_rotation(list(grads), cos, sin, positions, ctx.batch_rows, ctx.interleaved, not ctx.conjugate)
        return (*grad_xs, None, None, None, None, None, None)


class Rotate(torch.autograd.Function):
    """Out-of-place rotation under eager autograd.

    Same kernel and same backward as the registered op ``rotary::rope`` (which ``torch.compile``
    uses), minus the custom op's Python dispatch: at decode shapes that dispatch costs more than
    the kernel.
    """

    @staticmethod
    def forward(ctx, cos, sin, positions, batch_rows, interleaved, conjugate, *xs):  # type: ignore[override]
        ctx.save_for_backward(cos, sin, positions)
        ctx.batch_rows, ctx.interleaved, ctx.conjugate = batch_rows, interleaved, conjugate
        return tuple(_rotated_copies(list(xs), cos, sin, positions, batch_rows, interleaved, conjugate))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        cos, sin, positions = ctx.saved_tensors
        grad_xs = _differentiable_rotation(list(grads), cos, sin, positions, ctx.batch_rows, ctx.interleaved, not ctx.conjugate)
        return (None, None, None, None, None, None, *grad_xs)


def _differentiable_rotation(xs, cos, sin, positions, batch_rows, interleaved, conjugate):
    """The backward's rotation, itself differentiable (double backward, gradgradcheck)."""
    if torch.compiler.is_compiling():
        return rope(xs, cos, sin, positions, batch_rows, interleaved, conjugate)
    return Rotate.apply(cos, sin, positions, batch_rows, interleaved, conjugate, *xs)


def _rotated_copies(xs, cos, sin, positions, batch_rows, interleaved, conjugate):
    if torch.compiler.is_compiling():
        return rope(xs, cos, sin, positions, batch_rows, interleaved, conjugate)
    outs = [torch.empty_like(x) for x in xs]
    run(xs, outs, cos, sin, positions, batch_rows, interleaved, conjugate)
    return outs
