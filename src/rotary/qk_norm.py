"""QK-norm then RoPE in one pass: :func:`rmsnorm_rotate`, and :func:`rms_norm`, the norm it fuses.

Qwen3, Qwen3-MoE and Gemma-3 attention normalise every head of q and k (RMSNorm) before rotating them;
:func:`rmsnorm_rotate` reads and writes q and k once and returns what the composition returns: bit for bit
on the CPU (the compiled kernel), to a few fp32 ulps on CUDA (one Triton launch, the squares summed in
another order), the pure-torch composition without either. The backward is the composition's gradient,
written out (:func:`rotary.kernels.norm.backward`). Papers, numerics and an example: docs/core.md,
"QK-norm then RoPE".
"""

from __future__ import annotations

import math
import threading
from typing import Any, Literal

import torch

from . import plans
from . import positions as P
from ._checks import check_choice, check_untransformed, is_int
from .errors import InputError, InputTypeError
from .kernels import norm as kernels
from .kernels.contract import Rotation
from .kernels.extension import load_cpu_extension
from .plans import GENERAL, Plan, PlanCache
from .positions import Positions
from .rotation import (
    Layout,
    addressing,
    check_dtype,
    check_head_dim,
    check_inputs,
    check_layout,
    check_strided,
    kernel_tables,
    layout_code,
    rotate,
)
from .tables import RotaryTables, table_dtype

__all__ = ["STYLES", "Style", "rms_norm", "rmsnorm_rotate"]

Style = Literal["qwen3", "gemma3"]

#: the weight conventions :func:`rmsnorm_rotate` and :func:`rms_norm` take (see :func:`rms_norm`)
STYLES: tuple[str, ...] = tuple(kernels.STYLES)


def _check_style(style: Any) -> bool:
    """``True`` for Gemma's convention (the factor is ``1 + weight``)."""
    return kernels.STYLES[check_choice(style, "style", STYLES)][0]


def _check_eps(eps: Any) -> float:
    """A finite number > 0, by comparisons only (traceable as a symbolic float under
    ``torch.compile(dynamic=True)``).
    """
    if isinstance(eps, torch.Tensor):
        raise InputTypeError(
            f"eps must be a Python number > 0 (e.g. config.rms_norm_eps), got a tensor of shape {tuple(eps.shape)}"
        )
    number = isinstance(eps, float) or is_int(eps) or type(eps).__name__ in ("float16", "float32", "float64")
    if not number or not 0 < eps < math.inf:  # NaN fails the first comparison
        raise InputError(f"eps must be a finite number > 0, got {eps!r}")
    return eps if isinstance(eps, float) else float(eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6, style: Style = "qwen3") -> torch.Tensor:
    """RMSNorm over the last dim of ``x``, exactly as Hugging Face's modules compute it (a plain torch function).

    ``n = x / sqrt(mean(x²) + eps)`` in fp32 (float64 for float64 inputs), then ``style="qwen3"``
    (``Qwen3RMSNorm``, Llama's): ``weight * n`` with ``n`` rounded to ``x.dtype`` first, or ``style="gemma3"``
    (``Gemma3RMSNorm``): ``n * (1 + weight)`` in fp32.

    Args:
        x: ``[..., D]``, fp32, bf16, fp16 or float64.
        weight: ``[D]``, of ``x``'s dtype or fp32.
        eps: added to the mean square, a finite number > 0.
        style: ``"qwen3"`` or ``"gemma3"``.

    Returns:
        ``[..., D]`` in ``x.dtype``.

    Example:
        >>> x = torch.tensor([[3.0, 4.0]])
        >>> rms_norm(x, torch.ones(2), eps=1e-12)  # the mean square is 12.5
        tensor([[0.8485, 1.1314]])
        >>> torch.equal(rms_norm(x, torch.zeros(2), style="gemma3"), rms_norm(x, torch.ones(2)))
        True
    """
    gemma = _check_style(style)
    eps = _check_eps(eps)
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        raise InputTypeError(f"x and weight must be tensors, got {type(x).__name__} and {type(weight).__name__}")
    check_strided(x, "x")
    check_dtype(x, "x")
    if x.dim() == 0:
        raise InputError("x must be [..., D] (at least 1-D), got a 0-D tensor")
    _check_weight(weight, "weight", x, x.shape[-1])
    return kernels.normalise_torch(x, weight, eps, gemma)[0]


