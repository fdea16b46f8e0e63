"""xPos: RoPE whose queries grow and keys shrink with position, so scores decay with distance.

*A Length-Extrapolatable Transformer* (Sun et al., ACL 2023): a query at ``n`` meets a key at ``m`` with
``ζ_i^((n - m)/γ)``, whatever the centre ``c`` the scales are taken from. Keys are cached rotated, so the centre
is fixed per module; positions past :attr:`XPos.max_distance` from it and bidirectional attention are refused.
The formulas, the range and other implementations: docs/variants.md, "xPos".
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from .. import devices
from .. import positions as P
from .._checks import check_bool, check_int, check_positive_float, check_positive_int
from .._device_copies import DeviceCopies
from ..errors import InputError, InputTypeError
from ..frequencies import frequencies
from ..positions import Positions
from ..rotation import Layout, check_layout, check_rank, rotate
from ..tables import RotaryTables, angles, expand_pairs, table_dtype

__all__ = ["XPos", "xpos_zeta"]

#: log(2**-126): below this an fp32 number is subnormal (precision lost) and soon 0
_LOG_FP32_TINY = 126 * math.log(2.0)
#: log(2**14): the largest xPos scale fp16 inputs may meet (fp16 tops out at 65504 ~ 2**16: room for |x| up to ~4)
_LOG_FP16_SCALE = 14 * math.log(2.0)


def xpos_zeta(rotary_dim: int) -> torch.Tensor:
    """xPos's per-pair bases ``ζ_i = (2i + 0.4 r) / (1.4 r)``, float64 ``[r/2]``.

    Example:
        >>> z = xpos_zeta(64)
        >>> round(float(z[0]), 6), round(float(z[-1]), 6)
        (0.285714, 0.977679)
    """
    check_positive_int(rotary_dim, "rotary_dim")
    if rotary_dim % 2:
        raise InputError(f"rotary_dim must be even (channels rotate in pairs), got {rotary_dim}")
    i = torch.arange(rotary_dim // 2, dtype=torch.float64, device="cpu")  # also under torch.device("meta")
    return (2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim)


class XPos(nn.Module):
    """xPos: a producer of rotary tables with separate key tables, for causal attention (see the module docstring).

    Args:
        head_dim, base, rotary_dim: ``D``; RoPE base ``theta``; channels rotated ``r`` (default ``D``).
        scale_base: ``γ`` (> 0), the distance over which the factor of pair ``i`` falls to ``ζ_i``.
        interleaved: pairing, as in :class:`rotary.RoPE` (the reference implementations: ``True``).
        max_position, center: the trained length; the position ``c`` where both scales are 1 (default
            ``max_position // 2``, at most :attr:`max_distance`).

    Example:
        >>> xpos = XPos(64)
        >>> q, k = torch.randn(1, 4, 8, 64), torch.randn(1, 4, 8, 64)
        >>> q_rot, k_rot = xpos(q, k)
        >>> t = xpos.tables(torch.arange(8))
        >>> t.k_cos is not None, t.cos.shape
        (True, torch.Size([8, 64]))
    """

    #: why xPos needs causal attention (read by :class:`rotary.nn.RotaryAttention`)
    requires_causal: ClassVar[str] = (
        "xPos scales the score of a query at n and a key at m by ζ^((n - m)/γ), which decays for keys behind the "
        "query but grows exponentially for keys ahead of it (m > n), and bidirectional attention sees those; "
        "the paper uses xPos only with a causal mask"
    )

    def __init__(
        self,
        head_dim: int,
        *,
        scale_base: float = 512.0,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        max_position: int = 2048,
        center: int | None = None,
    ) -> None:
        super().__init__()
        freqs = frequencies(head_dim, base=base, rotary_dim=rotary_dim)
        self.head_dim, self.rotary_dim = freqs.head_dim, freqs.rotary_dim
        self.scale_base = check_positive_float(scale_base, "scale_base")
        self.interleaved = check_bool(interleaved, "interleaved")
        self.max_position = check_positive_int(max_position, "max_position")
        # plain host attributes, not buffers: .to(bfloat16) must not round them; each device gets its copy
        # once (self._copies), so no call copies them host-to-device
        self.inv_freq = freqs.inv_freq
        self.zeta = xpos_zeta(self.rotary_dim)
        self._copies = DeviceCopies()
        self.max_distance = math.floor(self.scale_base * _LOG_FP32_TINY / -math.log(float(self.zeta[0])))
        #: the largest ``|n - c|`` for fp16 inputs, whose rotated q/k are rounded to fp16 (about 7.7 γ)
        self.fp16_max_distance = math.floor(self.scale_base * _LOG_FP16_SCALE / -math.log(float(self.zeta[0])))
        if center is None:  # the middle of the trained context, kept where position 0 stays in range
            self.center = min(self.max_position // 2, self.max_distance)
        else:
            self.center = check_int(center, "center", minimum=0)
        if self.center > self.max_distance:
            raise InputError(
                f"center={self.center} is further than max_distance={self.max_distance} from position 0: the scales "
                f"ζ^(±(0 - c)/γ) of early positions would leave fp32's range; use center <= {self.max_distance} "
                "or a larger scale_base"
            )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, scale_base={self.scale_base:g}, "
            f"center={self.center}, interleaved={self.interleaved}"
        )

    def scales(self, position_ids: torch.Tensor) -> torch.Tensor:
        """The query scales ``ζ_i^((n - c)/γ)``, float64 ``[..., r/2]`` (keys use the reciprocal).

        Example:
            >>> xpos = XPos(64, center=0)
            >>> s = xpos.scales(torch.tensor([0, 512]))
            >>> s[0].tolist() == [1.0] * 32, round(float(s[1, 0]), 6)
            (True, 0.285714)
        """
        exponent = (position_ids.to(torch.float64) - self.center) / self.scale_base
        return self._copies.on("zeta", self.zeta, position_ids.device) ** exponent.unsqueeze(-1)

    def tables(self, positions: torch.Tensor | Positions, *, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """Tables ``[S, r]`` or ``[B, S, r]``: ``cos``/``sin`` for queries, ``k_cos``/``k_sin`` for keys.

        ``positions``: integer ``[S]``, ``[B, S]`` (or packed Positions); ``dtype``: fp32, or float64 for float64
        inputs. Raises ``rotary.errors.InputError`` for a position further than :attr:`max_distance` from the centre (on
        accelerators, positions of unknown bound are not read: the caller's contract).
        """
        if not isinstance(positions, Positions):
            positions = P.from_ids(positions)
        if positions.axes != 1:
            raise InputError(f"positions have {positions.axes} coordinate axes but xPos is 1-D; pass ids [S] or [B, S]")
        if dtype not in (torch.float32, torch.float64):
            raise InputTypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        ids = positions.ids
        bound = positions.bound
        if bound is None and ids.numel() and not torch.compiler.is_compiling():
            if devices.host_checks(ids.device):  # the CPU: reading is free (elsewhere: the caller's contract)
                bound = int(ids.max()) + 1
        if bound is not None and ids.numel() and bound - 1 - self.center > self.max_distance:  # no tokens: no position
            n = bound - 1
            raise InputError(
                f"position {n} is {n - self.center} from the xPos centre {self.center}, beyond max_distance="
                f"{self.max_distance}: the scales ζ^(±(n - c)/γ) (γ={self.scale_base:g}) leave fp32's range there "
                "(queries underflow to 0, keys overflow to inf); build XPos with a larger scale_base or a center "
                "nearer these positions"
            )
        theta = angles(ids, self._copies.on("inv_freq", self.inv_freq, ids.device))  # [..., r/2] float64
        cos, sin = theta.cos(), theta.sin()
        scale = self.scales(ids)
        q_cos, q_sin = (expand_pairs((t * scale).to(dtype), self.interleaved) for t in (cos, sin))
        k_cos, k_sin = (expand_pairs((t / scale).to(dtype), self.interleaved) for t in (cos, sin))
        rows = torch.arange(ids.shape[0], device=ids.device) if positions.packed else None
        return RotaryTables.unchecked(q_cos, q_sin, self.interleaved, rows=rows, k_cos=k_cos, k_sin=k_sin)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        position_ids: torch.Tensor | Positions | None = None,
        offset: int = 0,
        layout: Layout = "bhsd",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate and scale queries and keys in one kernel call: ``(q_rotated, k_rotated)``, shapes and dtypes kept.

        ``q`` ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]`` (``"bshd"``), ``k`` the same with ``Hk`` heads;
        ``position_ids`` integer ``[S]`` or ``[B, S]``, default ``offset + arange(S)``. Raises
        ``rotary.errors.InputError`` for positions out of range (fp16: past :attr:`fp16_max_distance`) or both
        ``offset`` and ids.
        """
        check_rank(q, "q")
        batch_dim, seq_dim = check_layout(layout)
        if position_ids is not None:
            if offset:
                raise InputError(f"offset={offset!r} and position_ids both give positions; pass one")
            positions = P.from_ids(position_ids, batch=q.shape[batch_dim], seq_len=q.shape[seq_dim], device=q.device)
        else:
            positions = P.arange(q.shape[seq_dim], offset=offset, device=q.device)
        if (
            torch.float16 in (q.dtype, getattr(k, "dtype", None))
            and not torch.compiler.is_compiling()
            and positions.ids.numel()
        ):
            self._check_fp16_range(positions)
        tables = self.tables(positions, dtype=table_dtype(q.dtype))
        q, k = rotate([q, k], tables, layout=layout, kinds=("q", "k"), names=("q", "k"))
        return q, k

    def _check_fp16_range(self, positions: Positions) -> None:
        """Refuse float16 inputs past :attr:`fp16_max_distance` from the centre (when the host knows the range)."""
        ids = positions.ids
        if devices.host_checks(ids.device):
            low, high = (int(v) for v in torch.aminmax(ids))
        elif positions.start is not None:  # start .. start + S - 1 (1-D ids): known without a read
            low, high = positions.start, positions.start + ids.shape[-1] - 1
        else:
            return
        far = max(high - self.center, self.center - low)
        if far > self.fp16_max_distance:
            n = high if high - self.center >= self.center - low else low
            raise InputError(
                f"position {n} is {abs(n - self.center)} from the xPos centre {self.center}, beyond fp16_max_distance="
                f"{self.fp16_max_distance} for float16 inputs: the scales ζ^(±(n - c)/γ) (γ={self.scale_base:g}) reach "
                "2**14 there and the rotated q/k overflow fp16 to inf; use bfloat16 or float32 inputs, a larger "
                "scale_base or a center nearer these positions"
            )
