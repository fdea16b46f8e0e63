"""Applying the rotation: ``apply_rotary`` (the functional form), table checks, pairing converters.

The pure-torch code here is the fallback of every backend and the oracle the fused kernels are
tested against. Arithmetic is done in fp32 (or float64 for float64 inputs), whatever ``x.dtype``;
the result is cast back to ``x.dtype`` once.
"""

from __future__ import annotations

from typing import Literal

import torch

from .kernels import dispatch

__all__ = [
    "LAYOUTS",
    "apply_rotary",
    "apply_rotary_",
    "check_tables",
    "check_layout",
    "to_interleaved",
    "to_half",
    "pair_permutation",
    "permute_qk_weight",
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


def _check_x(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (fp32/bf16/fp16/fp64), got dtype {x.dtype}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D ([B, H, S, D] or [B, S, H, D]), got shape {tuple(x.shape)}")


def _check_table_shape(x: torch.Tensor, cos: torch.Tensor, layout: str) -> None:
    """cos/sin ``[S, r]`` or ``[B, S, r]`` must fit x's S and B (the pair checks are :func:`_check_table_pair`)."""
    batch_dim, seq_dim = check_layout(layout)
    if cos.dim() not in (2, 3):
        raise ValueError(f"cos/sin must be [S, r] or [B, S, r], got shape {tuple(cos.shape)}")
    if cos.shape[-2] != x.shape[seq_dim]:
        raise ValueError(
            f"cos/sin cover S={cos.shape[-2]} positions but x (layout {layout!r}, shape {tuple(x.shape)}) "
            f"has S={x.shape[seq_dim]}"
        )
    if cos.dim() == 3 and cos.shape[0] not in (1, x.shape[batch_dim]):
        raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {x.shape[batch_dim]} (layout {layout!r})")


def _check_table_pair(cos: torch.Tensor, sin: torch.Tensor, head_dim: int, device: torch.device) -> None:
    """Checks shared by every table form: tensors, same shape, floating, r even and <= head_dim, on x's device."""
    if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)):
        raise TypeError("cos and sin must be tensors (use RoPE.cos_sin(position_ids) to make them)")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not cos.is_floating_point():
        raise TypeError(f"cos/sin must be floating point, got dtype {cos.dtype}")
    r = cos.shape[-1] if cos.dim() else 0
    if r % 2 or r == 0 or r > head_dim:
        raise ValueError(
            f"cos/sin rotate r={r} channels but x has head_dim={head_dim}; r must be even and 0 < r <= head_dim"
        )
    if cos.device != device:
        raise ValueError(f"cos/sin are on {cos.device} but x is on {device}; move them with .to(x.device)")


def _check_positions_in_table(positions: torch.Tensor, rows: int, what: str) -> None:
    if torch.compiler.is_compiling() or not positions.numel():
        return
    top = int(positions.max())
    if top >= rows:
        raise ValueError(
            f"{what} reach position {top} but the cos/sin tables have only {rows} rows; "
            f"build tables for at least {top + 1} positions (RoPE.cos_sin(torch.arange({top + 1})))"
        )