def _check_weight(weight: Any, name: str, x: torch.Tensor, head_dim: int) -> None:
    if not isinstance(weight, torch.Tensor):
        raise InputTypeError(
            f"{name} must be a tensor [D] (the norm's weight, e.g. attention.q_norm.weight), got "
            f"{type(weight).__name__}"
        )
    check_strided(weight, name)
    if weight.shape != (head_dim,):
        hint = ""
        if weight.dim() == 1 and head_dim and weight.shape[0] % head_dim == 0:
            hint = (
                f" ({weight.shape[0]} = {weight.shape[0] // head_dim} heads x {head_dim}: a norm over all heads at "
                "once, as OLMo-2's, is not a per-head RMSNorm; normalise the [B, S, H * D] projection with it "
                "first and rotate with rotary.RoPE)"
            )
        raise InputError(
            f"{name} must be [D] = [{head_dim}], one weight per channel of a head, as Qwen3RMSNorm(head_dim).weight; "
            f"got shape {tuple(weight.shape)}{hint}"
        )
    if weight.dtype not in (x.dtype, torch.float32):
        raise InputTypeError(
            f"{name} has dtype {weight.dtype} but the tensor it normalises has {x.dtype}: pass a weight of "
            f"{x.dtype} or fp32 (e.g. {name}.to({x.dtype}))"
        )
    if weight.device != x.device:
        raise InputError(
            f"{name} is on {weight.device} but the tensor it normalises is on {x.device}; move it with .to()"
        )


def _tables(rope: Any, q: torch.Tensor, position_ids: Any, offset: int, batch: int, seq_len: int) -> RotaryTables:
    """The tables of the call: given, or made by ``rope`` for these tokens as :meth:`rotary.RoPE.forward` makes them."""
    dtype = table_dtype(q.dtype)
    if isinstance(rope, RotaryTables):
        if position_ids is not None or (type(offset) is not int or offset != 0):
            raise InputError(
                "rope is RotaryTables, which already say where each token is: pass position_ids and offset to "
                "rope.tables(...) instead, or pass the RoPE module itself"
            )
        return rope
    if not hasattr(rope, "tables"):
        raise InputTypeError(
            "rope must be a table producer (rotary.RoPE, rotary.MRoPE, a variant) or RotaryTables from "
            f"rope.tables(positions), got {type(rope).__name__}"
        )
    check_head_dim(q, "q", rope)  # (k has q's head_dim: checked before)
    if hasattr(rope, "input_tables"):  # positions of its own kind (M-RoPE's [3, B, S], coordinates)
        if type(offset) is not int or offset != 0:
            raise InputError(f"offset is for 1-D positions; {type(rope).__name__} takes position_ids of its own kind")
        return rope.input_tables(position_ids, batch=batch, seq_len=seq_len, device=q.device, dtype=dtype)
    positions = P.from_call(
        batch=batch, seq_len=seq_len, packed=False, device=q.device, position_ids=position_ids, offset=offset
    )
    return rope.tables(positions, dtype=dtype)


