"""Long-range decay: the bound of the RoFormer paper and the decay measured through a RoPE."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._checks import check_int, check_positive_int, is_int, is_number
from .._limits import check_bytes
from ..errors import InputError
from ..rope import RoPE
from ._args import check_rope

__all__ = ["decay_bound", "measured_decay"]


def _distances(distances: object, *, allow_negative: bool) -> torch.Tensor:
    """``distances`` as a 1-D float64 tensor of whole numbers, or a ValueError naming the value."""
    if isinstance(distances, torch.Tensor):
        values = distances.detach().cpu().reshape(-1).tolist() if distances.dim() <= 1 else None
    elif isinstance(distances, (list, tuple, range)):
        values = list(distances)
    else:
        values = None
    if values is None or not all(is_int(v) for v in values) or (not allow_negative and any(v < 0 for v in values)):
        shown = distances if not isinstance(distances, torch.Tensor) else f"a tensor of shape {tuple(distances.shape)}"
        sign = "" if allow_negative else " >= 0"
        raise InputError(f"distances must be a sequence of ints{sign} (relative distances m - n), got {shown!r}"[:400])
    return torch.tensor(values, dtype=torch.float64)


def decay_bound(head_dim: int = 128, base: float = 10000.0, distances: Sequence[int] | None = None) -> torch.Tensor:
    """The RoFormer paper's long-range decay bound ``(1 / (d/2)) Σ_j |S_j|``, float64 ``[len(distances)]``.

    ``S_j = Σ_{i<j} e^{i m θ_i}``, ``θ_i = base^(-2i/d)`` (Abel summation); ``(d/2 + 1) / 2`` at distance 0.
    ``head_dim`` ``d`` is even; ``distances`` default ``0..256``.

    Example:
        >>> float(decay_bound(128, distances=[0])[0])
        32.5
    """
    if not is_int(head_dim) or head_dim <= 0 or head_dim % 2:
        raise InputError(f"head_dim must be a positive even int, got head_dim={head_dim!r}")
    if not is_number(base) or not base > 0:
        raise InputError(f"base must be a finite number > 0, got base={base!r}")
    m = torch.arange(257, dtype=torch.float64) if distances is None else _distances(distances, allow_negative=True)
    check_bytes(
        16.0 * m.numel() * head_dim, f"decay_bound(head_dim={head_dim}, {m.numel()} distances)", "use fewer distances"
    )
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # [d/2]
    angle = m[:, None] * theta[None, :]
    partial = torch.cumsum(torch.polar(torch.ones_like(angle), angle), dim=-1)  # S_1 .. S_{d/2}
    return partial.abs().mean(dim=-1)


def measured_decay(
    rope: RoPE, distances: Sequence[int], *, kind: str = "random", samples: int = 256, seed: int = 0
) -> torch.Tensor:
    """Mean ``|⟨R_m q, R_n k⟩|`` for each distance ``m - n >= 0`` through ``rope`` itself: float64 ``[len(distances)]``.

    ``kind``: ``"random"`` (``samples`` pairs q, k ~ N(0, I)) or ``"ones"`` (q = k = all ones).

    Example:
        >>> measured_decay(RoPE(8), [0], kind="ones").tolist()  # ⟨1, 1⟩ = 8 at distance 0
        [8.0]
    """
    if kind not in ("random", "ones"):
        raise InputError(f"kind must be 'random' or 'ones', got {kind!r}")
    check_rope(rope, "measured_decay")
    check_positive_int(samples, "samples")
    check_int(seed, "seed")
    dist = _distances(distances, allow_negative=False).long()
    if dist.numel() == 0:
        raise InputError("distances must be a non-empty sequence of ints >= 0, got an empty one")
    d = rope.head_dim
    n = 1 if kind == "ones" else samples
    check_bytes(
        8.0 * n * dist.numel() * d,
        f"measured_decay(samples={samples}, {dist.numel()} distances)",
        "use fewer samples or distances",
    )
    if kind == "ones":
        q = k = torch.ones(1, 1, 1, d, dtype=torch.float64)
    else:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(samples, 1, 1, d, generator=g, dtype=torch.float64)
        k = torch.randn(samples, 1, 1, d, generator=g, dtype=torch.float64)
    qm = rope.rotate(q.expand(n, 1, dist.numel(), d).contiguous(), position_ids=dist)
    k0 = rope.rotate(k, position_ids=torch.zeros(1, dtype=torch.int64))
    return (qm * k0).sum(-1).abs().mean(dim=(0, 1))
