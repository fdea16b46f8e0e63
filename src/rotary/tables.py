"""Positions -> cos/sin tables in fp32, with angles formed in float64.

Hugging Face forms ``position * inv_freq`` in fp32: at position 2**20 an fp32 angle is only
resolved to 2**20 * 2**-24 = 0.06 rad. Here the product is taken in float64 (exact to ~1e-10 rad at
any position a model will see), cos/sin are evaluated in float64 and rounded once to fp32.
"""

from __future__ import annotations

import torch

__all__ = ["angles", "cos_sin_table", "expand_pairs", "TableCache"]


def angles(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotation angles ``position * inv_freq`` in float64.

    Args:
        position_ids: integer tensor ``[...]``.
        inv_freq: ``[r/2]``.

    Returns:
        float64 ``[..., r/2]``.
    """
    return position_ids.to(torch.float64).unsqueeze(-1) * inv_freq.to(device=position_ids.device, dtype=torch.float64)


def expand_pairs(half_table: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Lay a per-pair table ``[..., r/2]`` out per channel ``[..., r]`` for a pairing.

    Half pairing (channels i and i + r/2 form a pair): ``[t0 .. t(r/2-1), t0 .. t(r/2-1)]``.
    Interleaved pairing (channels 2i and 2i+1): ``[t0, t0, t1, t1, ...]``.
    """
    if interleaved:
        return half_table.repeat_interleave(2, dim=-1)
    return torch.cat((half_table, half_table), dim=-1)


def cos_sin_table(
    position_ids: torch.Tensor, inv_freq: torch.Tensor, *, attention_scaling: float = 1.0, interleaved: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``position * inv_freq``, times ``attention_scaling``, in fp32.

    Args:
        position_ids: integer tensor ``[S]`` or ``[B, S]``.
        inv_freq: ``[r/2]``.
        attention_scaling: multiplied into both tables.
        interleaved: channel layout (see :func:`expand_pairs`).

    Returns:
        ``(cos, sin)``, fp32, ``[..., r]`` on ``position_ids.device``.

    Example:
        >>> cos, sin = cos_sin_table(torch.arange(4), torch.tensor([1.0, 0.01]))
        >>> cos.shape
        torch.Size([4, 4])
    """
    theta = angles(position_ids, inv_freq)
    cos = (theta.cos() * attention_scaling).to(torch.float32)
    sin = (theta.sin() * attention_scaling).to(torch.float32)
    return expand_pairs(cos, interleaved), expand_pairs(sin, interleaved)


class TableCache:
    """cos/sin tables for positions ``0 .. length-1``, one per device, grown on demand.

    Tables are always built on the CPU in float64 and moved, so devices without float64 (MPS) get
    the same values. Growth doubles the length, so a long generation rebuilds O(log S) times.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float, interleaved: bool, length: int) -> None:
        self.inv_freq = inv_freq.detach().to("cpu", torch.float32)
        self.attention_scaling = float(attention_scaling)
        self.interleaved = interleaved
        self.length = max(int(length), 1)
        self._cpu: tuple[torch.Tensor, torch.Tensor] | None = None
        self._by_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _build(self, length: int) -> None:
        tables = cos_sin_table(
            torch.arange(length), self.inv_freq, attention_scaling=self.attention_scaling, interleaved=self.interleaved
        )
        self._cpu, self.length = tables, length
        self._by_device = {torch.device("cpu"): tables}

    def ensure(self, needed_length: int) -> None:
        """Make the tables cover positions ``0 .. needed_length-1``."""
        if self._cpu is None or needed_length > self.length:
            length = self.length
            while length < needed_length:
                length *= 2
            self._build(length)  # self.length changes only once the tables exist (a failed build leaves the old ones)

    def get(self, device: torch.device, needed_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables ``[length, r]`` on ``device`` covering at least ``needed_length`` positions."""
        self.ensure(needed_length)
        device = torch.device(device)
        if device.type != "cpu" and device.index is None and device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        tables = self._by_device.get(device)
        if tables is None:
            assert self._cpu is not None
            tables = (self._cpu[0].to(device), self._cpu[1].to(device))
            self._by_device[device] = tables
        return tables
