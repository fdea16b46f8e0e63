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


def _broadcast_tables(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate cos/sin against x and view them so they broadcast over x's rotated channels."""
    batch_dim, seq_dim = check_layout(layout)
    if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)):
        raise TypeError("cos and sin must be tensors (use RoPE.cos_sin(position_ids) to make them)")
    if cos.shape != sin.shape:
        raise ValueError(f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not cos.is_floating_point():
        raise TypeError(f"cos/sin must be floating point, got dtype {cos.dtype}")
    if cos.dim() not in (2, 3):
        raise ValueError(f"cos/sin must be [S, r] or [B, S, r], got shape {tuple(cos.shape)}")
    r, seq_len, head_dim = cos.shape[-1], x.shape[seq_dim], x.shape[-1]
    if r % 2 or r == 0 or r > head_dim:
        raise ValueError(
            f"cos/sin rotate r={r} channels but x has head_dim={head_dim}; r must be even and 0 < r <= head_dim"
        )
    if cos.shape[-2] != seq_len:
        raise ValueError(
            f"cos/sin cover S={cos.shape[-2]} positions but x (layout {layout!r}, shape {tuple(x.shape)}) has S={seq_len}"
        )
    if cos.dim() == 3 and cos.shape[0] not in (1, x.shape[batch_dim]):
        raise ValueError(f"cos/sin have batch {cos.shape[0]} but x has batch {x.shape[batch_dim]} (layout {layout!r})")
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    # [B, S, r] -> broadcastable over the head dimension
    head_axis = 1 if layout == "bhsd" else 2
    return cos.unsqueeze(head_axis), sin.unsqueeze(head_axis)


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    inplace: bool = False,
    validate: bool = False,
) -> torch.Tensor:
    """Rotate the first ``r = cos.shape[-1]`` channels of ``x``; the rest pass through unchanged.

    Args:
        x: ``[B, H, S, D]`` (``layout="bhsd"``) or ``[B, S, H, D]`` (``"bshd"``), any float dtype.
        cos, sin: ``[S, r]`` or ``[B, S, r]`` as made by :meth:`rotary.RoPE.cos_sin` for the same pairing.
        interleaved: pairing; ``False`` pairs channels (i, i + r/2) (Hugging Face / GPT-NeoX),
            ``True`` pairs (2i, 2i + 1) (the paper, RoFormer, GPT-J, Meta LLaMA).
        layout: ``"bhsd"`` or ``"bshd"``.
        inplace: write the result into ``x`` (pass-through channels are not touched) and return ``x``.
        validate: also run :func:`check_tables` on cos/sin (one pass over the tables).

    Returns:
        Tensor of ``x``'s shape and dtype; arithmetic in fp32 (float64 for float64 ``x``).

    Example:
        >>> rope = RoPE(64)
        >>> q = torch.randn(1, 8, 16, 64)
        >>> cos, sin = rope.cos_sin(torch.arange(16))
        >>> apply_rotary(q, cos, sin).shape
        torch.Size([1, 8, 16, 64])
    """
    _check_x(x)
    cos_b, sin_b = _broadcast_tables(x, cos, sin, layout)
    if validate:
        check_tables(cos, sin, interleaved=interleaved)
    return dispatch.rotate(x, cos_b, sin_b, interleaved=interleaved, inplace=inplace)


def apply_rotary_(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: Layout = "bhsd",
    validate: bool = False,
) -> torch.Tensor:
    """In-place :func:`apply_rotary` (``inplace=True``); returns ``x``."""
    return apply_rotary(x, cos, sin, interleaved=interleaved, layout=layout, inplace=True, validate=validate)


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