def _packed_positions(cu_seqlens: torch.Tensor, total: int, max_seqlen: int | None) -> tuple[torch.Tensor, int | None]:
    """Per-token positions ``[total]`` restarting at 0 at every ``cu_seqlens`` boundary, and the longest sequence."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_floating_point() or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must be an integer tensor [N + 1], got {cu_seqlens!r:.80}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1] with N >= 1 sequences, got shape {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.to(torch.int64)
    if not torch.compiler.is_compiling():
        lengths = cu.diff()
        if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
            raise ValueError(
                f"cu_seqlens must start at 0, never decrease and end at the {total} packed tokens of x; "
                f"got {cu_seqlens.tolist() if cu.numel() <= 16 else cu_seqlens}"
            )
        longest = int(lengths.max())
        if max_seqlen is not None and max_seqlen < longest:
            raise ValueError(f"max_seqlen={max_seqlen} but cu_seqlens holds a sequence of {longest} tokens")
        max_seqlen = longest if max_seqlen is None else max_seqlen
    token = torch.arange(total, device=cu.device)
    sequence = torch.searchsorted(cu[1:], token, right=True)
    return token - cu[sequence], max_seqlen


def _rotate_tensors(
    xs: list[torch.Tensor],
    names: list[str],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool,
    layout: str,
    inplace: bool,
    validate: bool,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
    checked: bool = False,
) -> list[torch.Tensor]:
    """Validate, bring every x to the kernels' ``[B, S, H, D]`` view, rotate all of them in one call.

    ``checked``: the caller (``RoPE``) has validated the 4-D inputs and made the tables itself;
    skipping the checks here matters at decode shapes, where the Python around a ~5 µs kernel is the cost.
    """
    from .module import check_position_ids  # module.py imports this file

    x0 = xs[0]
    if inplace and not torch.compiler.is_compiling():
        _check_inplace_targets(xs, names)
    packed = cu_seqlens is not None or (isinstance(x0, torch.Tensor) and x0.dim() == 3)
    if checked and not packed and position_ids is None:
        views = [x.transpose(1, 2) if layout == "bhsd" else x for x in xs]
        per_batch = cos.dim() == 3 and cos.shape[0] > 1
        cos2, sin2 = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
        batch_rows = x0.shape[LAYOUTS[layout][1]] if per_batch else 0
        return _finish(xs, views, cos2, sin2, None, batch_rows, interleaved, inplace, layout, packed=False)
    for x, name in zip(xs, names):
        if packed:
            _check_packed_x(x, name)
        else:
            _check_x(x, name)
        if x.dtype != x0.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but {names[0]} has {x0.dtype}; cast them to one dtype")
    if packed:
        total, head_dim = x0.shape[0], x0.shape[-1]
        for x, name in zip(xs, names):
            if x.shape[0] != total or x.shape[-1] != head_dim:
                raise ValueError(f"{name} has shape {tuple(x.shape)} but {names[0]} has {tuple(x0.shape)}: need the same tokens and D")
        _check_table_pair(cos, sin, head_dim, x0.device)
        if cos.dim() != 2:
            raise ValueError(f"with packed x, cos/sin must be tables [T, r] indexed by position, got shape {tuple(cos.shape)}")
        if cu_seqlens is not None:
            if position_ids is not None:
                raise ValueError("pass either cu_seqlens (positions restart per sequence) or position_ids, not both")
            positions, longest = _packed_positions(cu_seqlens.to(x0.device), total, max_seqlen)
            if longest is not None and longest > cos.shape[0]:
                raise ValueError(f"a packed sequence has {longest} tokens but the cos/sin tables have only {cos.shape[0]} rows")
        elif position_ids is not None:
            positions = check_position_ids(position_ids)
            if positions.dim() != 1 or positions.shape[0] != total:
                raise ValueError(f"with packed x [{total}, H, D], position_ids must be [{total}], got shape {tuple(positions.shape)}")
            _check_positions_in_table(positions, cos.shape[0], "position_ids")
        else:
            raise ValueError(
                "x is 3-D, i.e. packed [total_tokens, H, D]: pass cu_seqlens (positions restart per sequence) "
                "or per-token position_ids; for [B, H, S, D] / [B, S, H, D] pass a 4-D x"
            )
        views = [x.unsqueeze(0) for x in xs]
        positions, batch_rows = positions.to(device=x0.device, dtype=torch.int64).unsqueeze(0), 0
        tables = (cos, sin)
    else:
        batch_dim, seq_dim = check_layout(layout)
        for x, name in zip(xs, names):
            if x.shape[batch_dim] != x0.shape[batch_dim] or x.shape[seq_dim] != x0.shape[seq_dim] or x.shape[-1] != x0.shape[-1]:
                raise ValueError(f"{name} has shape {tuple(x.shape)} but {names[0]} has {tuple(x0.shape)}: need the same B, S and D")
        views = [x.transpose(1, 2) if layout == "bhsd" else x for x in xs]
        batch, seq_len = x0.shape[batch_dim], x0.shape[seq_dim]
        if position_ids is None:
            _check_table_pair(cos, sin, x0.shape[-1], x0.device)
            _check_table_shape(x0, cos, layout)
            per_batch = cos.dim() == 3 and cos.shape[0] > 1
            tables = (cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]))
            positions, batch_rows = None, seq_len if per_batch else 0
        else:
            _check_table_pair(cos, sin, x0.shape[-1], x0.device)
            if cos.dim() != 2:
                raise ValueError(f"with position_ids, cos/sin must be tables [T, r] indexed by position, got shape {tuple(cos.shape)}")
            positions = check_position_ids(position_ids)
            if positions.shape[-1] != seq_len or (positions.dim() == 2 and positions.shape[0] not in (1, batch)):
                raise ValueError(
                    f"position_ids of shape {tuple(positions.shape)} do not fit x (layout {layout!r}, B={batch}, S={seq_len}); "
                    f"use [S] or [B, S]"
                )
            _check_positions_in_table(positions, cos.shape[0], "position_ids")
            positions = positions.to(device=x0.device, dtype=torch.int64).expand(batch, seq_len)
            batch_rows = 0
            tables = (cos, sin)
    if validate:
        check_tables(cos, sin, interleaved=interleaved)
    return _finish(xs, views, *tables, positions, batch_rows, interleaved, inplace, layout, packed)


def _check_inplace_targets(xs: list[torch.Tensor], names: list[str]) -> None:
    """In place, every element must be written once: no expanded (stride-0) views, no tensor given twice."""
    for x, name in zip(xs, names):
        if isinstance(x, torch.Tensor) and torch._debug_has_internal_overlap(x) == 1:
            raise ValueError(
                f"{name} (shape {tuple(x.shape)}, strides {x.stride()}) has overlapping memory, e.g. keys expanded over "
                "heads: rotating it in place would turn shared elements several times; pass a tensor that owns its "
                "memory or rotate out of place"
            )
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            a, b = xs[i], xs[j]
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() and a.data_ptr() == b.data_ptr():
                raise ValueError(
                    f"{names[i]} and {names[j]} are the same memory: rotating both in place would turn it twice; "
                    "pass separate tensors or rotate out of place"
                )


def _finish(
    xs: list[torch.Tensor],
    views: list[torch.Tensor],
    cos2: torch.Tensor,
    sin2: torch.Tensor,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    inplace: bool,
    layout: str,
    packed: bool,
) -> list[torch.Tensor]:
    """Call the backend on the ``[B, S, H, D]`` views and give results back in the callers' layout."""
    if cos2.stride(-1) != 1 or sin2.stride() != cos2.stride():
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    outs = dispatch.rotate(
        views, cos2, sin2, positions=positions, batch_rows=batch_rows, interleaved=interleaved, inplace=inplace
    )
    if inplace:
        return list(xs)
    if packed:
        return [o.squeeze(0) for o in outs]
    return [o.transpose(1, 2) if layout == "bhsd" else o for o in outs]


