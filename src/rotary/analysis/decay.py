"""Long-range decay: the bound of the RoFormer paper and the decay measured through a RoPE."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..module import RoPE

__all__ = ["decay_bound", "measured_decay"]


def decay_bound(head_dim: int = 128, base: float = 10000.0, distances: Sequence[int] | None = None) -> torch.Tensor:
    """The long-range decay bound of the RoFormer paper: ``(1 / (d/2)) Σ_j |S_j|`` against relative distance.

    Abel summation bounds ``|Σ_i q_i k_i* e^{i m θ_i}|`` by ``max_i |h_{i+1} - h_i| · Σ_j |S_j|`` with
    ``S_j = Σ_{i<j} e^{i m θ_i}`` and ``θ_i = base^(-2i/d)``; the mean of ``|S_j|`` over ``j = 1..d/2``
    is the curve in the RoFormer blog post. At distance 0 every ``|S_j| = j``, so the value is
    ``(d/2 + 1) / 2`` (32.5 for d = 128). Angles are float64.

    Args:
        head_dim: ``d`` (even).
        base: RoPE base.
        distances: relative distances ``m``; default ``0..256``.

    Returns:
        float64 ``[len(distances)]``.

    Example:
        >>> float(decay_bound(128, distances=[0])[0])
        32.5
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even int, got head_dim={head_dim}")
    if not base > 0:
        raise ValueError(f"base must be > 0, got base={base}")
    m = torch.arange(257, dtype=torch.float64) if distances is None else torch.as_tensor(distances, dtype=torch.float64)
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [d/2]
    angle = m[:, None] * theta[None, :]
    partial = torch.cumsum(torch.polar(torch.ones_like(angle), angle), dim=-1)  # S_1 .. S_{d/2}
    return partial.abs().mean(dim=-1)


def measured_decay(rope: RoPE, distances: Sequence[int], *, kind: str = "random", samples: int = 256, seed: int = 0) -> torch.Tensor:
    """Mean ``|⟨R_m q, R_n k⟩|`` over samples, for each relative distance ``m - n``.

    The score is taken between vectors actually rotated by ``rope`` (q at position ``m = distance``,
    k at position ``n = 0``), not read off the cos/sin tables.

    Args:
        rope: the RoPE to measure.
        distances: non-negative relative distances.
        kind: ``"random"`` (q, k ~ N(0, I), ``samples`` pairs) or ``"ones"`` (q = k = all ones).
        samples: number of random (q, k) pairs.

    Returns:
        float64 ``[len(distances)]``.

    Example:
        >>> measured_decay(RoPE(8), [0], kind="ones").tolist()  # ⟨1, 1⟩ = 8 at distance 0
        [8.0]
    """
    if kind not in ("random", "ones"):
        raise ValueError(f"kind must be 'random' or 'ones', got {kind!r}")
    dist = torch.as_tensor(list(distances), dtype=torch.int64)
    if dist.numel() == 0 or int(dist.min()) < 0:
        raise ValueError("distances must be a non-empty sequence of ints >= 0")
    d = rope.head_dim
    if kind == "ones":
        q = k = torch.ones(1, 1, 1, d, dtype=torch.float64)
    else:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(samples, 1, 1, d, generator=g, dtype=torch.float64)
        k = torch.randn(samples, 1, 1, d, generator=g, dtype=torch.float64)
    n = q.shape[0]
    qm = rope.rotate(q.expand(n, 1, dist.numel(), d).contiguous(), position_ids=dist)
    k0 = rope.rotate(k, position_ids=torch.zeros(1, dtype=torch.int64))
    return (qm * k0).sum(-1).abs().mean(dim=(0, 1))


