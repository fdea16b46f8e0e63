"""Per-head RMSNorm, then the rotation: the kernels of :func:`rotary.rmsnorm_rotate`, with autograd and
``torch.compile``.

The contract is a :class:`~.contract.Rotation` (never ``conjugate``) and a :class:`Norm` (per x a weight
``[D]``, ``eps``, the weight convention). Every vector ``x`` of D channels (one head of one token) becomes::

    rstd = 1 / sqrt(mean(x²) + eps)                 # fp32 (fp64 for fp64 inputs)
    n = x * rstd
    y = w * round(n)         (style "qwen3": Qwen3RMSNorm, weight w)
    y = (1 + w) * n          (style "gemma3": Gemma3RMSNorm, weight 1 + w, fp32)
    out = round(rotate(round(y)))                    # the rotation of :mod:`.contract`

``round`` is the cast to x's dtype, where Hugging Face's modules and rotary's rotation round. Backends
(:func:`run`): the CPU kernel ``rmsnorm_rope`` (bit for bit the composition: torch's order of the sum), the
Triton kernel :func:`run_triton` (one launch for q and k; Triton's order of the sum, a few ulps), the pure-torch
:func:`run_torch` elsewhere. Each writes ``rstd`` per vector for the backward (:func:`backward`), the
composition's gradient written out: eager autograd through :class:`NormRotate`, ``torch.compile`` through the
custom op ``rotary::rmsnorm_rope``. Out of place only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tables import table_dtype
from . import dispatch, ops
from . import triton as triton_kernel
from .contract import INPUT_DTYPES, Rotation
from .eager import run_torch as rotate_torch_path
from .extension import load_cpu_extension

__all__ = [
    "STYLES",
    "Norm",
    "NormRotate",
    "apply",
    "backward",
    "effective_weight",
    "norm_rotation_op",
    "run",
    "run_torch",
]

#: the weight conventions: style -> (the factor is 1 + weight, the normalised x is rounded before the weight)
STYLES: dict[str, tuple[bool, bool]] = {"qwen3": (False, True), "gemma3": (True, False)}


@dataclass(frozen=True)
class Norm:
    """The normalisation of one call: ``weights[i]`` ``[D]`` for ``xs[i]``, ``eps``, and the convention
    (``gemma``: the factor is ``1 + weight``, multiplied in fp32; otherwise the weight multiplies the
    normalised x rounded to x's dtype, as Qwen3RMSNorm does)."""

    weights: tuple[torch.Tensor, ...]
    eps: float
    gemma: bool

    @property
    def round_normed(self) -> bool:
        return not self.gemma


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The arithmetic dtype for inputs of ``x``'s dtype: that of the tables (:func:`rotary.tables.table_dtype`)."""
    return table_dtype(x.dtype)


def effective_weight(weight: torch.Tensor, gemma: bool, compute: torch.dtype) -> torch.Tensor:
    """The factor applied to the normalised x, contiguous ``[D]`` in ``compute``: ``weight`` (exact: a
    bf16/fp16 weight is exactly representable in fp32), or Gemma's ``1 + weight`` computed as
    Gemma3RMSNorm does (``1.0 + weight.float()``)."""
    w = weight.to(compute)
    return (1.0 + w if gemma else w).contiguous()


def backend(rotation: Rotation) -> str | None:
    """``"cpu"``, ``"triton"`` or ``None`` (pure torch) for this call."""
    x0 = rotation.xs[0]
    for t in (*rotation.xs, *rotation.outs):  # loops, not all(...): this runs at every decoding step
        if t.stride(-1) != 1 and t.shape[-1] != 1:
            return None
    for c, s in zip(rotation.cos, rotation.sin):
        if c.stride(-1) != 1 or c.stride() != s.stride():
            return None
    if x0.device.type == "cpu" and x0.dtype in INPUT_DTYPES:
        return "cpu" if load_cpu_extension() is not None else None
    if x0.device.type == "cuda" and triton_kernel.available():
        return "triton"
    return None


def run(rotation: Rotation, norm: Norm, rstds: tuple[torch.Tensor, ...]) -> None:
    """Normalise and rotate each x of ``rotation`` into its out with the best kernel; ``rstds[i]``
    (``[B, S, H_i]``, the arithmetic dtype) receives each vector's ``1 / sqrt(mean(x²) + eps)``."""
    backend_name = backend(rotation)
    compute = compute_dtype(rotation.xs[0])
    if backend_name != "triton" and rotation.cos[0].dtype != compute:  # q's and k's tables share a dtype (RotaryTables)
        # 16-bit tables (rotary.rmsnorm_rotate passes a model's own to the Triton kernel, which widens
        # them as it loads them): widened here for the other backends, exactly; a table q and k share, once
        wide: dict[int, torch.Tensor] = {}

        def widen(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in wide:
                wide[id(t)] = t.to(compute)
            return wide[id(t)]

        rotation = rotation.replace(cos=tuple(map(widen, rotation.cos)), sin=tuple(map(widen, rotation.sin)))
    if backend_name == "cpu":
        weights = [effective_weight(w, norm.gemma, compute_dtype(x)) for w, x in zip(norm.weights, rotation.xs)]
        load_cpu_extension().rmsnorm_rope(  # type: ignore[union-attr]
            list(rotation.xs),
            list(rotation.outs),
            list(rstds),
            weights,
            list(rotation.cos),
            list(rotation.sin),
            rotation.positions,
            rotation.batch_rows,
            rotation.interleaved,
            norm.round_normed,
            norm.eps,
            rotation.frequencies,
        )
    elif backend_name == "triton":  # the weights as they are: the kernel widens them (and adds Gemma's 1) itself
        run_triton(rotation, [w.contiguous() for w in norm.weights], rstds, norm.round_normed, norm.eps)
    else:
        run_torch(rotation, norm, rstds)


def normalise_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the last dim of ``x`` as Hugging Face writes it (Qwen3RMSNorm, or Gemma3RMSNorm with
    ``gemma``), in the arithmetic dtype (fp32, fp64 for fp64 inputs); returns ``(y, rstd)``, ``y`` in x's
    dtype and ``rstd`` without the channel dim. Autograd sees ordinary torch operations."""
    compute = compute_dtype(x)
    xf = x.to(compute)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    n = xf * rstd
    if gemma:
        y = (n * (1.0 + weight.to(compute))).to(x.dtype)
    else:
        y = (weight.to(compute) * n.to(x.dtype).to(compute)).to(x.dtype)
    return y, rstd.squeeze(-1)


def run_torch(rotation: Rotation, norm: Norm, rstds: tuple[torch.Tensor, ...]) -> None:
    """The contract in pure torch: the composition, normalisation then :func:`.eager.run_torch`."""
    ys = []
    for x, w, rstd in zip(rotation.xs, norm.weights, rstds):
        y, r = normalise_torch(x, w, norm.eps, norm.gemma)
        rstd.copy_(r)
        ys.append(y)
    rotate_torch_path(rotation.replace(xs=tuple(ys)))


# Triton --------------------------------------------------------------------------------------------

triton = triton_kernel.triton
tl = triton_kernel.tl

if triton is not None:
    token_row = triton_kernel.token_row  # the per-token prologue the rotation kernels share
    table_pairs = triton_kernel.table_pairs  # a token's cos/sin pairs, read or computed
    split_pairs = triton_kernel.split_pairs  # interleaved rows <-> their pairs' two channels
    join_pairs = triton_kernel.join_pairs

    @triton.jit
    def _norm_rotate_heads(
        X,
        OUT,
        RSTD,
        W,
        COS,
        SIN,
        FREQ,
        b,
        s,
        t,
        p,
        computed,
        poison,
        heads,
        H,
        eps,
        table_stride,
        head_stride,
        sxb,
        sxs,
        sxh,
        sob,
        sos,
        soh,
        srb,
        srs,
        srh,
        HALF: tl.constexpr,
        D: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_REST: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        ROUND_NORMED: tl.constexpr,
        FP64: tl.constexpr,
        COMPUTE: tl.constexpr,
    ):
        """Normalise and rotate ``heads`` (a block of head indices, masked by ``< H``) of token (b, s)
        with table row ``t`` (or the row computed at position ``p``: :func:`.triton.table_pairs`);
        ``poison`` is 0, or NaN for a token outside a table that cannot compute its rows. Each channel is
        loaded once: the pairs' two halves, and the channels past the rotated ones."""
        compute = tl.float64 if FP64 else tl.float32
        dtype = OUT.dtype.element_ty
        live = heads < H
        x = X + b * sxb + s * sxs + heads[:, None] * sxh
        o = OUT + b * sob + s * sos + heads[:, None] * soh
        # every load first (x, the weight, the tables), the rstd store last: a load issued after a store
        # (which may alias it) waits for that store, one memory round trip more per program. a and z are
        # the pairs' first and second channels, [BLOCK_H, BLOCK_P]; the weight's, [1, BLOCK_P]
        if INTERLEAVED:  # pairs (2i, 2i + 1): contiguous rows (16-byte accesses) split in registers
            j = tl.arange(0, 2 * BLOCK_P)
            mask = live[:, None] & (j < 2 * HALF)[None, :]
            a, z = split_pairs(tl.load(x + j[None, :], mask=mask, other=0.0), BLOCK_P)
            c, sn = table_pairs(
                COS,
                SIN,
                FREQ,
                t,
                p,
                computed,
                heads,
                live,
                table_stride,
                head_stride,
                HALF,
                BLOCK_P,
                INTERLEAVED,
                False,
                COMPUTE,
                FP64,
            )
            # the weight last: its row goes through shared memory into the pairs' layout (a barrier)
            wa, wz = split_pairs(tl.load(W + j[None, :], mask=(j < 2 * HALF)[None, :], other=0.0), BLOCK_P)
        else:
            pair = tl.arange(0, BLOCK_P)
            mask = live[:, None] & (pair < HALF)[None, :]
            a = tl.load(x + pair[None, :], mask=mask, other=0.0)
            z = tl.load(x + (pair + HALF)[None, :], mask=mask, other=0.0)
            wa = tl.load(W + pair, mask=pair < HALF, other=0.0)[None, :]
            wz = tl.load(W + HALF + pair, mask=pair < HALF, other=0.0)[None, :]
            c, sn = table_pairs(
                COS,
                SIN,
                FREQ,
                t,
                p,
                computed,
                heads,
                live,
                table_stride,
                head_stride,
                HALF,
                BLOCK_P,
                INTERLEAVED,
                False,
                COMPUTE,
                FP64,
            )
        if D > 2 * HALF:
            rest = 2 * HALF + tl.arange(0, BLOCK_REST)
            rest_mask = live[:, None] & (rest < D)[None, :]
            e = tl.load(x + rest[None, :], mask=rest_mask, other=0.0).to(compute)
            we = tl.load(W + rest, mask=rest < D, other=0.0)
        a = a.to(compute)
        z = z.to(compute)
        # the weight as given, widened (exact), and Gemma's factor 1 + w formed in the arithmetic dtype, as
        # Gemma3RMSNorm forms it in fp32 (effective_weight on the other paths)
        wa = wa.to(compute)
        wz = wz.to(compute)
        if not ROUND_NORMED:
            wa = 1.0 + wa
            wz = 1.0 + wz
        c = c + poison
        squares = tl.sum(a * a + z * z, axis=1)
        if D > 2 * HALF:
            squares += tl.sum(e * e, axis=1)
        rstd = 1.0 / tl.sqrt(squares / D + eps)
        na = a * rstd[:, None]
        nz = z * rstd[:, None]
        if ROUND_NORMED:  # Qwen3RMSNorm: the weight multiplies x's dtype
            na = na.to(dtype).to(compute)
            nz = nz.to(dtype).to(compute)
        ya = (wa * na).to(dtype).to(compute)
        yz = (wz * nz).to(dtype).to(compute)
        out_a = (ya * c - yz * sn).to(dtype)
        out_z = (yz * c + ya * sn).to(dtype)
        if INTERLEAVED:
            tl.store(o + j[None, :], join_pairs(out_a, out_z, BLOCK_P), mask=mask)
        else:
            tl.store(o + pair[None, :], out_a, mask=mask)
            tl.store(o + (pair + HALF)[None, :], out_z, mask=mask)
        if D > 2 * HALF:  # channels past the rotated ones: normalised, not rotated
            ne = e * rstd[:, None]
            if ROUND_NORMED:
                ne = ne.to(dtype).to(compute)
            we = we.to(compute)
            if not ROUND_NORMED:
                we = 1.0 + we
            tl.store(o + rest[None, :], (we[None, :] * ne).to(dtype), mask=rest_mask)
        tl.store(RSTD + b * srb + s * srs + heads * srh, rstd, mask=live)

    @triton.jit
    def _norm_rotary_kernel(
        XQ,
        OUTQ,
        RSTDQ,
        WQ,
        COSQ,
        SINQ,
        XK,
        OUTK,
        RSTDK,
        WK,
        COSK,
        SINK,
        POS,
        FREQ,
        S,
        HQ,
        HK,
        Q_BLOCKS,
        table_rows,
        batch_rows,
        spb,
        sps,
        eps: tl.float64,
        tq_stride,
        tq_head,
        sqb,
        sqs,
        sqh,
        soqb,
        soqs,
        soqh,
        srqb,
        srqs,
        srqh,
        tk_stride,
        tk_head,
        skb,
        sks,
        skh,
        sokb,
        soks,
        sokh,
        srkb,
        srks,
        srkh,
        HALF: tl.constexpr,
        D: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_REST: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        ROUND_NORMED: tl.constexpr,
        HAS_POSITIONS: tl.constexpr,
        FP64: tl.constexpr,
        WIDE: tl.constexpr,
        COMPUTE: tl.constexpr,
    ):
        # program (token, head block): blocks 0 .. Q_BLOCKS - 1 take q's heads, the rest k's (one launch for
        # both, as the rotation kernel; positions handled as there)
        row = tl.program_id(0)
        block = tl.program_id(1)
        if WIDE:  # offsets in int64 (triton_kernel.wide_offsets)
            row = row.to(tl.int64)
            block = block.to(tl.int64)
        # eps arrives as a double (a Python float would be passed as fp32) and is rounded to the arithmetic
        # dtype once, as torch rounds a Python scalar added to a tensor (tl.full: the interpreter passes a float)
        eps = tl.full((), eps, tl.float64).to(tl.float64 if FP64 else tl.float32)
        b, s, t, p, computed, poison = token_row(
            POS, row, S, table_rows, batch_rows, spb, sps, HAS_POSITIONS, COMPUTE, FP64
        )
        if block < Q_BLOCKS:
            heads = block * BLOCK_H + tl.arange(0, BLOCK_H)
            _norm_rotate_heads(
                XQ,
                OUTQ,
                RSTDQ,
                WQ,
                COSQ,
                SINQ,
                FREQ,
                b,
                s,
                t,
                p,
                computed,
                poison,
                heads,
                HQ,
                eps,
                tq_stride,
                tq_head,
                sqb,
                sqs,
                sqh,
                soqb,
                soqs,
                soqh,
                srqb,
                srqs,
                srqh,
                HALF,
                D,
                BLOCK_P,
                BLOCK_REST,
                INTERLEAVED,
                ROUND_NORMED,
                FP64,
                COMPUTE,
            )
        else:
            heads = (block - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
            _norm_rotate_heads(
                XK,
                OUTK,
                RSTDK,
                WK,
                COSK,
                SINK,
                FREQ,
                b,
                s,
                t,
                p,
                computed,
                poison,
                heads,
                HK,
                eps,
                tk_stride,
                tk_head,
                skb,
                sks,
                skh,
                sokb,
                soks,
                sokh,
                srkb,
                srks,
                srkh,
                HALF,
                D,
                BLOCK_P,
                BLOCK_REST,
                INTERLEAVED,
                ROUND_NORMED,
                FP64,
                COMPUTE,
            )


def run_triton(
    rotation: Rotation, weights: list[torch.Tensor], rstds: tuple[torch.Tensor, ...], round_normed: bool, eps: float
) -> None:
    """Normalise and rotate each ``[B, S, H, D]`` x into its out, q and k per launch; positions as
    :func:`.triton.run_triton`.
    """
    if triton is None:
        raise RuntimeError("rotary: Triton is not installed")
    n = len(rotation.xs)
    for i in range(0, n, 2):
        _launch(rotation, weights, rstds, round_normed, eps, i, i + 1 if i + 1 < n else None)


def _launch(
    rotation: Rotation,
    weights: list[torch.Tensor],
    rstds: tuple[torch.Tensor, ...],
    round_normed: bool,
    eps: float,
    i: int,
    j: int | None,
) -> None:
    r = rotation.rotary_dim
    positions = rotation.positions
    x, out, rstd, w = rotation.xs[i], rotation.outs[i], rstds[i], weights[i]
    cos, sin = rotation.cos_sin(i)
    B, S, HQ, D = x.shape
    if j is None:
        xk, outk, rstdk, wk, HK = x, out, rstd, w, 0
        cos_k, sin_k = cos, sin
    else:
        xk, outk, rstdk, wk = rotation.xs[j], rotation.outs[j], rstds[j], weights[j]
        HK = xk.shape[2]
        cos_k, sin_k = rotation.cos_sin(j)
    if B * S == 0 or HQ + HK == 0:
        return
    block_h = triton_kernel.heads_per_program(x, HQ, HK)  # about 4 KiB of one token per program
    q_blocks = triton_kernel.cdiv(HQ, block_h)
    pos = positions if positions is not None else cos  # placeholder pointer, unused without positions
    spb, sps = (positions.stride(0), positions.stride(1)) if positions is not None else (0, 0)
    compute = rotation.frequencies is not None and positions is not None
    grid = (B * S, q_blocks + triton_kernel.cdiv(HK, block_h))
    head = lambda t: t.stride(1) if t.dim() == 3 else 0  # noqa: E731  (per-head tables [N, H, r])
    _norm_rotary_kernel[grid](
        x,
        out,
        rstd,
        w,
        cos,
        sin,
        xk,
        outk,
        rstdk,
        wk,
        cos_k,
        sin_k,
        pos,
        rotation.frequencies if compute else cos,
        S,
        HQ,
        HK,
        q_blocks,
        cos.shape[0],
        rotation.batch_rows,
        spb,
        sps,
        eps,
        cos.stride(0),
        head(cos),
        *x.stride()[:3],
        *out.stride()[:3],
        *rstd.stride(),
        cos_k.stride(0),
        head(cos_k),
        *xk.stride()[:3],
        *outk.stride()[:3],
        *rstdk.stride(),
        HALF=r // 2,
        D=D,
        BLOCK_H=block_h,
        BLOCK_P=triton_kernel.next_power_of_2(r // 2),
        BLOCK_REST=triton_kernel.next_power_of_2(max(D - r, 1)),
        INTERLEAVED=rotation.interleaved,
        ROUND_NORMED=round_normed,
        HAS_POSITIONS=positions is not None,
        FP64=x.dtype == torch.float64,
        WIDE=triton_kernel.wide_offsets(x, out, xk, outk, cos, cos_k),
        COMPUTE=compute,
    )


# forward and backward ----------------------------------------------------------------------------


def forward(rotation: Rotation, norm: Norm) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """New outputs (laid out like the xs) and rstds ``[B, S, H_i]`` of one call."""
    outs = tuple([torch.empty_like(x) for x in rotation.xs])
    rstds = tuple([x.new_empty(x.shape[:3], dtype=compute_dtype(x)) for x in rotation.xs])
    run(rotation.replace(outs=outs), norm, rstds)
    return list(outs), list(rstds)


def backward(
    rotation: Rotation,
    norm: Norm,
    rstds: tuple[torch.Tensor, ...],
    grads: tuple[torch.Tensor | None, ...],
    *,
    op: bool = False,
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """Gradients ``(d xs, d weights)`` for output gradients ``grads`` (``None``: that output got none).

    With ``g_y`` the gradient rotated back by -θ, ``n = x * rstd``, the factor ``f`` (``w`` or ``1 + w``) and ``m``
    the value it multiplied: ``d w = Σ g_y * m``, ``g_n = g_y * f``, ``d x = rstd * (g_n - n * mean(g_n * n))``.
    Differentiable under grad mode; ``op``: rotate through ``rotary::rope`` (traced by AOT autograd).
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    grad_xs: list[torch.Tensor | None] = [None] * len(grads)
    grad_ws: list[torch.Tensor | None] = [None] * len(grads)
    if not present:
        return grad_xs, grad_ws
    xs = [rotation.xs[i] for i in present]
    gs = tuple(grads[i].to(compute_dtype(x)) for i, x in zip(present, xs))  # type: ignore[union-attr]
    back = rotation.replace(
        xs=gs,
        outs=gs,
        cos=tuple(rotation.cos[i] for i in present),
        sin=tuple(rotation.sin[i] for i in present),
        conjugate=True,
    )
    if op:
        g_ys = ops.rotation_op(
            list(back.xs), list(back.cos), list(back.sin), back.positions, back.batch_rows, back.interleaved, True
        )
    else:
        g_ys = dispatch.rotate(back, inplace=False)
    for i, x, g_y in zip(present, xs, g_ys):
        compute = compute_dtype(x)
        weight = norm.weights[i]
        xf = x.to(compute)
        if torch.is_grad_enabled():  # create_graph: rstd as a function of x, for the second derivative
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.eps)
        else:
            rstd = rstds[i].unsqueeze(-1)
        n = xf * rstd
        if norm.gemma:
            factor, multiplied = 1.0 + weight.to(compute), n
        else:
            factor, multiplied = weight.to(compute), n.to(x.dtype).to(compute)
        grad_ws[i] = (g_y * multiplied).sum((0, 1, 2)).to(weight.dtype)
        g_n = g_y * factor
        grad_xs[i] = (rstd * (g_n - n * (g_n * n).mean(-1, keepdim=True))).to(x.dtype)
    return grad_xs, grad_ws


class NormRotate(torch.autograd.Function):
    """Eager autograd: ``NormRotate.apply(rotation, norm, *xs, *weights)`` -> the outputs (tables without grad)."""

    @staticmethod
    def forward(ctx, rotation: Rotation, norm: Norm, *tensors):  # type: ignore[override]
        n = len(rotation.xs)
        xs, weights = tensors[:n], tensors[n:]
        rot = rotation.replace(xs=tuple(xs), outs=tuple(xs))
        nrm = Norm(tuple(weights), norm.eps, norm.gemma)
        outs, rstds = forward(rot, nrm)
        ctx.rotation = rot.replace(xs=(), outs=())
        ctx.norm = Norm((), norm.eps, norm.gemma)
        ctx.save_for_backward(*xs, *weights, *rstds)
        ctx.set_materialize_grads(False)  # an output that gets no gradient gives its input none
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        n = len(grads)
        saved = ctx.saved_tensors
        xs, weights, rstds = saved[:n], saved[n : 2 * n], saved[2 * n :]
        rot = ctx.rotation.replace(xs=tuple(xs), outs=tuple(xs))
        grad_xs, grad_ws = backward(rot, Norm(tuple(weights), ctx.norm.eps, ctx.norm.gemma), tuple(rstds), grads)
        return (None, None, *grad_xs, *grad_ws)


# custom op (torch.compile) ---------------------------------------------------------------------------


@torch.library.custom_op("rotary::rmsnorm_rope", mutates_args=())
def norm_rotation_op(
    xs: list[torch.Tensor],
    weights: list[torch.Tensor],
    cos: list[torch.Tensor],
    sin: list[torch.Tensor],
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    gemma: bool,
    eps: float,
) -> list[torch.Tensor]:
    """The outputs, then the rstds, of :func:`forward`."""
    rotation = Rotation(tuple(xs), tuple(xs), tuple(cos), tuple(sin), positions, batch_rows, interleaved)
    outs, rstds = forward(rotation, Norm(tuple(weights), eps, gemma))
    return outs + rstds


@norm_rotation_op.register_fake
def _(xs, weights, cos, sin, positions, batch_rows, interleaved, gemma, eps):
    return [torch.empty_like(x) for x in xs] + [x.new_empty(x.shape[:3], dtype=compute_dtype(x)) for x in xs]


def _setup(ctx, inputs, output):
    xs, weights, cos, sin, positions, batch_rows, interleaved, gemma, eps = inputs
    n = len(xs)
    ctx.save_for_backward(*xs, *weights, *cos, *sin, *output[n:], positions)
    ctx.n, ctx.batch_rows, ctx.interleaved, ctx.gemma, ctx.eps = n, batch_rows, interleaved, gemma, eps


def _op_backward(ctx, grads):
    n = ctx.n
    *saved, positions = ctx.saved_tensors
    xs, weights, cos, sin, rstds = (tuple(saved[i * n : (i + 1) * n]) for i in range(5))
    rotation = Rotation(xs, xs, cos, sin, positions, ctx.batch_rows, ctx.interleaved)
    grad_xs, grad_ws = backward(rotation, Norm(weights, ctx.eps, ctx.gemma), rstds, tuple(grads[:n]), op=True)
    return grad_xs, grad_ws, [None] * n, [None] * n, None, None, None, None, None


norm_rotation_op.register_autograd(_op_backward, setup_context=_setup)


def apply(rotation: Rotation, norm: Norm) -> list[torch.Tensor]:
    """Normalise and rotate every ``[B, S, H, D]`` x of ``rotation`` (its ``outs`` are ignored): straight
    to the kernel without autograd, through :class:`NormRotate` under eager autograd, through the custom
    op while ``torch.compile`` traces. Returns new tensors laid out like the xs."""
    xs = rotation.xs
    if torch.compiler.is_compiling():
        outs = norm_rotation_op(
            list(xs),
            list(norm.weights),
            list(rotation.cos),
            list(rotation.sin),
            rotation.positions,
            rotation.batch_rows,
            rotation.interleaved,
            norm.gemma,
            norm.eps,
        )
        return list(outs[: len(xs)])
    if torch.is_grad_enabled() and any(t.requires_grad for t in (*xs, *norm.weights)):
        return list(NormRotate.apply(rotation, norm, *xs, *norm.weights))
    return forward(rotation, norm)[0]