def _check_packed_x(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (fp32/bf16/fp16/fp64), got dtype {x.dtype}")
    if x.dim() != 3:
        raise ValueError(f"packed {name} (with cu_seqlens) must be 3-D [total_tokens, H, D], got shape {tuple(x.shape)}")


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    inplace: bool = False,
    validate: bool = False,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
) -> torch.Tensor:
    """Rotate the first ``r = cos.shape[-1]`` channels of ``x``; the rest pass through unchanged.

    Three ways to say which position each token has:

    - default: ``cos``/``sin`` are the rows of ``x``'s tokens, ``[S, r]`` or ``[B, S, r]``, as made
      by :meth:`rotary.RoPE.cos_sin`;
    - ``position_ids`` (``[S]`` or ``[B, S]``): ``cos``/``sin`` are tables ``[T, r]`` indexed by
      position (e.g. ``RoPE.cos_sin(torch.arange(T))``); the kernel reads the rows it needs, so no
      ``[B, S, r]`` table is gathered;
    - packed variable-length sequences, as in flash-attn's ``apply_rotary_emb``: ``x`` is
      ``[total_tokens, H, D]`` (sequences concatenated, no padding) and ``cu_seqlens`` (int ``[N + 1]``,
      ``0, len_0, len_0 + len_1, ..., total_tokens``) marks where each sequence starts; positions
      restart at 0 in every sequence and index tables ``[T, r]``. ``max_seqlen`` (the longest
      sequence) is optional: given, it spares a device-to-host read of ``cu_seqlens``. Instead of
      ``cu_seqlens``, explicit per-token ``position_ids`` ``[total_tokens]`` may be passed.

    A fused kernel runs when one is available (C++ on CPU, Triton on CUDA); otherwise the pure-torch
    path, which gives bit-identical fp32 results on CPU. Autograd and ``torch.compile`` work with every path.

    Args:
        x: ``[B, H, S, D]`` (``layout="bhsd"``), ``[B, S, H, D]`` (``"bshd"``), or packed
            ``[total_tokens, H, D]``; any float dtype; any strides (e.g. a view into a fused qkv tensor).
        cos, sin: see above; fp32 for the fused kernels (other dtypes take the pure-torch path).
        interleaved: pairing; ``False`` pairs channels (i, i + r/2) (Hugging Face / GPT-NeoX),
            ``True`` pairs (2i, 2i + 1) (the paper, RoFormer, GPT-J, Meta LLaMA).
        layout: ``"bhsd"`` or ``"bshd"`` (ignored for packed x).
        inplace: write the result into ``x`` and return ``x``; pass-through channels are neither
            read nor written, and nothing of ``x``'s size is allocated.
        validate: also run :func:`check_tables` on cos/sin (one pass over the tables).
        position_ids: integer ``[S]`` / ``[B, S]`` (or ``[total_tokens]`` for packed x) rows of cos/sin.
        cu_seqlens: integer ``[N + 1]`` sequence boundaries of packed x.
        max_seqlen: the longest packed sequence (optional).

    Returns:
        Tensor of ``x``'s shape and dtype; arithmetic in fp32 (float64 for float64 ``x``).

    Example:
        >>> rope = RoPE(64)
        >>> q = torch.randn(1, 8, 16, 64)
        >>> cos, sin = rope.cos_sin(torch.arange(16))
        >>> apply_rotary(q, cos, sin).shape
        torch.Size([1, 8, 16, 64])
        >>> packed = torch.randn(5 + 3, 8, 64)  # two sequences of 5 and 3 tokens
        >>> cu_seqlens = torch.tensor([0, 5, 8])
        >>> out = apply_rotary(packed, cos, sin, cu_seqlens=cu_seqlens)
        >>> torch.equal(out[5:], apply_rotary(packed[5:].unsqueeze(0), cos[:3], sin[:3], layout="bshd")[0])
        True
    """
    return _rotate_tensors(
        [x], ["x"], cos, sin, interleaved=interleaved, layout=layout, inplace=inplace, validate=validate,
        position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
    )[0]  # fmt: skip


