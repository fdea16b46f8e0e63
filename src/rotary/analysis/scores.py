"""Attention scores of rotated vectors and a PCA of the position tables."""

from __future__ import annotations

import torch

from .._checks import check_int
from .._limits import check_bytes
from ..errors import InputError
from ..rope import RoPE
from ..tables import angles
from ._args import check_rope

__all__ = ["score_matrix", "position_pca"]


def score_matrix(rope: RoPE, q: torch.Tensor, k: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Logits ``⟨R_m q, R_n k⟩`` of the same ``q``, ``k`` ``[D]`` at every position: float64 ``[seq_len, seq_len]``.

    Example:
        >>> s = score_matrix(RoPE(8), torch.ones(8), torch.ones(8), 4)
        >>> bool(torch.allclose(s[1, 0], s[3, 2]))
        True
    """
    d = check_rope(rope, "score_matrix").head_dim
    for name, v in (("q", q), ("k", k)):
        if not isinstance(v, torch.Tensor) or v.shape != (d,):
            shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise InputError(f"{name} must be a vector of shape [{d}] (head_dim), got {shape}")
    check_int(seq_len, "seq_len", minimum=1)
    check_bytes(8.0 * seq_len * max(seq_len, 2 * d), f"score_matrix(seq_len={seq_len})", "use a smaller seq_len")
    qq = q.double().expand(1, 1, seq_len, d).contiguous()
    kk = k.double().expand(1, 1, seq_len, d).contiguous()
    qr, kr = rope(qq, kk)
    return (qr[0, 0] @ kr[0, 0].T).double()


def position_pca(rope: RoPE, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A 2-D PCA of each position's float64 ``[cos θ_i m, sin θ_i m]``: ``(coords [seq_len, 2], explained ratio [2])``.

    Example:
        >>> coords, explained = position_pca(RoPE(16), 32)
        >>> coords.shape, bool(explained.sum() <= 1)
        (torch.Size([32, 2]), True)
    """
    check_rope(rope, "position_pca")
    check_int(seq_len, "seq_len", minimum=3)  # a 2-D PCA needs 3 points
    check_bytes(
        8.0 * seq_len * (3 * rope.freqs.inv_freq.numel() + seq_len),
        f"position_pca(seq_len={seq_len})",
        "use a smaller seq_len",
    )
    theta = angles(torch.arange(seq_len), rope.freqs.inv_freq)  # float64 [S, r/2]
    x = torch.cat((theta.cos(), theta.sin()), dim=-1)
    x = x - x.mean(dim=0)
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    var = s**2
    return u[:, :2] * s[:2], var[:2] / var.sum()
