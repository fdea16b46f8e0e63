"""Applying the rotation: :func:`rotate` (any tensors, one :class:`~rotary.tables.RotaryTables`) and
:func:`apply_rotary`, the functional form for callers who bring their own cos/sin tensors.

This is the one rotate path: :class:`rotary.RoPE`, the attention layers and ``rotary.hf.patch`` all
end here. It checks the inputs, brings every tensor to the kernels' ``[B, S, H, D]`` view, turns the
tables' addressing into a :class:`~rotary.kernels.contract.Rotation` and hands it to the dispatcher.
Arithmetic is fp32 (or float64 for float64 inputs), whatever ``x.dtype``; the result is cast back to
``x.dtype`` once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch

from . import positions as P
from ._checks import check_bool, check_positive_int
from .kernels import dispatch
from .kernels.contract import Rotation
from .kernels.extension import load_cpu_extension
from .kernels.ops import TRANSFORMED, transformed
from .tables import RotaryTables

__all__ = [
    "LAYOUTS",
    "Layout",
    "apply_rotary",
    "apply_rotary_",
    "apply_rotary_kv_",
    "apply_rotary_qkv_",
    "check_layout",
    "check_tables",
    "rotate",
]

Layout = Literal["bhsd", "bshd"]
#: layout -> (batch dim, sequence dim) of a 4-D q/k tensor
LAYOUTS: dict[str, tuple[int, int]] = {"bhsd": (0, 2), "bshd": (0, 1)}


def check_layout(layout: str) -> tuple[int, int]:
    """Return ``(batch_dim, seq_dim)`` for ``layout``; raise for an unknown one."""
    try:
        return LAYOUTS[layout]
    except (KeyError, TypeError):
        raise ValueError(f"unknown layout {layout!r}; use 'bhsd' ([B, H, S, D]) or 'bshd' ([B, S, H, D])") from None


_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _check_inputs(xs: Sequence[torch.Tensor], names: Sequence[str], packed: bool) -> None:
    x0 = xs[0]
    for x, name in zip(xs, names):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if transformed(x):
            raise TypeError(TRANSFORMED.format(name=name))
        if x.dtype not in _INPUT_DTYPES:
            raise TypeError(
                f"{name} must be fp32, bf16, fp16 or fp64, got dtype {x.dtype}; cast it (e.g. x.float()) and cast "
                "the result back"
            )
        if packed and x.dim() != 3:
            raise ValueError(
                f"packed {name} (with cu_seqlens) must be 3-D [total_tokens, H, D], got shape {tuple(x.shape)}"
            )
        if not packed and x.dim() != 4:
            raise ValueError(f"{name} must be 4-D ([B, H, S, D] or [B, S, H, D]), got shape {tuple(x.shape)}")
    for x, name in zip(xs[1:], names[1:]):
        if x.dtype != x0.dtype:
            raise TypeError(
                f"{names[0]} and {name} must share a dtype, got {x0.dtype} for {names[0]} and {x.dtype} for {name}; "
                "cast one of them"
            )
        if x.device != x0.device:
            raise ValueError(f"{names[0]} is on {x0.device} but {name} on {x.device}; move them to one device")


def _check_inplace_targets(xs: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    """In place, every element must be written once: no expanded views, no memory shared by two inputs;
    and autograd must be able to record the change (no leaf that requires grad)."""
    for x, name in zip(xs, names):
        if x.is_leaf and x.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name} is a leaf tensor that requires grad: autograd cannot record an in-place change of it; "
                "rotate out of place (inplace=False), rotate a non-leaf (e.g. a projection's output), or run "
                "under torch.no_grad()"
            )
        if overlaps_itself(x):
            raise ValueError(
                f"{name} (shape {tuple(x.shape)}, strides {x.stride()}) has overlapping memory, e.g. keys expanded over "
                "heads: rotating it in place would turn shared elements several times; pass a tensor that owns its "
                "memory or rotate out of place"
            )
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            if shares_elements(xs[i], xs[j]):
                same = xs[i].data_ptr() == xs[j].data_ptr() and xs[i].shape == xs[j].shape
                what = "are the same memory" if same else "share memory (overlapping views)"
                raise ValueError(
                    f"{names[i]} and {names[j]} {what}: rotating both in place would turn the shared elements twice; "
                    "pass separate tensors or rotate out of place"
                )


def shares_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two strided tensors have at least one element in common (exact, not an extent test).

    Views of one buffer that interleave without sharing elements (q and k sliced from a fused qkv
    projection) do not count.
    """
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    size = a.element_size()
    if size != b.element_size():
        return True  # views of one buffer in two dtypes: assume the worst
    a_lo, b_lo = a.storage_offset(), b.storage_offset()
    a_hi = a_lo + sum((n - 1) * abs(s) for n, s in zip(a.shape, a.stride()))
    b_hi = b_lo + sum((n - 1) * abs(s) for n, s in zip(b.shape, b.stride()))
    if a_hi < b_lo or b_hi < a_lo:
        return False
    if a.stride() == b.stride() and all(
        s > 0 or n == 1 for n, s in zip((*a.shape, *b.shape), (*a.stride(), *b.stride()))
    ):
        found = _same_stride_overlap(a.shape, b.shape, a.stride(), b_lo - a_lo)
        if found is not None:
            return found
    return _element_overlap(a, b)


