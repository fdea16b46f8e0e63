"""The rotate stage: :func:`rotate` applies one :class:`~rotary.tables.RotaryTables` to any tensors.

This is the one rotate path: :class:`rotary.RoPE`, :func:`rotary.apply_rotary`, the attention layers
and ``rotary.hf.patch`` all end here. The general path is a short pipeline: check the inputs, bring
every tensor to the kernels' ``[B, S, H, D]`` view, turn the tables' addressing into a
:class:`~rotary.kernels.contract.Rotation`, hand it to the dispatcher, and view the results back. Its
decision is recorded as a plan per call signature (:mod:`rotary.plans`): a later call with the same
signature goes from the signature to the kernel. Arithmetic is fp32 (or float64 for float64 inputs),
whatever ``x.dtype``; the result is cast back to ``x.dtype`` once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Literal

import torch

from . import plans
from ._checks import check_bool, check_positive_int, check_untransformed
from .errors import InputError, InputTypeError
from .kernels import dispatch, ops
from .kernels.contract import INPUT_DTYPES, Rotation
from .kernels.extension import load_cpu_extension
from .kernels.overlap import overlaps_itself, shares_elements
from .plans import GENERAL, Plan, PlanCache
from .tables import RotaryTables, table_dtype

__all__ = [
    "LAYOUTS",
    "Layout",
    "addressing",
    "check_inplace_targets",
    "check_inputs",
    "check_layout",
    "check_writable",
    "kernel_tables",
    "layout_code",
    "plan",
    "rotate",
    "split_heads",
    "unview",
]

Layout = Literal["bhsd", "bshd"]
#: layout -> (batch dim, sequence dim) of a 4-D q/k tensor
LAYOUTS: dict[str, tuple[int, int]] = {"bhsd": (0, 2), "bshd": (0, 1)}
#: layout -> the kernels' layout code (0 is packed ``[T, H, D]``), which is also the sequence axis of 4-D tensors
_LAYOUT_CODES = {"bhsd": 2, "bshd": 1}


def layout_code(layout: str, packed: bool) -> int:
    """The C++ entry's layout code: 0 packed ``[T, H, D]``, 1 ``[B, S, H, D]``, 2 ``[B, H, S, D]``.

    Example:
        >>> layout_code("bhsd", False), layout_code("bshd", True)
        (2, 0)
    """
    return 0 if packed else _LAYOUT_CODES[layout]


def kernel_tables(
    pair: tuple[torch.Tensor, torch.Tensor], tables: RotaryTables, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's ``[N, r]`` (``[N, H, r]``) form of a pair of tables in ``tables``' addressing."""
    cos, sin = pair
    if tables.rows is None and cos.dim() - (tables.heads is not None) == 3:  # per-token [1 or B, S, (H,) r]
        if cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]
        else:
            cos, sin = cos.flatten(0, 1), sin.flatten(0, 1)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def check_layout(layout: str) -> tuple[int, int]:
    """Return ``(batch_dim, seq_dim)`` for ``layout``; raise for an unknown one."""
    try:
        return LAYOUTS[layout]
    except (KeyError, TypeError):
        raise InputError(f"unknown layout {layout!r}; use 'bhsd' ([B, H, S, D]) or 'bshd' ([B, S, H, D])") from None


def check_rank(x: object, name: str, packed: bool = False, packed_by: str | None = None) -> None:
    """The one check that ``x`` is a tensor to rotate: 4-D ``[B, H, S, D]`` / ``[B, S, H, D]``, or packed 3-D
    ``[total_tokens, H, D]``. Entries that read ``x``'s shape before :func:`rotate` (for its positions) call it.
    ``packed_by``: the input whose 3-D shape made the call packed (else cu_seqlens did), for the message.

    Example:
        >>> check_rank(torch.zeros(2, 4), "q")
        Traceback (most recent call last):
        ...
        rotary.errors.InputError: q must be 4-D ([B, H, S, D] or [B, S, H, D]), got shape (2, 4)
    """
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    check_strided(x, name)
    if packed and x.dim() != 3:
        if packed_by is not None:
            raise InputError(
                f"{name} must be 3-D [total_tokens, H, D] as {packed_by} is (packed), got shape {tuple(x.shape)}; "
                "pass inputs of one layout"
            )
        raise InputError(
            f"packed {name} (with cu_seqlens) must be 3-D [total_tokens, H, D], got shape {tuple(x.shape)}"
        )
    if not packed and x.dim() != 4:
        raise InputError(f"{name} must be 4-D ([B, H, S, D] or [B, S, H, D]), got shape {tuple(x.shape)}")