def _kernel_widens(tables: RotaryTables, wanted: torch.dtype, tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether 16-bit tables go to the kernels as they are (fp32 arithmetic, no autograd or ``torch.compile``)."""
    return (
        wanted == torch.float32
        and tables.cos.dtype in (torch.bfloat16, torch.float16)  # sin and the key tables share it (RotaryTables)
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    )


def rmsnorm_rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    rope: Any,
    *,
    position_ids: torch.Tensor | Positions | None = None,
    offset: int = 0,
    eps: float = 1e-6,
    style: Style = "qwen3",
    layout: Layout = "bhsd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head RMSNorm of q and k (each with its weight), then RoPE: one pass over q and k.

    Equals ``rotary.rotate([rms_norm(q, q_weight), rms_norm(k, k_weight)], tables)`` (module docstring: how
    exactly); channels past ``r`` are normalised, not rotated; gradients flow to q, k and both weights.

    Args:
        q: ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]`` (``"bshd"``), unit stride over D.
        k: same layout, ``Hk`` heads (GQA), same B, S, D and dtype.
        q_weight, k_weight: ``[D]``, the norms' weights (``attention.q_norm.weight``), q's dtype or fp32.
        rope: a :class:`rotary.RoPE` (or variant) with ``position_ids`` / ``offset``, a producer with its own
            positions (:class:`rotary.MRoPE`), or :class:`~rotary.tables.RotaryTables` for these tokens.
        position_ids, offset: ``[S]`` or ``[B, S]`` (or the producer's own ids); else ``offset + arange(S)``.
        eps, style: ``config.rms_norm_eps`` (> 0); ``"qwen3"`` or ``"gemma3"`` (see :func:`rms_norm`).
        layout: ``"bhsd"`` or ``"bshd"``.

    Returns:
        ``(q_out, k_out)``, new tensors with the shapes and dtypes of ``q`` and ``k``.

    Raises:
        rotary.errors.InputError: shapes, dtypes, weights, ``eps`` or positions that do not fit (named).

    Example:
        >>> rope = rotary.RoPE(64)
        >>> q, k = torch.randn(2, 8, 5, 64), torch.randn(2, 2, 5, 64)  # GQA: 8 q heads, 2 k heads
        >>> wq, wk = torch.rand(64), torch.rand(64)
        >>> q_out, k_out = rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=7)
        >>> unfused = rope(rotary.qk_norm.rms_norm(q, wq), rotary.qk_norm.rms_norm(k, wk), offset=7)
        >>> torch.equal(q_out, unfused[0]) and torch.equal(k_out, unfused[1])
        True
    """
    key = _key(q, k, q_weight, k_weight, rope, position_ids, offset, eps, style, layout)
    if key is not None:
        recorded = (_PLANS if key[0] else rope._plans).get(key)
        if recorded is not None and recorded.backend == "cpu":
            outs = _run_plan(recorded, q, k, q_weight, k_weight, rope, position_ids, offset, eps, style)
            if outs:  # (None or empty: values or a signature the plan does not cover)
                return outs[0], outs[1]
    _last.rotation = None
    q_out, k_out = _general(q, k, q_weight, k_weight, rope, position_ids, offset, eps, style, layout)
    if key is not None:
        (_PLANS if key[0] else rope._plans).put(key, _decide(q, k, q_weight, k_weight, rope, position_ids, layout))
    return q_out, k_out


#: the plans of :func:`rmsnorm_rotate` given :class:`RotaryTables`, by call signature (:mod:`rotary.plans`); a
#: :class:`rotary.RoPE` keeps its own plans of this function beside its forward's
_PLANS = PlanCache()
_last = threading.local()
#: the weights a plan takes: tensors, and a model's norm weights as they are (``nn.Parameter``, a plain subclass)
_WEIGHT_TYPES = (torch.Tensor, torch.nn.Parameter)


def _key(
    q: Any,
    k: Any,
    q_weight: Any,
    k_weight: Any,
    rope: Any,
    position_ids: Any,
    offset: Any,
    eps: Any,
    style: Any,
    layout: Any,
) -> tuple | None:
    """The Python part of a call's signature, or ``None`` if never planned; its first item: whose cache holds the
    plan.
    """
    if (
        type(q) is not torch.Tensor
        or type(k) is not torch.Tensor
        or type(q_weight) not in _WEIGHT_TYPES
        or type(k_weight) not in _WEIGHT_TYPES
        or type(eps) is not float
        or type(style) is not str
        or type(layout) is not str
        or type(offset) is not int
        or not plans.plannable()
    ):
        return None
    if type(rope) is RotaryTables:
        rows = rope.rows
        if (
            position_ids is not None
            or offset != 0
            or type(rope.cos) is not torch.Tensor
            or type(rope.sin) is not torch.Tensor
            or not (rows is None or type(rows) is torch.Tensor)
        ):
            return None
        return (
            True,
            layout,
            style,
            eps,
            q.shape,
            k.shape,
            rope.interleaved,
            rope.heads,
            rope.k_cos is None,
            rope.frequencies is None,
            rows is None,
        )
    if hasattr(rope, "_plan_tables") and (position_ids is None or type(position_ids) is torch.Tensor):
        return False, "rmsnorm_rotate", layout, style, eps, position_ids is None, q.shape, k.shape
    return None


def _decide(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    rope: Any,
    position_ids: torch.Tensor | None,
    layout: str,
) -> Plan:
    """The plan of a call whose general path succeeded: the CPU kernel when it ran on nameable tables, else general."""
    rotation = getattr(_last, "rotation", None)
    if rotation is None or kernels.backend(rotation) != "cpu":
        return GENERAL
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, q_weight, k_weight, *rotation.cos)):
        return GENERAL
    code = layout_code(layout, False)
    if type(rope) is RotaryTables:
        if (
            rope.k_cos is not None
            or rope.heads is not None
            or (rope.rows is not None and rope.rows.dtype != torch.int64)
        ):
            return GENERAL
        signature = load_cpu_extension().norm_signature(  # type: ignore[union-attr]
            [q, k], [q_weight, k_weight], rope.cos, rope.sin, rope.rows
        )
        return Plan("cpu", code, rope.interleaved, False, signature=signature)
    tables = None if hasattr(rope, "input_tables") else rope._plan_tables(q.device, table_dtype(q.dtype), position_ids)
    if tables is None:
        return GENERAL
    signature = load_cpu_extension().norm_signature(  # type: ignore[union-attr]
        [q, k], [q_weight, k_weight], *tables[:2], position_ids
    )
    return Plan("cpu", code, rope.interleaved, False, tables, signature, rope._guard())


