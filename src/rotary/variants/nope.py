"""NoPE layers: layers of a RoPE model that use no position encoding, as in Llama 4 and SmolLM3.

transformers writes them as ``no_rope_layers`` (**1 means RoPE**, 0 NoPE). Llama 4's query temperature in its NoPE
layers is :class:`NoPETemperature`, tables with sin = 0 and ``cos = τ`` for queries, so it runs on the same
kernels. Papers and settings: docs/variants.md, "p-RoPE and NoPE layers".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .. import positions as P
from .._checks import check_int, check_positive_int, is_int, is_number
from ..errors import InputError
from ..positions import Positions
from ..tables import RotaryTables

__all__ = ["NoPETemperature", "default_no_rope_layers", "nope_temperature", "rope_layer_flags"]


def default_no_rope_layers(num_layers: int, interval: int = 4) -> list[int]:
    """Llama 4's default ``no_rope_layers``: 1 (RoPE) for every layer except every ``interval``-th (0, NoPE).

    Example:
        >>> default_no_rope_layers(8)
        [1, 1, 1, 0, 1, 1, 1, 0]
    """
    check_int(num_layers, "num_layers", minimum=0)
    check_positive_int(interval, "no_rope_layer_interval")
    return [int((i + 1) % interval != 0) for i in range(num_layers)]


def rope_layer_flags(no_rope_layers: Sequence[int] | None, num_layers: int) -> list[bool]:
    """Which layers rotate, from Llama 4's ``no_rope_layers`` (1 = RoPE, 0 = NoPE; ``None``: all rotate).

    Raises ``rotary.errors.InputError`` for a ``num_layers`` that is not an int >= 0, a list of another length, or
    values other than the ints 0 and 1.

    Example:
        >>> rope_layer_flags([1, 1, 1, 0], 4)
        [True, True, True, False]
    """
    num_layers = check_int(num_layers, "num_layers", minimum=0)
    if no_rope_layers is None:
        return [True] * num_layers
    if isinstance(no_rope_layers, (str, bytes)) or not isinstance(no_rope_layers, Sequence):
        raise InputError(f"no_rope_layers must be a list of 0/1 flags, one per layer, got {no_rope_layers!r}")
    flags = list(no_rope_layers)
    if len(flags) != num_layers or any(not is_int(v) or v not in (0, 1) for v in flags):
        raise InputError(
            f"no_rope_layers must hold one flag per layer ({num_layers}), 1 = the layer uses RoPE, 0 = NoPE "
            f"(Llama 4's convention), got {flags!r}"
        )
    return [v == 1 for v in flags]


def nope_temperature(position_ids: torch.Tensor, *, floor_scale: int = 8192, attn_scale: float = 0.1) -> torch.Tensor:
    """Llama 4's query scale in NoPE layers, ``1 + attn_scale · log1p(floor((n + 1) / floor_scale))``, float64.

    ``position_ids``: int64 or int32 ``[...]``, >= 0; ``floor_scale``: tokens per temperature step. Returns float64
    ``[...]``.

    Example:
        >>> t = nope_temperature(torch.tensor([0, 8190, 8191, 16383]))
        >>> [round(v, 4) for v in t.tolist()]
        [1.0, 1.0, 1.0693, 1.1099]
    """
    check_positive_int(floor_scale, "floor_scale")
    if not is_number(attn_scale) or attn_scale < 0:
        raise InputError(f"attn_scale must be a finite number >= 0, got {attn_scale!r}")
    ids = P.integer_positions(position_ids)
    # floor((n + 1) / f) = floor(n / f) + floor((n mod f + 1) / f), summed in float64: no int64 overflow at n = 2**63 -
    # 1
    whole = torch.div(ids, floor_scale, rounding_mode="floor")
    carry = torch.div(ids - whole * floor_scale + 1, floor_scale, rounding_mode="floor")
    steps = whole.to(torch.float64) + carry.to(torch.float64)
    return torch.log1p(steps) * attn_scale + 1.0


class NoPETemperature(nn.Module):
    """Tables for a NoPE layer with Llama 4's temperature: no rotation, every query channel of ``D`` scaled by ``τ(n)``.

    ``floor_scale``, ``attn_scale``: see :func:`nope_temperature`.

    Example:
        >>> t = NoPETemperature(8).tables(torch.tensor([8190, 8191]))
        >>> t.cos[:, 0].tolist(), t.sin.abs().max().item(), t.k_cos.unique().tolist()
        ([1.0, 1.06931471824646], 0.0, [1.0])
    """

    def __init__(self, head_dim: int, *, floor_scale: int = 8192, attn_scale: float = 0.1) -> None:
        super().__init__()
        self.head_dim = check_positive_int(head_dim, "head_dim")
        if head_dim % 2:
            raise InputError(f"head_dim must be even, got {head_dim}")
        nope_temperature(
            torch.zeros(1, dtype=torch.int64, device="cpu"), floor_scale=floor_scale, attn_scale=attn_scale
        )  # checks
        self.floor_scale, self.attn_scale = int(floor_scale), float(attn_scale)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, floor_scale={self.floor_scale}, attn_scale={self.attn_scale:g}"

    def tables(self, positions: torch.Tensor | Positions, *, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """Query tables ``cos = τ(n)``, ``sin = 0`` and key tables of ones, ``[S, D]`` or ``[B, S, D]``."""
        if not isinstance(positions, Positions):
            positions = P.from_ids(positions)
        if positions.axes != 1:
            raise InputError(f"positions have {positions.axes} coordinate axes; NoPE temperature needs 1-D positions")
        ids = positions.ids
        tau = nope_temperature(ids, floor_scale=self.floor_scale, attn_scale=self.attn_scale).to(dtype)
        cos = tau.unsqueeze(-1).expand(*ids.shape, self.head_dim).contiguous()
        sin = torch.zeros_like(cos)
        rows = torch.arange(ids.shape[0], device=ids.device) if positions.packed else None
        return RotaryTables.unchecked(cos, sin, False, rows=rows, k_cos=torch.ones_like(cos), k_sin=sin)