def check_strided(x: torch.Tensor, name: str) -> None:
    """The one check that ``x`` is dense: the kernels and the torch path read storage and strides (not sparse or
    mkldnn tensors, which failed inside torch or returned a sparse result)."""
    if x.layout != torch.strided:
        raise InputTypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}; pass {name}.to_dense()")


def check_head_dim(x: torch.Tensor, name: str, owner: object) -> None:
    """The one check that ``x``'s last dim is the ``head_dim`` its table producer ``owner`` was built for."""
    width = getattr(owner, "head_dim", x.shape[-1])
    if x.shape[-1] != width:
        raise InputError(
            f"{name} has head_dim {x.shape[-1]} but this {type(owner).__name__} was built for head_dim={width}"
        )


def check_dtype(x: torch.Tensor, name: str) -> None:
    """The one check of an input's dtype (:data:`rotary.kernels.contract.INPUT_DTYPES`): an integer input would come
    back truncated, a complex one without its imaginary part."""
    if x.dtype not in INPUT_DTYPES:
        raise InputTypeError(
            f"{name} must be fp32, bf16, fp16 or fp64, got dtype {x.dtype}; cast it (e.g. x.float()) and cast "
            "the result back"
        )


def check_inputs(xs: Sequence[torch.Tensor], names: Sequence[str], packed: bool) -> None:
    x0 = xs[0]
    for i, (x, name) in enumerate(zip(xs, names)):
        check_rank(x, name, packed, packed_by=names[0] if i else None)  # (packed: x0 is 3-D)
        check_untransformed(x, name)
        check_dtype(x, name)
    for x, name in zip(xs[1:], names[1:]):
        if x.dtype != x0.dtype:
            raise InputTypeError(
                f"{names[0]} and {name} must share a dtype, got {x0.dtype} for {names[0]} and {x.dtype} for {name}; "
                "cast one of them"
            )
        if x.device != x0.device:
            raise InputError(f"{names[0]} is on {x0.device} but {name} on {x.device}; move them to one device")


