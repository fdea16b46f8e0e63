"""The two pairings, (2i, 2i + 1) "interleaved" (the paper, GPT-J, Meta's LLaMA) and (i, i + r/2) "half" (Hugging
Face, GPT-NeoX), and conversions: of q/k projection rows (:func:`permute_qk_weight`, Hugging Face's Meta-to-HF
conversion) and of activations (:func:`to_half` / :func:`to_interleaved`).
"""

from __future__ import annotations

from typing import Literal

import torch

from ._checks import check_positive_int
from .errors import InputError

__all__ = ["pair_permutation", "permute_qk_weight", "to_half", "to_interleaved"]


def pair_permutation(
    head_dim: int, *, to: Literal["half", "interleaved"], rotary_dim: int | None = None
) -> torch.Tensor:
    """Channel order (int64 ``[head_dim]``) that converts one pairing's layout into the other (pass-through kept)."""
    r = _rotary_dim(head_dim, rotary_dim)
    rot = torch.arange(r)
    if to == "half":
        rot = torch.cat((rot[0::2], rot[1::2]))
    elif to == "interleaved":
        rot = torch.stack((rot[: r // 2], rot[r // 2 :]), dim=-1).flatten()
    else:
        raise InputError(f"to must be 'half' or 'interleaved', got {to!r}")
    return torch.cat((rot, torch.arange(r, head_dim)))


def _rotary_dim(head_dim: int, rotary_dim: int | None) -> int:
    """``rotary_dim`` (default ``head_dim``), checked: both even, ``0 < rotary_dim <= head_dim``."""
    check_positive_int(head_dim, "head_dim")
    r = head_dim if rotary_dim is None else check_positive_int(rotary_dim, "rotary_dim")
    if head_dim % 2 or r % 2 or not 0 < r <= head_dim:
        raise InputError(f"need even head_dim and rotary_dim with 0 < rotary_dim <= head_dim, got {head_dim}, {r}")
    return r


def _check_x(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise InputError(
            f"x must be a tensor [..., D] with a channel axis, got {getattr(x, 'shape', type(x).__name__)}"
        )


def _reorder(x: torch.Tensor, rotary_dim: int | None, to: Literal["half", "interleaved"]) -> torch.Tensor:
    """``x[..., pair_permutation(D, to=to, rotary_dim=r)]`` by reshapes alone: a new contiguous tensor."""
    r = _rotary_dim(x.shape[-1], rotary_dim)
    rot = x[..., :r]
    if to == "half":  # [..., r/2, 2] (pairs adjacent) -> [..., 2, r/2]: evens first, then odds
        rot = rot.unflatten(-1, (r // 2, 2)).transpose(-1, -2)
    else:  # [..., 2, r/2] (halves) -> [..., r/2, 2]: channel i beside channel i + r/2
        rot = rot.unflatten(-1, (2, r // 2)).transpose(-1, -2)
    if r == x.shape[-1]:
        return rot.flatten(-2).contiguous()
    return torch.cat((rot.flatten(-2), x[..., r:]), dim=-1)


def to_interleaved(x: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder the last dim of ``x`` ``[..., D]`` from the half layout to the interleaved one (a new contiguous tensor).

    Example:
        >>> to_interleaved(torch.tensor([0, 1, 2, 3]))  # pairs (0, 2), (1, 3) become adjacent
        tensor([0, 2, 1, 3])
    """
    _check_x(x)
    return _reorder(x, rotary_dim, "interleaved")


def to_half(x: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """Reorder the last dim of ``x`` ``[..., D]`` from the interleaved layout to the half one (a new contiguous tensor).

    Example:
        >>> to_half(torch.tensor([0, 2, 1, 3]))
        tensor([0, 1, 2, 3])
    """
    _check_x(x)
    return _reorder(x, rotary_dim, "half")


def permute_qk_weight(
    w: torch.Tensor, head_dim: int, to: Literal["half", "interleaved"] = "half", *, rotary_dim: int | None = None
) -> torch.Tensor:
    """Permute the output rows of a q or k projection so a checkpoint runs with the other pairing.

    ``w``: weight ``[n_heads * head_dim, in_features]`` or bias ``[n_heads * head_dim]``; ``to``: ``"half"``
    (interleaved checkpoint -> half model, Meta LLaMA -> Hugging Face) or ``"interleaved"``; ``rotary_dim``: default
    ``head_dim``.

    Example:
        >>> w = torch.randn(4 * 64, 256)  # 4 heads of 64
        >>> permute_qk_weight(permute_qk_weight(w, 64, "half"), 64, "interleaved").equal(w)
        True
    """
    check_positive_int(head_dim, "head_dim")
    if not isinstance(w, torch.Tensor) or w.dim() not in (1, 2) or w.shape[0] % head_dim:
        raise InputError(
            f"w must be [n_heads * head_dim, in] or [n_heads * head_dim]; got shape {tuple(getattr(w, 'shape', ()))} "
            f"with head_dim={head_dim}"
        )
    perm = pair_permutation(head_dim, to=to, rotary_dim=rotary_dim).to(w.device)
    heads = w.reshape(w.shape[0] // head_dim, head_dim, *w.shape[1:])
    return heads.index_select(1, perm).reshape(w.shape)
