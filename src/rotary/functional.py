"""The functional forms, for callers who bring their own cos/sin tensors: :func:`apply_rotary`,
:func:`apply_rotary_`, and flash-attn's packed interfaces :func:`apply_rotary_qkv_` and
:func:`apply_rotary_kv_`; :func:`check_tables` for tables made elsewhere.

Each turns its arguments into :class:`~rotary.positions.Positions` (:func:`rotary.positions.from_call`)
and :class:`~rotary.tables.RotaryTables`, then calls the one rotate path, :func:`rotary.rotation.rotate`.
"""

from __future__ import annotations

from typing import Literal

import torch

from . import positions as P
from ._checks import check_positive_int
from .errors import InputError, InputTypeError
from .rotation import Layout, check_layout, rotate, split_heads
from .tables import RotaryTables

__all__ = ["apply_rotary", "apply_rotary_", "apply_rotary_kv_", "apply_rotary_qkv_", "check_tables"]


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
        batch=batch,
        seq_len=seq_len,
        packed=packed,
        device=device,
        position_ids=position_ids,
        seqlen_offsets=seqlen_offsets,
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        default=False,
    )
    rows = None if found is None else found.ids
    if found is not None and isinstance(cos, torch.Tensor):
        what = "with packed x" if packed else "with position_ids or seqlen_offsets"
        if cos.dim() != 2:
            raise InputError(f"{what}, cos/sin must be tables [T, r] indexed by position, got shape {tuple(cos.shape)}")
        if validate and found.bound is not None and found.bound > cos.shape[0]:
            if cu_seqlens is not None and seqlen_offsets is None:
                raise InputError(
                    f"a packed sequence has {found.bound} tokens but the cos/sin tables have only {cos.shape[0]} rows"
                )
            raise InputError(
                f"position_ids reach position {found.bound - 1} but the cos/sin tables have only {cos.shape[0]} rows; "
                f"build tables for at least {found.bound} positions (RoPE.cos_sin(torch.arange({found.bound})))"
            )
    indexed = found is not None  # tables [T, r] addressed by position: row 0 is position 0
    tables = RotaryTables.from_tensors(
        cos, sin, interleaved=interleaved, rows=rows, validate=validate, indexed_by_position=indexed
    )
    if k_tables is not None:
        keys = RotaryTables.from_tensors(
            *k_tables, interleaved=interleaved, rows=rows, validate=validate, indexed_by_position=indexed
        )
        tables = RotaryTables.unchecked(tables.cos, tables.sin, interleaved, rows, keys.cos, keys.sin)
    return tables


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

    Positions and tables: docs/core.md, "Tables you made". Pass ``layout`` unless ``x`` is ``[B, H, S, D]``.

    Args:
        x: ``[B, H, S, D]``, ``[B, S, H, D]``, packed ``[total_tokens, H, D]`` or flat ``[total_tokens, H * D]``;
            fp32, bf16, fp16 or fp64; any strides (e.g. a view into a fused qkv tensor).
        cos, sin: the tokens' rows ``[S, r]`` / ``[B, S, r]``, or tables ``[T, r]`` indexed by position; fp32
            (float64 for float64 accuracy); bf16/fp16 tables are converted to fp32.
        interleaved: ``False`` pairs (i, i + r/2) (Hugging Face), ``True`` pairs (2i, 2i + 1) (RoFormer, GPT-J).
        layout, head_dim: ``"bhsd"`` or ``"bshd"`` (ignored for packed x); ``D`` of flat ``[total_tokens, H * D]``.
        inplace: write the result into ``x`` and return it (pass-through channels untouched, nothing allocated).
        validate: ``True``: 4 of the rows read (evenly spaced) and the positions checked on the CPU; ``"sync"``:
            the same on any device; ``"full"``: every row; ``False``: nothing (docs/core.md, "Guarantees").
        position_ids, seqlen_offsets: integer ``[S]`` / ``[B, S]`` / ``[total_tokens]`` rows of cos/sin; or the first
            position of each sequence (int or int ``[B]`` / ``[N]``).
        cu_seqlens, max_seqlen: integer ``[N + 1]`` boundaries of packed x; the longest sequence (optional).

    Returns:
        Tensor of ``x``'s shape and dtype; arithmetic in fp32 (float64 for float64 ``x``).

    Raises:
        rotary.errors.InputError: shapes that do not fit, or tables that fail ``validate``'s checks.

    Example:
        >>> q, (cos, sin) = torch.randn(1, 8, 16, 64), RoPE(64).cos_sin(torch.arange(16))
        >>> q_bshd = q.transpose(1, 2)  # [B, S, H, D], flash-attn's layout
        >>> torch.equal(apply_rotary(q_bshd, cos, sin, layout="bshd"), apply_rotary(q, cos, sin).transpose(1, 2))
        True
    """
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    flat = x.dim() == 2
    view = split_heads(x, head_dim, "x") if flat else x
    packed = cu_seqlens is not None or view.dim() == 3
    if cu_seqlens is not None and view.dim() != 3:
        raise InputError(f"packed x (with cu_seqlens) must be 3-D [total_tokens, H, D], got shape {tuple(x.shape)}")
    if packed:
        batch, seq_len = 1, view.shape[0]
    elif view.dim() == 4:
        batch_dim, seq_dim = check_layout(layout)
        batch, seq_len = view.shape[batch_dim], view.shape[seq_dim]
    else:
        batch, seq_len = 0, 0  # rotate() names the wrong rank
    tables = _raw_tables(
        cos,
        sin,
        interleaved=interleaved,
        validate=validate,
        device=x.device,
        tokens=view.shape[0] if packed else 0,
        batch=batch,
        seq_len=seq_len,
        packed=packed,
        position_ids=position_ids,
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        seqlen_offsets=seqlen_offsets,
    )
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
        x,
        cos,
        sin,
        interleaved=interleaved,
        layout=layout,
        inplace=True,
        validate=validate,
        position_ids=position_ids,
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        seqlen_offsets=seqlen_offsets,
        head_dim=head_dim,
    )


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
        qkv: ``[B, S, 3, H, D]``; or ``[B, S, Hq + 2 * Hk, D]`` with ``num_heads_q=Hq`` (GQA); packed
            sequences: ``[T, 3, H, D]`` / ``[T, Hq + 2 * Hk, D]`` with ``cu_seqlens``.
        cos, sin: tables as in :func:`apply_rotary`; cos_k, sin_k: separate tables for k (default ``cos``/``sin``).
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
        raise InputTypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    packed = cu_seqlens is not None
    lead = 1 if packed else 2  # [T, ...] or [B, S, ...]
    if num_heads_q is None:
        if qkv.dim() != lead + 3 or qkv.shape[lead] != 3:
            want = "[T, 3, H, D]" if packed else "[B, S, 3, H, D]"
            raise InputError(
                f"qkv must be {want} (or pass num_heads_q for [..., Hq + 2 * Hk, D]), got shape {tuple(qkv.shape)}"
            )
        q, k = qkv.select(lead, 0), qkv.select(lead, 1)
    else:
        check_positive_int(num_heads_q, "num_heads_q")
        if qkv.dim() != lead + 2 or (qkv.shape[lead] - num_heads_q) <= 0 or (qkv.shape[lead] - num_heads_q) % 2:
            raise InputError(
                f"with num_heads_q={num_heads_q}, qkv must be [..., Hq + 2 * Hk, D] with Hk >= 1, got shape "
                f"{tuple(qkv.shape)}"
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
    """Rotate k in place inside a packed ``kv`` ``[B, S, 2, H, D]`` (or ``[T, 2, H, D]``); v is left alone.

    Example:
        >>> kv = torch.randn(1, 4, 2, 2, 8)
        >>> cos, sin = RoPE(8).cos_sin(torch.arange(4))
        >>> want = apply_rotary(kv[:, :, 0], cos, sin, layout="bshd")
        >>> torch.equal(apply_rotary_kv_(kv, cos, sin)[:, :, 0], want)
        True
    """
    if not isinstance(kv, torch.Tensor):
        raise InputTypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    lead = 1 if cu_seqlens is not None else 2
    if kv.dim() != lead + 3 or kv.shape[lead] != 2:
        want = "[T, 2, H, D]" if cu_seqlens is not None else "[B, S, 2, H, D]"
        raise InputError(f"kv must be {want}, got shape {tuple(kv.shape)}")
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
        raise InputError("give both cos_k and sin_k, or neither")
    tables = _raw_tables(
        cos,
        sin,
        interleaved=interleaved,
        validate=validate,
        device=x0.device,
        tokens=x0.shape[0] if packed else 0,
        batch=1 if packed else x0.shape[0],
        seq_len=x0.shape[0] if packed else x0.shape[1],
        packed=packed,
        position_ids=None,
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        seqlen_offsets=seqlen_offsets,
        k_tables=None if cos_k is None else (cos_k, sin_k),
    )
    kinds = ["q"] * (len(xs) - 1) + ["k"] if len(xs) > 1 else ["k"]
    names = ["q", "k"] if len(xs) == 2 else ["k"]
    rotate(xs, tables, layout="bshd", inplace=True, kinds=kinds, names=names)


def check_tables(cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, rtol: float = 1e-5) -> None:
    """Check every row of cos/sin tables: finite, rotations, laid out for ``interleaved``.

    Raises:
        rotary.errors.InputError: naming the pairing the tables were built for, NaN/inf, all-zero tables, or the
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
        raise InputError(f"cos/sin must share a shape [..., r] with r even, got {shapes[0]}, {shapes[1]}")
    RotaryTables.unchecked(cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]), bool(interleaved)).check(
        sample=None, rtol=rtol
    )