def check_writable(xs: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """Tensors a kernel is about to write in place: outside ``torch.inference_mode()`` none may be an inference tensor.

    Example:
        >>> with torch.inference_mode():
        ...     x = torch.zeros(2)
        >>> check_writable([x], ["q"])
        Traceback (most recent call last):
        ...
        rotary.errors.InputError: q is an inference tensor (made under torch.inference_mode()): ...
    """
    if torch.is_inference_mode_enabled():
        return
    for x, name in zip(xs, names):
        if x.is_inference():
            raise InputError(
                f"{name} is an inference tensor (made under torch.inference_mode()): it can be written in place only "
                "inside torch.inference_mode(); make this call inside it, or make the tensor outside it (or pass a "
                ".clone())"
            )


def check_inplace_targets(xs: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """In place: no expanded views, no memory shared by two inputs, no leaf requiring grad, no inference tensor."""
    check_writable(xs, names)
    for x, name in zip(xs, names):
        if x.is_leaf and x.requires_grad and torch.is_grad_enabled():
            raise InputError(
                f"{name} is a leaf tensor that requires grad: autograd cannot record an in-place change of it; "
                "rotate out of place (inplace=False), rotate a non-leaf (e.g. a projection's output), or run "
                "under torch.no_grad()"
            )
        if overlaps_itself(x):
            raise InputError(
                f"{name} (shape {tuple(x.shape)}, strides {x.stride()}) has overlapping memory, e.g. keys expanded "
                "over "
                "heads: rotating it in place would turn shared elements several times; pass a tensor that owns its "
                "memory or rotate out of place"
            )
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            if shares_elements(xs[i], xs[j]):
                a, b = xs[i], xs[j]
                same = (
                    a.shape == b.shape
                    and a.storage_offset() * a.element_size() == b.storage_offset() * b.element_size()
                )
                what = "are the same memory" if same else "share memory (overlapping views)"
                raise InputError(
                    f"{names[i]} and {names[j]} {what}: rotating both in place would turn the shared elements twice; "
                    "pass separate tensors or rotate out of place"
                )


def _kernel_view(x: torch.Tensor, layout: str, packed: bool) -> torch.Tensor:
    if packed:
        return x.unsqueeze(0)
    return x.transpose(1, 2) if layout == "bhsd" else x


def rotate(
    xs: Sequence[torch.Tensor],
    tables: RotaryTables,
    *,
    layout: Layout = "bhsd",
    inplace: bool = False,
    kinds: Sequence[Literal["q", "k"]] | None = None,
    names: Sequence[str] | None = None,
) -> list[torch.Tensor]:
    """Rotate several tensors by one set of tables, all in one kernel call.

    Args:
        xs: tensors ``[B, H_i, S, D]`` (``layout="bhsd"``), ``[B, S, H_i, D]`` (``"bshd"``), or packed
            ``[T, H_i, D]``; the same B, S, D and dtype, any head counts (GQA), any strides.
        tables: from a table producer such as :meth:`rotary.RoPE.tables`.
        layout: ``"bhsd"`` or ``"bshd"`` (ignored for packed inputs).
        inplace: write the results into ``xs`` and return them.
        kinds: ``"q"`` or ``"k"`` per tensor: keys use the tables' key tables (xPos); default all ``"q"``.
        names: names for error messages; default ``x0, x1, ...``.

    Returns:
        The rotated tensors, shapes and dtypes of ``xs`` (arithmetic in fp32, float64 for float64).

    Raises:
        rotary.errors.InputError: tensors that do not fit each other or the tables (the message names them).

    Example:
        >>> import rotary
        >>> rope = rotary.RoPE(64)
        >>> q, k = torch.randn(1, 8, 5, 64), torch.randn(1, 2, 5, 64)
        >>> tables = rope.tables(torch.arange(5))
        >>> q_rot, k_rot = rotary.rotate([q, k], tables, kinds=("q", "k"))
        >>> torch.equal(q_rot, rope.rotate(q))
        True
    """
    if type(xs) not in (list, tuple):
        xs = _as_tensor_list(xs)
    key = _key(xs, tables, layout, inplace, kinds) if plans.plannable() else None
    if key is not None:
        recorded = _PLANS.get(key)
        if recorded is not None and recorded.backend == "cpu":
            try:
                outs = run_plan(recorded, xs, tables.cos, tables.sin, tables.rows, tables.frequencies)
            except RuntimeError:  # the kernel's bounds check: rows edited in place since the tables were made
                if tables.rows is None:
                    raise
                try:
                    tables.check_rows()
                except InputError as named:
                    raise named from None
                raise
            if outs:  # (empty: another signature under this key; the general path below records it)
                _last.plan = recorded
                return outs
    _last.plan = None
    inplace = check_bool(inplace, "inplace")
    xs = list(xs)
    if not xs:
        return []
    names = list(names) if names is not None else [f"x{i}" for i in range(len(xs))]
    rotation, packed = plan(xs, tables, layout=layout, kinds=kinds, names=names)  # checks, addressing
    if inplace and not torch.compiler.is_compiling():
        check_inplace_targets(xs, names)
    targets = None
    if inplace and torch.is_grad_enabled() and not torch.compiler.is_compiling() and _needs_grad(xs, tables):
        targets = [_inplace_target(x, view, layout, packed) for x, view in zip(xs, rotation.xs)]
    outs = dispatch.rotate(rotation, inplace=inplace, targets=targets)  # the kernels, with autograd
    if key is not None:
        _last.plan = _decide(xs, rotation, tables, layout_code(layout, packed), inplace)
        _PLANS.put(key, _last.plan)
    if inplace and targets is None:
        return xs
    results = []  # back from the kernels' [B, S, H, D] views
    for i, (x, out) in enumerate(zip(xs, outs)):
        if inplace and (targets is None or targets[i] is None or targets[i][0] is x):  # type: ignore[index]
            if x._base is not None and x.requires_grad:
                # a view whose base was changed in place through another view: its grad_fn is rebuilt
                # lazily, and registering a hook on it before that crashes PyTorch (2.13, a segfault
                # in plain torch as well); reading grad_fn rebuilds it now
                x.grad_fn  # noqa: B018
            results.append(x)
        else:
            results.append(unview(out, layout, packed))
    return results


#: the plans of :func:`rotate`, by call signature (:mod:`rotary.plans`)
_PLANS = PlanCache()
_last = threading.local()


def recorded_plan() -> Plan | None:
    """The plan of this thread's latest :func:`rotate` call (recorded or found), ``None`` if it had none: what
    an entry that calls :func:`rotate` with tables it made records for its own signature."""
    return getattr(_last, "plan", None)


def _key(
    xs: Sequence[torch.Tensor], tables: RotaryTables, layout: str, inplace: bool, kinds: Sequence[str] | None
) -> tuple | None:
    """The Python part of a :func:`rotate` call's signature, or ``None`` for a call that is never planned."""
    if type(tables) is not RotaryTables or (inplace is not True and inplace is not False) or not xs:
        return None
    rows = tables.rows
    if type(tables.cos) is not torch.Tensor or type(tables.sin) is not torch.Tensor:
        return None
    if not (rows is None or type(rows) is torch.Tensor):
        return None
    for x in xs:
        if type(x) is not torch.Tensor:
            return None
    if kinds is not None:
        kinds = tuple(kinds)
        if kinds != ("q", "k") and (len(kinds) != len(xs) or not all(kind == "q" or kind == "k" for kind in kinds)):
            return None
    return (
        layout,
        inplace,
        kinds,
        len(xs),
        xs[0].shape,
        tables.interleaved,
        tables.heads,
        tables.k_cos is None,
        tables.frequencies is None,
        rows is None,
    )


def _decide(xs: Sequence[torch.Tensor], rotation: Rotation, tables: RotaryTables, layout: int, inplace: bool) -> Plan:
    """The plan of a call whose general path succeeded: the CPU kernel's ``rope_layout`` on the call's own tables,
    else general.
    """
    cos, sin = tables.cos, tables.sin
    as_given = rotation.cos[0] is cos or (
        tables.rows is None
        and cos.dim() == 3
        and rotation.cos[0].dtype == cos.dtype
        and cos.stride(-1) == 1
        and sin.stride() == cos.stride()
    )
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (*rotation.xs, *rotation.cos, *rotation.sin))
    if (
        grad
        or not as_given
        or tables.k_cos is not None
        or tables.heads is not None
        or ops.backend(rotation, (*rotation.xs, *rotation.outs)) != "cpu"
    ):
        return GENERAL
    ext = load_cpu_extension()
    signature = ext.signature(list(xs), cos, sin, tables.rows, inplace)  # type: ignore[union-attr]
    kernel = ext.RopePlan(  # type: ignore[union-attr]
        signature, None, None, None, layout, rotation.interleaved, inplace
    )
    return Plan("cpu", layout, rotation.interleaved, inplace, signature=signature, run=kernel.with_tables)


def run_plan(plan: Plan, xs: Sequence[torch.Tensor], *args: object) -> list[torch.Tensor]:
    """A recorded ``"cpu"`` plan's call: ``xs`` in their layout to the compiled kernel's ``rope_layout``, with
    the arguments the plan's ``run`` takes: ``cos, sin, rows, frequencies`` (a :func:`rotate` plan: the call's
    tables) or ``offset, position_ids`` (a :class:`rotary.RoPE`'s plan: its table, rows ``offset ..`` or the
    ids' rows; a row the table does not hold computed from its frequencies). Empty (nothing done) when the
    call's tensors do not match the plan's signature, or its rows lie outside the plan's table."""
    return plan.run(xs, *args)


def unview(out: torch.Tensor, layout: str, packed: bool) -> torch.Tensor:
    """A kernel-view ``[B, S, H, D]`` result back in the caller's layout (or packed ``[T, H, D]``)."""
    if packed:
        return out.squeeze(0)
    return out.transpose(1, 2) if layout == "bhsd" else out


def plan(
    xs: Sequence[torch.Tensor],
    tables: RotaryTables,
    *,
    layout: str,
    kinds: Sequence[str] | None,
    names: Sequence[str],
) -> tuple[Rotation, bool]:
    """Check ``xs`` against each other and against ``tables``; return the kernels' :class:`Rotation`
    (the tensors as ``[B, S, H, D]`` views, their tables and addressing) and whether ``xs`` are packed."""
    if not isinstance(tables, RotaryTables):
        raise InputTypeError(f"tables must be RotaryTables (from RoPE.tables(positions)), got {type(tables).__name__}")
    x0 = xs[0]
    packed = isinstance(x0, torch.Tensor) and x0.dim() == 3
    check_inputs(xs, names, packed)
    if not packed:
        batch_dim, seq_dim = check_layout(layout)
        for x, name in zip(xs[1:], names[1:]):
            if x.shape[seq_dim] != x0.shape[seq_dim]:
                raise InputError(
                    f"{names[0]} and {name} must share S: got S={x0.shape[seq_dim]} for {names[0]} and "
                    f"S={x.shape[seq_dim]} for {name} (layout {layout!r})"
                )
            if x.shape[batch_dim] != x0.shape[batch_dim] or x.shape[-1] != x0.shape[-1]:
                raise InputError(
                    f"{name} has shape {tuple(x.shape)} but {names[0]} has {tuple(x0.shape)}: need the same B, S and D"
                )
        batch, seq_len = x0.shape[batch_dim], x0.shape[seq_dim]
    else:
        for x, name in zip(xs[1:], names[1:]):
            if x.shape[0] != x0.shape[0] or x.shape[-1] != x0.shape[-1]:
                raise InputError(
                    f"{name} has shape {tuple(x.shape)} but {names[0]} has {tuple(x0.shape)}: need the same tokens "
                    "and D"
                )
        batch, seq_len = 1, x0.shape[0]
    head_dim = x0.shape[-1]
    r = tables.cos.shape[-1]
    if r > head_dim:
        raise InputError(
            f"cos/sin rotate r={r} channels but x has head_dim={head_dim}; r must be even and 0 < r <= head_dim"
        )
    if tables.cos.device != x0.device:
        raise InputError(f"cos/sin are on {tables.cos.device} but x is on {x0.device}; move them with .to(x.device)")
    if tables.heads is not None:
        for x, name in zip(xs, names):
            heads = x.shape[-2] if packed or layout == "bshd" else x.shape[1]
            if heads != tables.heads:
                raise InputError(f"{name} has {heads} heads but the per-head tables were built for {tables.heads}")
    wanted = table_dtype(x0.dtype)
    # float64 inputs with fp32 tables are rotated with the tables given, i.e. to fp32's accuracy (about
    # 1e-7): rotary's own producers build float64 tables for float64 inputs; tables passed in are the
    # caller's choice (rope.tables(positions, dtype=torch.float64) for float64 accuracy)
    if tables.cos.dtype != wanted:
        tables = tables.to(wanted)
    positions, batch_rows, flat = addressing(tables, batch, seq_len, packed, layout, x0.shape)
    kinds = ["q"] * len(xs) if kinds is None else list(kinds)
    if len(kinds) != len(xs) or any(k not in ("q", "k") for k in kinds):
        raise InputError(f"kinds must give 'q' or 'k' for each of the {len(xs)} tensors, got {kinds!r}")
    views = tuple(_kernel_view(x, layout, packed) for x in xs)
    key_flat = flat if tables.k_cos is None else kernel_tables(tables.key_tables(), tables, batch)
    chosen = [key_flat if kind == "k" else flat for kind in kinds]
    cos, sin = tuple(c[0] for c in chosen), tuple(c[1] for c in chosen)
    frequencies = tables.frequencies if positions is not None else None
    return Rotation(views, views, cos, sin, positions, batch_rows, tables.interleaved, False, frequencies), packed


def _as_tensor_list(xs: object) -> list[torch.Tensor]:
    """``xs`` given as another iterable than a list or tuple; a lone tensor is refused (it would be
    read as a sequence of its first dimension)."""
    if isinstance(xs, torch.Tensor):
        raise InputTypeError(
            f"xs must be a list of tensors, got one tensor of shape {tuple(xs.shape)}; pass [x] to rotate one "
            "tensor (or use RoPE.rotate(x))"
        )
    try:
        return list(xs)  # type: ignore[call-overload]
    except TypeError:
        raise InputTypeError(f"xs must be a list of tensors, got {type(xs).__name__}") from None


def _needs_grad(xs: Sequence[torch.Tensor], tables: RotaryTables) -> bool:
    """Whether autograd records this rotation (otherwise in-place results are the inputs themselves)."""
    return any(x.requires_grad for x in xs) or tables.requires_grad


def split_heads(x: torch.Tensor, head_dim: int | None, name: str) -> torch.Tensor:
    """vLLM's flat layout, ``x`` ``[total_tokens, H * D]``, viewed as packed ``[total_tokens, H, D]``.

    Example:
        >>> split_heads(torch.zeros(5, 3 * 8), 8, "q").shape
        torch.Size([5, 3, 8])
    """
    if head_dim is None:
        raise InputError(f"{name} is 2-D [tokens, H * D] (vLLM's layout): pass head_dim so it can be split into heads")
    check_positive_int(head_dim, "head_dim")
    if x.shape[-1] % head_dim:
        raise InputError(
            f"{name} must be 4-D ([B, H, S, D] or [B, S, H, D]), packed [total_tokens, H, D], or flat [total_tokens, "
            f"H * D] with H * D a multiple of head_dim={head_dim}; got shape {tuple(x.shape)}"
        )
    return x.view(x.shape[0], x.shape[-1] // head_dim, head_dim)


def _inplace_target(
    x: torch.Tensor, view: torch.Tensor, layout: str, packed: bool
) -> tuple[torch.Tensor, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] | None:
    """Where autograd should record an in-place rotation of ``x``: ``x``, its whole base (reshaped), or ``None``.

    Recording on the base avoids autograd's CopySlices (a copy of the base and of the gradient every backward).
    """
    base = x._base
    if base is None:
        if packed:
            return x, (_unsqueeze0, _squeeze0)
        return x, (_transpose12, _transpose12) if layout == "bhsd" else (_same, _same)
    if (
        base.is_contiguous()
        and view.is_contiguous()
        and base.numel() == view.numel()
        and base.data_ptr() == view.data_ptr()
        and base.dtype == view.dtype
    ):
        shape, base_shape = view.shape, base.shape
        return base, (lambda t: t.reshape(shape), lambda t: t.reshape(base_shape))
    return None


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _transpose12(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


def _unsqueeze0(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(0)


def _squeeze0(t: torch.Tensor) -> torch.Tensor:
    return t.squeeze(0)


def _layout_hint(layout: str, shape: torch.Size, positions: int) -> str:
    """The fix to add to a "positions do not fit" error when ``x`` fits the other 4-D layout."""
    other = "bshd" if layout == "bhsd" else "bhsd"
    if len(shape) != 4 or layout not in LAYOUTS or shape[LAYOUTS[other][1]] != positions:
        return ""
    dims = "[B, S, H, D]" if other == "bshd" else "[B, H, S, D]"
    return f"; if x is {dims}, pass layout={other!r}"


def addressing(
    tables: RotaryTables, batch: int, seq_len: int, packed: bool, layout: str, shape: torch.Size
) -> tuple[torch.Tensor | None, int, tuple[torch.Tensor, torch.Tensor]]:
    """Check that the tables fit the inputs; return the kernel's ``(positions, batch_rows, (cos, sin))``."""
    cos = tables.cos
    # the tables' addressing (RotaryTables.addressing), read from their fields: a property call per call is
    # a Python frame at a decoding step's cost
    if tables.rows is not None:
        mode = "indexed"
    else:
        mode = "shared" if cos.dim() - (tables.heads is not None) == 2 else "per_token"

    def where() -> str:  # formatted for a message only (this runs at every call)
        return f"x (layout {layout!r}, shape {tuple(shape)})" if not packed else f"packed x {tuple(shape)}"

    if mode == "indexed":
        tables.check_rows()  # edited in place since made
        rows = tables.rows
        assert rows is not None
        if packed:
            if rows.dim() != 1 or rows.shape[0] != seq_len:
                raise InputError(
                    f"with packed x [{seq_len}, H, D], position_ids must be [{seq_len}], got shape {tuple(rows.shape)}"
                )
            positions = rows.unsqueeze(0)
        else:
            if rows.shape[-1] != seq_len or (rows.dim() == 2 and rows.shape[0] not in (1, batch)):
                hint = _layout_hint(layout, shape, rows.shape[-1])
                raise InputError(
                    f"position_ids of shape {tuple(rows.shape)} do not fit {where()} with B={batch}, S={seq_len}; "
                    f"use [S] or [B, S]{hint}"
                )
            positions = rows.expand(batch, seq_len)
        return positions, 0, kernel_tables((tables.cos, tables.sin), tables, batch)
    if packed:
        raise InputError(
            "x is 3-D, i.e. packed [total_tokens, H, D]: pass cu_seqlens (positions restart per sequence) "
            "or per-token position_ids; for [B, H, S, D] / [B, S, H, D] pass a 4-D x"
        )
    seq_axis = cos.dim() - (2 if tables.heads is None else 3)
    if cos.shape[seq_axis] != seq_len:
        hint = _layout_hint(layout, shape, cos.shape[seq_axis])
        raise InputError(f"cos/sin cover S={cos.shape[seq_axis]} positions but {where()} has S={seq_len}{hint}")
    if mode == "per_token":
        if cos.shape[0] not in (1, batch):
            raise InputError(f"cos/sin have batch {cos.shape[0]} but x has batch {batch} (layout {layout!r})")
        batch_rows = seq_len if cos.shape[0] > 1 else 0
        return None, batch_rows, kernel_tables((tables.cos, tables.sin), tables, batch)
    return None, 0, kernel_tables((tables.cos, tables.sin), tables, batch)