def _same_stride_overlap(sa, sb, strides, delta) -> bool | None:
    """Exact answer for views with equal positive strides when each stride exceeds what the smaller
    strides can reach (as for views of one contiguous buffer); ``None`` when that does not hold."""
    dims = sorted(range(len(strides)), key=lambda d: -strides[d])
    reach = 0  # the largest |sum of k_e s_e| over the dims with smaller strides, |k_e| < max(sa_e, sb_e)
    for d in reversed(dims):
        if strides[d] <= reach:
            return None
        reach += (max(sa[d], sb[d]) - 1) * strides[d]

    def search(i: int, rest: int) -> bool:
        if i == len(dims):
            return rest == 0
        d = dims[i]
        low = rest // strides[d]
        for k in (low, low + 1):  # a's index minus b's index along d
            if -sb[d] < k < sa[d] and search(i + 1, rest - k * strides[d]):
                return True
        return False

    return search(0, delta)


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """The storage offset of every element of ``t``, int64 ``[numel]``."""
    out = torch.full((), t.storage_offset(), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        out = (out.unsqueeze(-1) + torch.arange(n) * s).reshape(-1)
    return out


def _element_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact, by listing element offsets (the general case; rare)."""
    return bool(torch.isin(_element_offsets(a), _element_offsets(b)).any())


def overlaps_itself(x: torch.Tensor) -> bool:
    """Whether two elements of ``x`` are one element of memory (an expanded or ``as_strided`` view).

    Exact: torch's quick test first; where it cannot tell (views such as ``unfold`` windows or
    ``as_strided`` rows that run into each other), a stride test that holds for every view of a
    contiguous buffer, and element offsets listed as the last resort.

    Example:
        >>> overlaps_itself(torch.zeros(4, 8)), overlaps_itself(torch.zeros(8)[None].expand(4, 8))
        (False, True)
        >>> overlaps_itself(torch.zeros(64).as_strided((4, 16), (8, 1)))  # rows 16 long, 8 apart
        True
    """
    status = torch._debug_has_internal_overlap(x)  # 0: no, 1: yes, 2: too hard for it
    if status != 2:
        return status == 1
    reach = 0  # how far the dims with smaller strides reach: a larger stride cannot land inside it
    for stride, size in sorted((abs(s), n) for n, s in zip(x.shape, x.stride()) if n > 1):
        if stride <= reach:
            offsets = _element_offsets(x)
            return offsets.unique().numel() != offsets.numel()
        reach += (size - 1) * stride
    return False


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
            ``[T, H_i, D]`` (when the tables address packed rows); the same B, S, D and dtype, any head
            counts (GQA), any strides.
        tables: from a table producer such as :meth:`rotary.RoPE.tables`.
        layout: ``"bhsd"`` or ``"bshd"`` (ignored for packed inputs).
        inplace: write the results into ``xs`` and return them.
        kinds: ``"q"`` or ``"k"`` per tensor: keys use the tables' key tables (xPos); default all ``"q"``.
        names: names for error messages; default ``x0, x1, ...``.

    Returns:
        The rotated tensors, shapes and dtypes of ``xs``.

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
    if (
        len(xs) == 2
        and type(inplace) is bool
        and type(tables) is RotaryTables
        and (kinds is None or len(kinds) == 2 and all(k in ("q", "k") for k in kinds))
    ):
        fast = _fast_pair(xs[0], xs[1], tables, layout, inplace)
        if fast is not None:
            return fast
    inplace = check_bool(inplace, "inplace")
    xs = list(xs)
    if not xs:
        return []
    names = list(names) if names is not None else [f"x{i}" for i in range(len(xs))]
    if not isinstance(tables, RotaryTables):
        raise TypeError(f"tables must be RotaryTables (from RoPE.tables(positions)), got {type(tables).__name__}")
    x0 = xs[0]
    packed = isinstance(x0, torch.Tensor) and x0.dim() == 3
    _check_inputs(xs, names, packed)
    if not packed:
        batch_dim, seq_dim = check_layout(layout)
        for x, name in zip(xs[1:], names[1:]):
            if x.shape[seq_dim] != x0.shape[seq_dim]:
                raise ValueError(
                    f"{names[0]} and {name} must share S: got S={x0.shape[seq_dim]} for {names[0]} and "
                    f"S={x.shape[seq_dim]} for {name} (layout {layout!r})"
                )
            if x.shape[batch_dim] != x0.shape[batch_dim] or x.shape[-1] != x0.shape[-1]:
                raise ValueError(
                    f"{name} has shape {tuple(x.shape)} but {names[0]} has {tuple(x0.shape)}: need the same B, S and D"
                )
        batch, seq_len = x0.shape[batch_dim], x0.shape[seq_dim]
    else:
        for x, name in zip(xs[1:], names[1:]):
            if x.shape[0] != x0.shape[0] or x.shape[-1] != x0.shape[-1]:
                raise ValueError(
                    f"{name} has shape {tuple(x.shape)} but {names[0]} has {tuple(x0.shape)}: need the same tokens and D"
                )
        batch, seq_len = 1, x0.shape[0]
    head_dim = x0.shape[-1]
    r = tables.rotary_dim
    if r > head_dim:
        raise ValueError(
            f"cos/sin rotate r={r} channels but x has head_dim={head_dim}; r must be even and 0 < r <= head_dim"
        )
    if tables.cos.device != x0.device:
        raise ValueError(f"cos/sin are on {tables.cos.device} but x is on {x0.device}; move them with .to(x.device)")
    if tables.heads is not None:
        for x, name in zip(xs, names):
            heads = x.shape[-2] if packed or layout == "bshd" else x.shape[1]
            if heads != tables.heads:
                raise ValueError(f"{name} has {heads} heads but the per-head tables were built for {tables.heads}")
    wanted = torch.float64 if x0.dtype == torch.float64 else torch.float32
    # float64 inputs with fp32 tables are rotated with the tables given, i.e. to fp32's accuracy (about
    # 1e-7): rotary's own producers build float64 tables for float64 inputs; tables passed in are the
    # caller's choice (rope.tables(positions, dtype=torch.float64) for float64 accuracy)
    if tables.cos.dtype != wanted:
        tables = tables.to(wanted)
    positions, batch_rows, flat = _addressing(tables, batch, seq_len, packed, layout, x0.shape)
    kinds = ["q"] * len(xs) if kinds is None else list(kinds)
    if len(kinds) != len(xs) or any(k not in ("q", "k") for k in kinds):
        raise ValueError(f"kinds must give 'q' or 'k' for each of the {len(xs)} tensors, got {kinds!r}")
    if inplace and not torch.compiler.is_compiling():
        _check_inplace_targets(xs, names)
    views = tuple(_kernel_view(x, layout, packed) for x in xs)
    key_flat = flat if tables.k_cos is None else _flatten(tables.key_tables(), tables, batch)
    chosen = [key_flat if kind == "k" else flat for kind in kinds]
    rotation = Rotation(
        views,
        views,
        tuple(c[0] for c in chosen),
        tuple(c[1] for c in chosen),
        positions,
        batch_rows,
        tables.interleaved,
    )
    targets = None
    if inplace and torch.is_grad_enabled() and not torch.compiler.is_compiling() and _needs_grad(xs, tables):
        targets = [_inplace_target(x, view, layout, packed) for x, view in zip(xs, views)]
    outs = dispatch.rotate(rotation, inplace=inplace, targets=targets)
    if inplace and targets is None:
        return xs
    results = []
    for i, (x, out) in enumerate(zip(xs, outs)):
        if inplace and (targets is None or targets[i] is None or targets[i][0] is x):  # type: ignore[index]
            if x._base is not None and x.requires_grad:
                # a view whose base was changed in place through another view: its grad_fn is rebuilt
                # lazily, and registering a hook on it before that crashes PyTorch (2.13, a segfault
                # in plain torch as well); reading grad_fn rebuilds it now
                x.grad_fn  # noqa: B018
            results.append(x)
        elif packed:
            results.append(out.squeeze(0))
        else:
            results.append(out.transpose(1, 2) if layout == "bhsd" else out)
    return results


def _as_tensor_list(xs: object) -> list[torch.Tensor]:
    """``xs`` given as another iterable than a list or tuple; a lone tensor is refused (it would be
    read as a sequence of its first dimension)."""
    if isinstance(xs, torch.Tensor):
        raise TypeError(
            f"xs must be a list of tensors, got one tensor of shape {tuple(xs.shape)}; pass [x] to rotate one "
            "tensor (or use RoPE.rotate(x))"
        )
    try:
        return list(xs)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"xs must be a list of tensors, got {type(xs).__name__}") from None


def _needs_grad(xs: Sequence[torch.Tensor], tables: RotaryTables) -> bool:
    """Whether autograd records this rotation (otherwise in-place results are the inputs themselves)."""
    return any(x.requires_grad for x in xs) or tables.cos.requires_grad or tables.sin.requires_grad


def decode_seq_axis(q: torch.Tensor, k: torch.Tensor, layout: str) -> int | None:
    """The sequence axis of 4-D ``q``/``k`` when the decoding fast path may take them, else ``None``.

    The path is for plain tensors (no subclass) without autograd or ``torch.compile``, in ``"bhsd"`` or
    ``"bshd"``; the kernel's ``rope_decode`` checks everything else in C++.

    Example:
        >>> decode_seq_axis(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), "bhsd")
        2
    """
    if (
        type(q) is not torch.Tensor
        or type(k) is not torch.Tensor
        or q.dim() != 4
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        or torch.compiler.is_compiling()
    ):
        return None
    return 2 if layout == "bhsd" else 1 if layout == "bshd" else None


def _fast_pair(
    q: torch.Tensor, k: torch.Tensor, tables: RotaryTables, layout: str, inplace: bool
) -> list[torch.Tensor] | None:
    """The decoding fast path of :func:`rotate` for q and k with tables computed upstream, or ``None``.

    Taken for plain tensors without autograd or ``torch.compile`` and fp32 tables shared by q and k
    (no key or per-head tables): ``[S, r]`` for these tokens, per-token ``[B, S, r]`` (what Hugging
    Face's rotary embeddings hand to every layer, so ``rotary.hf.patch`` decodes through here), or a
    table with per-token ``rows``. The kernel's ``rope_decode`` checks the rest in C++ (see
    :meth:`rotary.RoPE.forward`'s fast path) and does nothing when a check fails: ``None``, and the
    general path runs with its messages.
    """
    cos, sin, rows = tables.cos, tables.sin, tables.rows
    if (
        tables.k_cos is not None
        or tables.heads is not None
        or cos.dtype is not torch.float32
        or (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))
    ):
        return None
    seq_axis = decode_seq_axis(q, k, layout)
    if seq_axis is None:
        return None
    batch_rows = 0
    if tables.addressing == "per_token":  # [B or 1, S, r]: row b * S + s of [B * S, r]; rope_decode checks B
        if cos.shape[1] != q.shape[seq_axis]:
            return None
        batch_rows = cos.shape[1] if cos.shape[0] > 1 else 0
        cos, sin = _flatten((cos, sin), tables, q.shape[0])
    elif rows is None and cos.shape[0] != q.shape[seq_axis]:
        return None
    ext = load_cpu_extension()
    if ext is None:
        return None
    out = ext.rope_decode(q, k, cos, sin, 0, rows, seq_axis, q.shape[-1], tables.interleaved, inplace, batch_rows)
    return list(out) if out else None


def _inplace_target(
    x: torch.Tensor, view: torch.Tensor, layout: str, packed: bool
) -> tuple[torch.Tensor, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] | None:
    """Where autograd should record an in-place rotation of ``x`` (kernel view ``view``), or ``None``.

    ``x`` itself when it is no view; the base of ``x`` when ``x`` is that whole base reshaped (q as
    ``proj(h).view(B, S, H, D)``, possibly transposed to ``[B, H, S, D]``): a Function marking a view
    dirty makes autograd copy the base and clone the gradient in every backward (CopySlices), and
    the base, rotated in place, is viewed again instead. ``None`` for other views (slices of a
    fused qkv): CopySlices it is.
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


def _flatten(
    pair: tuple[torch.Tensor, torch.Tensor], tables: RotaryTables, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's ``[N, r]`` (``[N, H, r]``) form of a pair of tables in ``tables``' addressing."""
    cos, sin = pair
    if tables.addressing == "per_token":
        if cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]
        else:
            cos, sin = cos.flatten(0, 1), sin.flatten(0, 1)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def _layout_hint(layout: str, shape: torch.Size, positions: int) -> str:
    """The fix to add to a "positions do not fit" error when ``x`` fits the other 4-D layout."""
    other = "bshd" if layout == "bhsd" else "bhsd"
    if len(shape) != 4 or layout not in LAYOUTS or shape[LAYOUTS[other][1]] != positions:
        return ""
    dims = "[B, S, H, D]" if other == "bshd" else "[B, H, S, D]"
    return f"; if x is {dims}, pass layout={other!r}"


def _addressing(
    tables: RotaryTables, batch: int, seq_len: int, packed: bool, layout: str, shape: torch.Size
) -> tuple[torch.Tensor | None, int, tuple[torch.Tensor, torch.Tensor]]:
    """Check that the tables fit the inputs; return the kernel's ``(positions, batch_rows, (cos, sin))``."""
    cos = tables.cos
    mode = tables.addressing
    where = f"x (layout {layout!r}, shape {tuple(shape)})" if not packed else f"packed x {tuple(shape)}"
    if mode == "indexed":
        rows = tables.rows
        assert rows is not None
        if packed:
            if rows.dim() != 1 or rows.shape[0] != seq_len:
                raise ValueError(
                    f"with packed x [{seq_len}, H, D], position_ids must be [{seq_len}], got shape {tuple(rows.shape)}"
                )
            positions = rows.unsqueeze(0)
        else:
            if rows.shape[-1] != seq_len or (rows.dim() == 2 and rows.shape[0] not in (1, batch)):
                hint = _layout_hint(layout, shape, rows.shape[-1])
                raise ValueError(
                    f"position_ids of shape {tuple(rows.shape)} do not fit {where} with B={batch}, S={seq_len}; "
                    f"use [S] or [B, S]{hint}"
                )
            positions = rows.expand(batch, seq_len)
        return positions, 0, _flatten((tables.cos, tables.sin), tables, batch)
    if packed:
        raise ValueError(
            "x is 3-D, i.e. packed [total_tokens, H, D]: pass cu_seqlens (positions restart per sequence) "
            "or per-token position_ids; for [B, H, S, D] / [B, S, H, D] pass a 4-D x"
        )
    seq_axis = cos.dim() - (2 if tables.heads is None else 3)
    if cos.shape[seq_axis] != seq_len:
        hint = _layout_hint(layout, shape, cos.shape[seq_axis])
        raise ValueError(f"cos/sin cover S={cos.shape[seq_axis]} positions but {where} has S={seq_len}{hint}")
    if mode == "per_token":
        if cos.shape[0] not in (1, batch):
            raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {batch} (layout {layout!r})")
        batch_rows = seq_len if cos.shape[0] > 1 else 0
        return None, batch_rows, _flatten((tables.cos, tables.sin), tables, batch)
    return None, 0, _flatten((tables.cos, tables.sin), tables, batch)


def _raw_tables(
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    validate: bool | str,
    device: torch.device,
    tokens: int,
    batch: int,
    seq_len: int,
    packed: bool,
    position_ids: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    max_seqlen: int | None,
    seqlen_offsets: int | torch.Tensor | None,
    k_tables: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> RotaryTables:
    """:class:`RotaryTables` from caller-made cos/sin and one way of naming positions (see :func:`apply_rotary`)."""
    found = P.from_call(
        batch=batch, seq_len=seq_len, packed=packed, device=device, position_ids=position_ids,
        seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, default=False,
    )  # fmt: skip
    rows = None if found is None else found.ids
    if found is not None and isinstance(cos, torch.Tensor):
        what = "with packed x" if packed else "with position_ids or seqlen_offsets"
        if cos.dim() != 2:
            raise ValueError(f"{what}, cos/sin must be tables [T, r] indexed by position, got shape {tuple(cos.shape)}")
        if validate and found.bound is not None and found.bound > cos.shape[0]:
            if cu_seqlens is not None and seqlen_offsets is None:
                raise ValueError(
                    f"a packed sequence has {found.bound} tokens but the cos/sin tables have only {cos.shape[0]} rows"
                )
            raise ValueError(
                f"position_ids reach position {found.bound - 1} but the cos/sin tables have only {cos.shape[0]} rows; "
                f"build tables for at least {found.bound} positions (RoPE.cos_sin(torch.arange({found.bound})))"
            )
    indexed = found is not None  # tables [T, r] addressed by position: row 0 is position 0
    tables = RotaryTables.from_tensors(cos, sin, interleaved=interleaved, rows=rows, validate=validate, indexed_by_position=indexed)
    if k_tables is not None:
        keys = RotaryTables.from_tensors(*k_tables, interleaved=interleaved, rows=rows, validate=validate, indexed_by_position=indexed)
        tables = RotaryTables.unchecked(tables.cos, tables.sin, interleaved, rows, keys.cos, keys.sin)
    return tables


def _flat(x: torch.Tensor, head_dim: int | None, name: str) -> torch.Tensor:
    """vLLM's layout: ``[tokens, H * D]`` viewed as packed ``[tokens, H, D]``."""
    if head_dim is None:
        raise ValueError(f"{name} is 2-D [tokens, H * D] (vLLM's layout): pass head_dim so it can be split into heads")
    check_positive_int(head_dim, "head_dim")
    if x.shape[-1] % head_dim:
        raise ValueError(f"{name} has {x.shape[-1]} channels, not a multiple of head_dim={head_dim}")
    return x.view(x.shape[0], x.shape[-1] // head_dim, head_dim)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    inplace: bool = False,
    validate: bool | Literal["full"] = True,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    seqlen_offsets: int | torch.Tensor | None = None,
    head_dim: int | None = None,
) -> torch.Tensor:
    """Rotate the first ``r = cos.shape[-1]`` channels of ``x``; the rest pass through unchanged.

    Mind the layout: a 4-D ``x`` is read as ``[B, H, S, D]`` (``layout="bhsd"``, Hugging Face's) unless
    ``layout="bshd"`` says ``[B, S, H, D]`` (flash-attn's). When the tables' positions do not match the
    sequence axis, the error names the layout that would fit; when ``S == H`` no check can tell the
    two apart and a wrong layout rotates the heads axis instead, so pass ``layout`` whenever ``x`` is
    not ``[B, H, S, D]``.

    Ways to say which position each token has:

    - default: ``cos``/``sin`` are the rows of ``x``'s tokens, ``[S, r]`` or ``[B, S, r]``, as made
      by :meth:`rotary.RoPE.cos_sin`;
    - ``position_ids`` (``[S]`` or ``[B, S]``): ``cos``/``sin`` are tables ``[T, r]`` indexed by
      position (e.g. ``RoPE.cos_sin(torch.arange(T))``); the kernel reads the rows it needs, so no
      ``[B, S, r]`` table is gathered;
    - ``seqlen_offsets`` (an int, or int ``[B]``), as in flash-attn: sequence b's tokens sit at
      ``offset_b + 0 .. S - 1`` of tables ``[T, r]`` (decoding with a KV cache of a different
      length per sequence);
    - packed variable-length sequences, as in flash-attn's ``apply_rotary_emb``: ``x`` is
      ``[total_tokens, H, D]`` (sequences concatenated, no padding) and ``cu_seqlens`` (int ``[N + 1]``,
      ``0, len_0, len_0 + len_1, ..., total_tokens``) marks where each sequence starts; positions
      restart at 0 in every sequence (plus ``seqlen_offsets[n]`` when given) and index tables
      ``[T, r]``. ``max_seqlen`` (the longest sequence) is optional: given, it spares a device-to-host
      read of ``cu_seqlens``. Instead of ``cu_seqlens``, per-token ``position_ids`` ``[total_tokens]``;
    - vLLM's flat layout: ``x`` ``[total_tokens, H * D]`` with ``head_dim=D`` and per-token
      ``position_ids``.

    Unlike flash-attn, whose tables hold one value per pair (``r / 2`` columns), tables here hold one
    value per channel (``r`` columns), laid out for the pairing, as :meth:`rotary.RoPE.cos_sin` makes
    them. Tables made by :class:`rotary.RoPE` are better passed whole: :func:`rotate` with
    :meth:`rotary.RoPE.tables` carries their pairing and needs no check.

    A fused kernel runs when one is available (C++ on CPU, Triton on CUDA); otherwise the pure-torch
    path, which gives bit-identical fp32 results on CPU. Autograd and ``torch.compile`` work with every path.

    Args:
        x: ``[B, H, S, D]`` (``layout="bhsd"``), ``[B, S, H, D]`` (``"bshd"``), packed
            ``[total_tokens, H, D]``, or flat ``[total_tokens, H * D]``; fp32, bf16, fp16 or fp64; any
            strides (e.g. a view into a fused qkv tensor).
        cos, sin: see above; fp32, or float64 for float64 accuracy with float64 ``x`` (fp32 tables
            give fp32's, about 1e-7); bf16/fp16 tables are converted to fp32.
        interleaved: pairing; ``False`` pairs channels (i, i + r/2) (Hugging Face / GPT-NeoX),
            ``True`` pairs (2i, 2i + 1) (the paper, RoFormer, GPT-J, Meta LLaMA).
        layout: ``"bhsd"`` or ``"bshd"`` (ignored for packed x).
        inplace: write the result into ``x`` and return ``x``; pass-through channels are neither
            read nor written, and nothing of ``x``'s size is allocated.
        validate: ``True`` (default): check a few rows of the tables — finite, rotations, laid out
            for ``interleaved`` — and that positions stay inside them; ``"full"``: every row;
            ``False``: no check (only for tables known to be right).
        position_ids: integer ``[S]`` / ``[B, S]`` (or ``[total_tokens]`` for packed x) rows of cos/sin.
        cu_seqlens: integer ``[N + 1]`` sequence boundaries of packed x.
        max_seqlen: the longest packed sequence (optional).
        seqlen_offsets: the first position of each sequence (int or int ``[B]`` / ``[N]``).
        head_dim: ``D`` for flat ``[total_tokens, H * D]`` inputs.

    Returns:
        Tensor of ``x``'s shape and dtype; arithmetic in fp32 (float64 for float64 ``x``).

    Example:
        >>> rope = RoPE(64)
        >>> q = torch.randn(1, 8, 16, 64)
        >>> cos, sin = rope.cos_sin(torch.arange(16))
        >>> apply_rotary(q, cos, sin).shape
        torch.Size([1, 8, 16, 64])
        >>> q_bshd = q.transpose(1, 2)  # [B, S, H, D], flash-attn's layout
        >>> torch.equal(apply_rotary(q_bshd, cos, sin, layout="bshd"), apply_rotary(q, cos, sin).transpose(1, 2))
        True
        >>> packed = torch.randn(5 + 3, 8, 64)  # two sequences of 5 and 3 tokens
        >>> cu_seqlens = torch.tensor([0, 5, 8])
        >>> out = apply_rotary(packed, cos, sin, cu_seqlens=cu_seqlens)
        >>> torch.equal(out[5:], apply_rotary(packed[5:].unsqueeze(0), cos[:3], sin[:3], layout="bshd")[0])
        True
        >>> step = torch.randn(2, 8, 1, 64)  # one new token for two sequences with 3 and 9 cached
        >>> out = apply_rotary(step, cos, sin, seqlen_offsets=torch.tensor([3, 9]))
        >>> torch.equal(out[1:], apply_rotary(step[1:], cos[9:10], sin[9:10]))
        True
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    flat = x.dim() == 2
    view = _flat(x, head_dim, "x") if flat else x
    packed = cu_seqlens is not None or view.dim() == 3
    if cu_seqlens is not None and view.dim() != 3:
        raise ValueError(f"packed x (with cu_seqlens) must be 3-D [total_tokens, H, D], got shape {tuple(x.shape)}")
    if packed:
        batch, seq_len = 1, view.shape[0]
    elif view.dim() == 4:
        batch_dim, seq_dim = check_layout(layout)
        batch, seq_len = view.shape[batch_dim], view.shape[seq_dim]
    else:
        batch, seq_len = 0, 0  # rotate() names the wrong rank
    tables = _raw_tables(
        cos, sin, interleaved=interleaved, validate=validate, device=x.device, tokens=view.shape[0] if packed else 0,
        batch=batch, seq_len=seq_len, packed=packed, position_ids=position_ids, cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen, seqlen_offsets=seqlen_offsets,
    )  # fmt: skip
    out = rotate([view], tables, layout=layout, inplace=inplace, names=["x"])[0]
    return x if inplace else (out.reshape(x.shape) if flat else out)


def apply_rotary_(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    validate: bool | Literal["full"] = True,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    seqlen_offsets: int | torch.Tensor | None = None,
    head_dim: int | None = None,
) -> torch.Tensor:
    """In-place :func:`apply_rotary` (``inplace=True``); returns ``x``.

    Example:
        >>> q = torch.randn(1, 2, 4, 8)
        >>> cos, sin = RoPE(8).cos_sin(torch.arange(4))
        >>> apply_rotary_(q, cos, sin) is q
        True
    """
    return apply_rotary(
        x, cos, sin, interleaved=interleaved, layout=layout, inplace=True, validate=validate,
        position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, seqlen_offsets=seqlen_offsets,
        head_dim=head_dim,
    )  # fmt: skip


def apply_rotary_qkv_(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    cos_k: torch.Tensor | None = None,
    sin_k: torch.Tensor | None = None,
    interleaved: bool = False,
    num_heads_q: int | None = None,
    validate: bool | Literal["full"] = True,
    seqlen_offsets: int | torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Rotate q and k in place inside a packed projection output; v is left alone (flash-attn's interface).

    Args:
        qkv: ``[B, S, 3, H, D]``; or ``[B, S, Hq + 2 * Hk, D]`` with ``num_heads_q=Hq`` (GQA: q heads,
            then k heads, then v heads); packed sequences: ``[T, 3, H, D]`` / ``[T, Hq + 2 * Hk, D]``
            with ``cu_seqlens``.
        cos, sin: tables as in :func:`apply_rotary` (the tokens' rows, or indexed by position with
            ``seqlen_offsets`` / ``cu_seqlens``).
        cos_k, sin_k: separate tables for k (e.g. xPos); default ``cos``/``sin``.
        interleaved, validate, seqlen_offsets, cu_seqlens, max_seqlen: as in :func:`apply_rotary`.
        num_heads_q: the q heads of a ``[..., Hq + 2 * Hk, D]`` layout.

    Returns:
        ``qkv``, rotated in place.

    Example:
        >>> qkv = torch.randn(2, 5, 3, 4, 16)
        >>> cos, sin = RoPE(16).cos_sin(torch.arange(5))
        >>> want = apply_rotary(qkv[:, :, 0], cos, sin, layout="bshd")
        >>> torch.equal(apply_rotary_qkv_(qkv, cos, sin)[:, :, 0], want)
        True
    """
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    packed = cu_seqlens is not None
    lead = 1 if packed else 2  # [T, ...] or [B, S, ...]
    if num_heads_q is None:
        if qkv.dim() != lead + 3 or qkv.shape[lead] != 3:
            want = "[T, 3, H, D]" if packed else "[B, S, 3, H, D]"
            raise ValueError(
                f"qkv must be {want} (or pass num_heads_q for [..., Hq + 2 * Hk, D]), got shape {tuple(qkv.shape)}"
            )
        q, k = qkv.select(lead, 0), qkv.select(lead, 1)
    else:
        check_positive_int(num_heads_q, "num_heads_q")
        if qkv.dim() != lead + 2 or (qkv.shape[lead] - num_heads_q) <= 0 or (qkv.shape[lead] - num_heads_q) % 2:
            raise ValueError(
                f"with num_heads_q={num_heads_q}, qkv must be [..., Hq + 2 * Hk, D] with Hk >= 1, got shape {tuple(qkv.shape)}"
            )
        hk = (qkv.shape[lead] - num_heads_q) // 2
        q, k = qkv.narrow(lead, 0, num_heads_q), qkv.narrow(lead, num_heads_q, hk)
    _rotate_packed_pair([q, k], cos, sin, cos_k, sin_k, interleaved, validate, seqlen_offsets, cu_seqlens, max_seqlen)
    return qkv


def apply_rotary_kv_(
    kv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    validate: bool | Literal["full"] = True,
    seqlen_offsets: int | torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Rotate k in place inside a packed ``kv`` ``[B, S, 2, H, D]`` (or ``[T, 2, H, D]`` with ``cu_seqlens``); v is left alone.

    Example:
        >>> kv = torch.randn(1, 4, 2, 2, 8)
        >>> cos, sin = RoPE(8).cos_sin(torch.arange(4))
        >>> want = apply_rotary(kv[:, :, 0], cos, sin, layout="bshd")
        >>> torch.equal(apply_rotary_kv_(kv, cos, sin)[:, :, 0], want)
        True
    """
    if not isinstance(kv, torch.Tensor):
        raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    lead = 1 if cu_seqlens is not None else 2
    if kv.dim() != lead + 3 or kv.shape[lead] != 2:
        want = "[T, 2, H, D]" if cu_seqlens is not None else "[B, S, 2, H, D]"
        raise ValueError(f"kv must be {want}, got shape {tuple(kv.shape)}")
    _rotate_packed_pair(
        [kv.select(lead, 0)], cos, sin, None, None, interleaved, validate, seqlen_offsets, cu_seqlens, max_seqlen
    )
    return kv


def _rotate_packed_pair(
    xs, cos, sin, cos_k, sin_k, interleaved, validate, seqlen_offsets, cu_seqlens, max_seqlen
) -> None:
    """Rotate q (and k) views ``[B, S, H, D]`` / ``[T, H, D]`` in place; the last view uses the key tables."""
    x0 = xs[0]
    packed = cu_seqlens is not None
    if (cos_k is None) != (sin_k is None):
        raise ValueError("give both cos_k and sin_k, or neither")
    tables = _raw_tables(
        cos, sin, interleaved=interleaved, validate=validate, device=x0.device, tokens=x0.shape[0] if packed else 0,
        batch=1 if packed else x0.shape[0], seq_len=x0.shape[0] if packed else x0.shape[1], packed=packed,
        position_ids=None, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, seqlen_offsets=seqlen_offsets,
        k_tables=None if cos_k is None else (cos_k, sin_k),
    )  # fmt: skip
    kinds = ["q"] * (len(xs) - 1) + ["k"] if len(xs) > 1 else ["k"]
    names = ["q", "k"] if len(xs) == 2 else ["k"]
    rotate(xs, tables, layout="bshd", inplace=True, kinds=kinds, names=names)


def check_tables(cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, rtol: float = 1e-5) -> None:
    """Check every row of cos/sin tables: finite, rotations, laid out for ``interleaved``.

    A table built for one pairing and applied with the other mixes channels of different pairs: the
    "rotation" is then not orthogonal and changes vector norms (the mistake in the PyTorch tutorial
    this library's tests reproduce).

    Raises:
        ValueError: naming the pairing the tables were built for, NaN/inf, all-zero tables, or the
            worst cos²+sin² mismatch.

    Example:
        >>> cos, sin = RoPE(8, interleaved=True).cos_sin(torch.arange(4))
        >>> check_tables(cos, sin, interleaved=True)  # passes
    """
    if (
        not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor))
        or cos.shape != sin.shape
        or cos.shape[-1:] == (0,)
        or (cos.dim() and cos.shape[-1] % 2)
    ):
        shapes = tuple(getattr(cos, "shape", ())), tuple(getattr(sin, "shape", ()))
        raise ValueError(f"cos/sin must share a shape [..., r] with r even, got {shapes[0]}, {shapes[1]}")
    RotaryTables.unchecked(cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]), bool(interleaved)).check(
        sample=None, rtol=rtol
    )