def _run_plan(
    plan: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    rope: Any,
    position_ids: torch.Tensor | None,
    offset: int,
    eps: float,
    style: str,
) -> list[torch.Tensor] | None:
    """A recorded plan's call, or ``None``/empty when the plan does not cover the call (the general path runs)."""
    gemma = kernels.STYLES[style][0]
    if plan.tables is None:  # the call's own RotaryTables
        cos, sin, ids, frequencies, row_offset = rope.cos, rope.sin, rope.rows, rope.frequencies, 0
    else:
        window = rope._plan_window(plan, q.shape[plan.layout], position_ids, offset)
        if window is None:
            return None
        (row_offset, ids, frequencies), (cos, sin) = window, plan.tables[:2]
    return load_cpu_extension().rmsnorm_rope_layout(  # type: ignore[union-attr]
        plan.signature,
        [q, k],
        [q_weight, k_weight],
        cos,
        sin,
        row_offset,
        ids,
        plan.layout,
        plan.interleaved,
        gemma,
        eps,
        frequencies,
    )


def _general(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    rope: Any,
    position_ids: torch.Tensor | Positions | None,
    offset: int,
    eps: float,
    style: str,
    layout: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rmsnorm_rotate`'s general path: every check, the tables, the kernels; keeps ``_last`` for
    :func:`_decide`.
    """
    gemma = _check_style(style)
    eps = _check_eps(eps)
    check_inputs((q, k), ("q", "k"), packed=False)
    batch_dim, seq_dim = check_layout(layout)
    if q.shape[batch_dim] != k.shape[batch_dim] or q.shape[seq_dim] != k.shape[seq_dim] or q.shape[-1] != k.shape[-1]:
        raise InputError(
            f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}: need the same B, S and D (layout {layout!r})"
        )
    batch, seq_len, head_dim = q.shape[batch_dim], q.shape[seq_dim], q.shape[-1]
    _check_weight(q_weight, "q_weight", q, head_dim)
    _check_weight(k_weight, "k_weight", k, head_dim)
    check_untransformed(q_weight, "q_weight")  # (not in _check_weight: rms_norm, plain torch, runs under them)
    check_untransformed(k_weight, "k_weight")
    tables = _tables(rope, q, position_ids, offset, batch, seq_len)
    if not isinstance(tables, RotaryTables):
        raise InputTypeError(f"{type(rope).__name__}.tables(...) returned {type(tables).__name__}, not RotaryTables")
    r = tables.rotary_dim
    if r > head_dim:
        raise InputError(f"the tables rotate r={r} channels but q and k have head_dim={head_dim}; need r <= head_dim")
    if tables.cos.device != q.device:
        raise InputError(f"cos/sin are on {tables.cos.device} but q is on {q.device}; move them with .to(q.device)")
    if tables.heads is not None:
        for x, name in ((q, "q"), (k, "k")):
            heads = x.shape[1] if layout == "bhsd" else x.shape[2]
            if heads != tables.heads:
                raise InputError(f"{name} has {heads} heads but the per-head tables were built for {tables.heads}")
    if torch.is_grad_enabled() and tables.requires_grad:
        # learnable frequencies: rotary.rotate carries the tables' gradient
        ys = [kernels.normalise_torch(x, w, eps, gemma)[0] for x, w in ((q, q_weight), (k, k_weight))]
        q_out, k_out = rotate(ys, tables, layout=layout, kinds=("q", "k"), names=("q", "k"))
        return q_out, k_out
    wanted = table_dtype(q.dtype)
    if tables.cos.dtype != wanted and not _kernel_widens(tables, wanted, (q, k, q_weight, k_weight)):
        tables = tables.to(wanted)
    positions, batch_rows, flat = addressing(tables, batch, seq_len, False, layout, q.shape)
    key_flat = flat if tables.k_cos is None else kernel_tables(tables.key_tables(), tables, batch)
    views = (q.transpose(1, 2), k.transpose(1, 2)) if layout == "bhsd" else (q, k)
    frequencies = tables.frequencies if positions is not None else None
    rotation = Rotation(
        views,
        views,
        (flat[0], key_flat[0]),
        (flat[1], key_flat[1]),
        positions,
        batch_rows,
        tables.interleaved,
        False,
        frequencies,
    )
    _last.rotation = rotation
    q_out, k_out = kernels.apply(rotation, kernels.Norm((q_weight, k_weight), eps, gemma))
    if layout == "bhsd":
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return q_out, k_out
