"""RoPE-Mixed: learnable 2-D frequencies per head ("Rotary Position Embedding for Vision Transformer", ECCV 2024).

Pair ``j`` of head ``h`` turns by ``x · f_x[h, j] + y · f_y[h, j]``, so a head can attend along diagonals; the
per-head tables ``[S, H, r]`` pass their gradient to ``inv_freq`` ``[H, 2, r/2]`` through the fused kernels.
The paper's initialisation: docs/variants.md, "RoPE-Mixed".
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .._checks import check_bool, check_positive_float, check_positive_int
from ..errors import InputError
from ..rope_tables import keep_float32
from ..rope_types import default_inv_freq
from .coordinate_rope import CoordinateRoPE

__all__ = ["RoPEMixed"]


class RoPEMixed(CoordinateRoPE):
    """RoPE-Mixed: per-head learnable frequency vectors over (y, x), for vision transformers (one per layer).

    Args:
        head_dim, num_heads: ``D`` (``rotary_dim`` a multiple of 4); heads ``H`` of both q and k (per-head tables).
        base: θ of the magnitudes ``1 / θ^(4k/r)`` (the paper: 10).
        rotate: a random angle per head (the paper), drawn from ``generator``; ``False``: axial RoPE's frequencies.
        interleaved, rotary_dim, **kwargs: as :class:`CoordinateRoPE` (identity tokens: ``prefix_tokens=1`` for CLS).

    Example:
        >>> mixed = RoPEMixed(32, num_heads=4, generator=torch.Generator().manual_seed(0))
        >>> q = k = torch.randn(2, 4, 1 + 9, 32)              # [B, H, S, D]: CLS + a 3 x 3 grid
        >>> q_rot, k_rot = mixed(q, k, mixed.grid(3, 3, prefix=1))
        >>> mixed.inv_freq.shape, mixed.inv_freq.requires_grad
        (torch.Size([4, 2, 16]), True)
    """

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        *,
        base: float = 10.0,
        rotate: bool = True,
        interleaved: bool = False,
        rotary_dim: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(head_dim, 2, rotary_dim=rotary_dim, interleaved=interleaved, generator=generator, **kwargs)
        if self.rotary_dim % 4:
            raise InputError(
                f"RoPE-Mixed needs rotary_dim divisible by 4 (two blocks of pairs), got rotary_dim={self.rotary_dim}"
            )
        self.num_heads = check_positive_int(num_heads, "num_heads")
        self.base = check_positive_float(base, "base")
        self.random_rotation = check_bool(rotate, "rotate")
        magnitude = default_inv_freq(self.base, self.rotary_dim // 2)
        if not bool((torch.isfinite(magnitude) & (magnitude > 0)).all()):
            raise InputError(
                f"base={base!r} gives frequency magnitudes 1 / base^(4k/r) of {magnitude.tolist()} in fp32: they must "
                "be finite and > 0 (a pair with 0 never rotates, inf makes the tables NaN); "
                "use a base nearer the paper's 10"
            )
        # meta under torch.device("meta"); filled by reset_parameters()
        self.inv_freq = nn.Parameter(torch.empty(num_heads, 2, self.rotary_dim // 2))
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Initialise the frequencies as the paper does (a new angle per head, from ``generator`` or the module's)."""
        if self.inv_freq.is_meta:
            return
        # 1 / θ^(4k/r) for k < r/4: bit-identical to the axial frequencies of a block of r/2 channels
        magnitude = default_inv_freq(self.base, self.rotary_dim // 2).double()  # [r/4]
        g = self.generator if generator is None else generator
        if self.random_rotation:
            phi = torch.rand(self.num_heads, 1, dtype=torch.float64, generator=g) * (2 * math.pi)
        else:
            phi = torch.zeros(self.num_heads, 1, dtype=torch.float64)
        # the two blocks point along (cos φ, sin φ) and (cos(φ + π/2), sin(φ + π/2)) = (-sin φ, cos φ) in (x, y)
        fx = torch.cat((magnitude * phi.cos(), magnitude * -phi.sin()), dim=-1)  # [H, r/2]
        fy = torch.cat((magnitude * phi.sin(), magnitude * phi.cos()), dim=-1)
        with torch.no_grad():
            self.inv_freq.copy_(torch.stack((fy, fx), dim=1).to(self.inv_freq.device))  # rows (y, x), like grid(h, w)

    def frequencies(self) -> torch.Tensor:
        """``inv_freq`` ``[H, 2, r/2]``: the frequency vector of each pair over (y, x), per head."""
        return self.inv_freq

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # the learned frequencies stay fp32 with their values through .to(bfloat16)
        keep_float32([self.inv_freq], lambda: super(RoPEMixed, self)._apply(fn, recurse))
        return self

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_heads={self.num_heads}, base={self.base:g}, rotate={self.random_rotation}, "
            f"interleaved={self.interleaved}"
        )