def apply_rotary_(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    validate: bool = False,
    position_ids: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_seqlen: int | None = None,
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
        position_ids=position_ids, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen,
    )  # fmt: skip


def check_tables(cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool, rtol: float = 1e-5) -> None:
    """Check that cos/sin tables are laid out for ``interleaved`` and describe rotations.

    A table built for one pairing and applied with the other mixes channels of different pairs: the
    "rotation" is then not orthogonal and changes vector norms (the mistake in seed 002's test).

    Raises:
        ValueError: naming the pairing the tables were built for, or the worst cos²+sin² mismatch.

    Example:
        >>> cos, sin = RoPE(8, interleaved=True).cos_sin(torch.arange(4))
        >>> check_tables(cos, sin, interleaved=True)  # passes
    """
    if cos.shape != sin.shape or cos.shape[-1] % 2:
        raise ValueError(f"cos/sin must share a shape [..., r] with r even, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    c, s = cos.detach().double(), sin.detach().double()

    def mismatch(t: torch.Tensor, inter: bool) -> float:
        a, b = (t[..., 0::2], t[..., 1::2]) if inter else t.chunk(2, dim=-1)
        return float((a - b).abs().max()) if t.numel() else 0.0

    tol = rtol * max(float(c.abs().max()) if c.numel() else 1.0, 1e-30)
    wanted = max(mismatch(c, interleaved), mismatch(s, interleaved))
    if wanted > tol:
        other = max(mismatch(c, not interleaved), mismatch(s, not interleaved))
        names = {True: "interleaved (pairs 2i, 2i+1)", False: "half (pairs i, i + r/2)"}
        if other <= tol:
            raise ValueError(
                f"cos/sin are laid out for the {names[not interleaved]} pairing but interleaved={interleaved} "
                f"was requested; build them with RoPE(..., interleaved={interleaved}).cos_sin(...)"
            )
        raise ValueError(
            f"cos/sin fit neither pairing: the two channels of a pair differ by up to {wanted:.3g} "
            f"for the {names[interleaved]} pairing"
        )
    norm = c * c + s * s
    if norm.numel():
        spread = float((norm - norm.flatten()[0]).abs().max())
        if spread > 10 * rtol * float(norm.flatten()[0].abs().clamp_min(1e-30)):
            raise ValueError(
                f"cos²+sin² is not constant over the table (spread {spread:.3g}): these are not rotation tables"
            )


def pair_permutation(head_dim: int, *, to: Literal["half", "interleaved"], rotary_dim: int | None = None) -> torch.Tensor:
    """Channel order (int64 ``[head_dim]``) that converts one pairing's layout into the other.

    ``x[..., pair_permutation(D, to="half")]`` takes interleaved channels (2i, 2i+1) to half
    channels (i, i + r/2); pass-through channels ``r..D-1`` keep their place.
    """
    r = head_dim if rotary_dim is None else rotary_dim
    if head_dim % 2 or r % 2 or not 0 < r <= head_dim:
        raise ValueError(f"need even head_dim and rotary_dim with 0 < rotary_dim <= head_dim, got {head_dim}, {r}")
    rot = torch.arange(r)
    if to == "half":
        rot = torch.cat((rot[0::2], rot[1::2]))
    elif to == "interleaved":
        rot = torch.stack((rot[: r // 2], rot[r // 2 :]), dim=-1).flatten()
    else:
        raise ValueError(f"to must be 'half' or 'interleaved', got {to!r}")
    return torch.cat((rot, torch.arange(r, head_dim)))


def to_interleaved(x: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder the last dim of ``x`` ``[..., D]`` from the half layout to the interleaved layout."""
    return x.index_select(-1, pair_permutation(x.shape[-1], to="interleaved", rotary_dim=rotary_dim).to(x.device))


def to_half(x: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder the last dim of ``x`` ``[..., D]`` from the interleaved layout to the half layout."""
    return x.index_select(-1, pair_permutation(x.shape[-1], to="half", rotary_dim=rotary_dim).to(x.device))


def permute_qk_weight(
    w: torch.Tensor, head_dim: int, to: Literal["half", "interleaved"] = "half", *, rotary_dim: int | None = None
) -> torch.Tensor:
    """Permute the output rows of a q or k projection so a checkpoint runs with the other pairing.

    Args:
        w: weight ``[n_heads * head_dim, in_features]`` or bias ``[n_heads * head_dim]``.
        head_dim: channels per head.
        to: ``"half"`` (interleaved checkpoint -> half-pairing model: the Meta LLaMA -> Hugging Face
            conversion) or ``"interleaved"`` (the inverse).
        rotary_dim: rotated channels per head (default ``head_dim``).

    Example:
        >>> w = torch.randn(4 * 64, 256)  # 4 heads of 64
        >>> permute_qk_weight(permute_qk_weight(w, 64, "half"), 64, "interleaved").equal(w)
        True
    """
    if w.dim() not in (1, 2) or w.shape[0] % head_dim:
        raise ValueError(
            f"w must be [n_heads * head_dim, in] or [n_heads * head_dim]; got shape {tuple(w.shape)} with head_dim={head_dim}"
        )
    perm = pair_permutation(head_dim, to=to, rotary_dim=rotary_dim).to(w.device)
    heads = w.reshape(w.shape[0] // head_dim, head_dim, -1)
    return heads.index_select(1, perm).reshape(w.shape)
