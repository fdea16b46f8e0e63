"""M-RoPE: the multimodal RoPE of the vision-language models (Qwen-VL, GLM-4V, ERNIE-4.5-VL, HunYuan-VL, ...).

Every token has one position id per axis (``[3, B, S]``; HunYuan-VL's XD-RoPE: four), and each frequency slot
reads one axis as ``mrope_section`` and the slot layout assign them. :class:`MRoPE` puts slot ``i``'s frequency in
row ``axis(i)`` of an ``[A, r/2]`` matrix, so its angles are axial RoPE's float64 product, equal bit for bit to 1-D
RoPE's on text (equal ids). The layouts per model: docs/variants.md, "M-RoPE".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import nn

from .. import positions as P
from .._checks import check_bool, check_choice, is_int
from .._device_copies import DeviceCopies
from ..errors import InputError, InputTypeError
from ..frequencies import frequencies
from ..positions import Positions
from ..rope_types import ROPE_TYPES
from ..rotation import Layout, check_layout, check_rank, rotate
from ..tables import RotaryTables, cos_sin_table, table_dtype
from .multimodal import MultimodalPositions, multimodal_positions

__all__ = [
    "LAYOUTS",
    "MRoPE",
    "MultimodalPositions",
    "check_mrope_section",
    "mrope_axes",
    "multimodal_positions",
]  # the last two re-exported

#: the three axes of M-RoPE positions, in the order of the ``[3, B, S]`` ids
AXES = ("t", "h", "w")

#: the slot layouts (see the module docstring)
LAYOUTS = ("chunked", "interleaved", "paired_hw")

MRopeLayout = Literal["chunked", "interleaved", "paired_hw"]


def _layout(mrope_layout: str | None, mrope_interleaved: bool) -> str:
    """The layout named by ``mrope_layout``, or by the older ``mrope_interleaved`` flag."""
    interleaved = check_bool(mrope_interleaved, "mrope_interleaved")
    if mrope_layout is None:
        return "interleaved" if interleaved else "chunked"
    check_choice(mrope_layout, "mrope_layout", LAYOUTS)
    if interleaved and mrope_layout != "interleaved":
        raise InputError(
            "mrope_interleaved=True asks for the interleaved layout but "
            f"mrope_layout={mrope_layout!r}; pass one of them"
        )
    return mrope_layout


def _sections(mrope_section: Sequence[int], layout: str) -> tuple[int, ...]:
    """The sections as a tuple of positive ints, checked to fit the layout (not yet against a width)."""
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence) or not mrope_section:
        raise InputError(
            f"mrope_section must be a list of section sizes (t, h, w), e.g. [16, 24, 24], got {mrope_section!r}"
        )
    if any(not is_int(s) or s <= 0 for s in mrope_section):
        raise InputError(f"mrope_section sizes must be positive ints, got {list(mrope_section)!r}")
    section = tuple(int(s) for s in mrope_section)
    if layout == "interleaved":
        if len(section) != 3:
            raise InputError(f"the interleaved layout needs three sections (t, h, w), got {list(section)}")
        got = tuple(torch.bincount(_interleaved_axes(section), minlength=3).tolist())
        if got != section:
            slots = sum(section)
            raise InputError(
                f"mrope_section {list(section)} cannot be interleaved over {slots} slots: cycling t, h, w gives "
                f"t, h, w = {list(got)} slots (h and w take every third slot: 3 * h <= {slots + 1}, 3 * w <= {slots})"
            )
    if layout == "paired_hw" and (len(section) != 3 or section[0] != section[1]):
        raise InputError(
            f"the paired_hw layout (ERNIE-4.5-VL) needs three sections (h, w, t) with h == w, got {list(section)}"
        )
    return section


def _interleaved_axes(section: tuple[int, ...]) -> torch.Tensor:
    axes = torch.zeros(sum(section), dtype=torch.int64)
    for axis in (1, 2):  # h on slots 1, 4, 7, ...; w on 2, 5, 8, ...; while their sections last
        axes[axis : 3 * section[axis] : 3] = axis
    return axes


def check_mrope_section(
    mrope_section: Sequence[int],
    rotary_dim: int,
    *,
    mrope_interleaved: bool = False,
    mrope_layout: MRopeLayout | None = None,
) -> tuple[int, ...]:
    """Validate ``mrope_section`` for ``rotary_dim`` rotated channels and return it as a tuple.

    Raises ``rotary.errors.InputError`` for sections that are not positive ints, do not sum to ``rotary_dim / 2``, or
    that the layout cannot lay out (interleaved and paired_hw: three sections; paired_hw: ``h == w``).

    Example:
        >>> check_mrope_section([16, 24, 24], 128)
        (16, 24, 24)
    """
    section = _sections(mrope_section, _layout(mrope_layout, mrope_interleaved))
    slots = rotary_dim // 2
    if sum(section) != slots:
        raise InputError(
            f"mrope_section {list(section)} sums to {sum(section)} but rotary_dim={rotary_dim} has {slots} frequency "
            f"slots (rotary_dim / 2); make the sections sum to {slots}"
        )
    return section


def mrope_axes(
    mrope_section: Sequence[int], *, mrope_interleaved: bool = False, mrope_layout: MRopeLayout | None = None
) -> torch.Tensor:
    """The axis (0 = t, 1 = h, 2 = w; XD-RoPE: 0-3) each frequency slot reads, int64 ``[sum(mrope_section)]``.

    Example:
        >>> "".join("THW"[a] for a in mrope_axes([2, 3, 3]))
        'TTHHHWWW'
        >>> "".join("THW"[a] for a in mrope_axes([4, 2, 2], mrope_interleaved=True))
        'THWTHWTT'
    """
    layout = _layout(mrope_layout, mrope_interleaved)
    section = _sections(mrope_section, layout)
    if layout == "interleaved":
        return _interleaved_axes(section)
    if layout == "paired_hw":
        pairs = torch.tensor([1, 2], dtype=torch.int64).repeat(section[0])
        return torch.cat([pairs, torch.zeros(section[2], dtype=torch.int64)])
    return torch.cat([torch.full((size,), j, dtype=torch.int64) for j, size in enumerate(section)])


class MRoPE(nn.Module):
    """Multimodal RoPE: a producer of rotary tables from ``[3, B, S]`` (or ``[A, B, S]``) position ids.

    Args:
        head_dim, base, rotary_dim: ``D``; RoPE base ``theta``; channels rotated ``r`` (default ``D``).
        mrope_section: slots per axis, summing to ``r / 2`` (Qwen2-VL ``[16, 24, 24]``).
        mrope_interleaved, mrope_layout: the slot layout (``mrope_interleaved=True``: Qwen3-VL's).
        scaling: a static Hugging Face scaling block (``dynamic`` and ``longrope`` are refused).
        interleaved: channel pairing; Qwen models pair (i, i + r/2): ``False``.

    Example:
        >>> mrope = MRoPE(128, mrope_section=[16, 24, 24], base=1e6)
        >>> ids = torch.arange(6).expand(3, 1, 6)              # text: t = h = w
        >>> mrope.tables(ids).cos.shape
        torch.Size([1, 6, 128])
    """

    def __init__(
        self,
        head_dim: int,
        *,
        mrope_section: Sequence[int],
        mrope_interleaved: bool = False,
        mrope_layout: MRopeLayout | None = None,
        base: float | None = None,
        rotary_dim: int | None = None,
        scaling: dict | None = None,
        interleaved: bool = False,
        strict: bool = True,
    ) -> None:
        super().__init__()
        self.freqs = frequencies(head_dim, base=base, rotary_dim=rotary_dim, scaling=scaling, strict=strict)
        if ROPE_TYPES[self.freqs.rope_type].length_dependent:
            raise InputError(
                f"rope_type {self.freqs.rope_type!r} changes the frequencies with the sequence length, which M-RoPE "
                "does not support here; use a static rope_type (default, linear, yarn, ...)"
            )
        #: the slot layout: ``"chunked"``, ``"interleaved"`` or ``"paired_hw"``
        self.mrope_layout = _layout(mrope_layout, mrope_interleaved)
        self.mrope_interleaved = self.mrope_layout == "interleaved"
        self.mrope_section = check_mrope_section(mrope_section, self.freqs.rotary_dim, mrope_layout=self.mrope_layout)
        self.interleaved = check_bool(interleaved, "interleaved")
        #: the axis each frequency slot reads, int64 ``[r/2]``
        self.axes = mrope_axes(self.mrope_section, mrope_layout=self.mrope_layout)
        #: ``A``, the ids per token: 3, or the number of chunked sections (HunYuan-VL's XD-RoPE: 4)
        self.num_axes = len(self.mrope_section) if self.mrope_layout == "chunked" else 3
        slots = torch.arange(self.axes.numel())
        inv_freq_axes = torch.zeros(self.num_axes, slots.numel(), dtype=torch.float32)
        inv_freq_axes[self.axes, slots] = self.freqs.inv_freq
        # plain host attributes, not buffers: .to(bfloat16) must not round them; each device gets its copy
        # once (self._copies), so no call copies them host-to-device
        self.inv_freq = self.freqs.inv_freq
        #: ``[A, r/2]``: slot i's frequency in row axes[i], zero in the others
        self.inv_freq_axes = inv_freq_axes
        self._copies = DeviceCopies()

    @classmethod
    def from_hf_config(cls, config: Any, *, strict: bool = True) -> MRoPE:
        """The M-RoPE of a vision-language text model (:data:`rotary.hf.MROPE_MODELS`) from its config (never modified).

        Reads what :meth:`rotary.RoPE.from_hf_config` reads (``config``: a transformers config, multimodal or its
        ``text_config``, a config.json path or a dict) and ``mrope_section`` (HunYuan-VL: ``xdrope_section``) or the
        model's default; the slot layout and pairing are the model's. ``strict=False`` turns mistakes into warnings
        where possible. Raises ``ConfigError`` for a model without multimodal RoPE or an invalid config (a section that
        does not sum to ``rotary_dim / 2`` names both).

        Example:
            >>> cfg = {"model_type": "qwen2_5_vl", "hidden_size": 2048, "num_attention_heads": 16,
            ...        "rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
            >>> MRoPE.from_hf_config(cfg).slot_axes()[14:18]
            'TTHH'
        """
        from ..hf.config import head_dim_noted, read_hf_config
        from ..rope_types import ConfigError

        settings = read_hf_config(config, strict=strict)
        if settings.mrope_section is None:
            raise ConfigError(
                f"model_type {settings.model_type!r} has no multimodal RoPE (no mrope_section); build its RoPE with "
                "rotary.RoPE.from_hf_config"
            )
        try:
            return cls(
                settings.head_dim,
                mrope_section=settings.mrope_section,
                mrope_layout=settings.mrope_layout,
                base=settings.base,
                rotary_dim=settings.rotary_dim,
                scaling=settings.scaling,
                interleaved=settings.interleaved,
                strict=strict,
            )
        except ConfigError as exc:
            raise head_dim_noted(exc, settings) from None
        except ValueError as exc:
            raise ConfigError(f"model_type {settings.model_type!r}: {exc}") from None

    @property
    def head_dim(self) -> int:
        return self.freqs.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.freqs.rotary_dim

    @property
    def attention_scaling(self) -> float:
        return self.freqs.attention_scaling

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, mrope_section={list(self.mrope_section)}, "
            f"layout={self.mrope_layout}, base={self.freqs.base:g}, rope_type={self.freqs.rope_type!r}, "
            f"interleaved={self.interleaved}"
        )

    def slot_axes(self) -> str:
        """The axis of each frequency slot as a string, ``"TTTT...HHHH...WWWW"`` (other than three axes: numbers).

        Example:
            >>> MRoPE(16, mrope_section=[2, 3, 3]).slot_axes(), MRoPE(16, mrope_section=[2, 2, 2, 2]).slot_axes()
            ('TTHHHWWW', '00112233')
        """
        names = "THW" if self.num_axes == 3 else "0123456789"
        return "".join(names[a] for a in self.axes.tolist())

    def positions(self, position_ids: torch.Tensor | Positions | MultimodalPositions) -> Positions:
        """Validate ids ``[A, B, S]`` (or ``A``-axis :class:`Positions`) into Positions with ids ``[B, S, A]``."""
        a = self.num_axes
        if isinstance(position_ids, MultimodalPositions):
            return position_ids.positions
        if isinstance(position_ids, Positions):
            if position_ids.axes != a:
                raise InputError(_one_d_message(f"Positions with {position_ids.axes} axis/axes", a))
            return position_ids
        if not isinstance(position_ids, torch.Tensor):
            raise InputTypeError(
                f"M-RoPE positions must be an integer tensor [{a}, B, S], got {type(position_ids).__name__}"
            )
        if position_ids.dim() in (1, 2):
            raise InputError(_one_d_message(f"shape {tuple(position_ids.shape)}", a))
        if position_ids.dim() != 3 or position_ids.shape[0] != a:
            raise InputError(
                f"M-RoPE positions must be [{a}, B, S] ({_AXES_WORDS.get(a, 'one id per axis')} per token), got shape "
                f"{tuple(position_ids.shape)}"
            )
        return P.from_ids(position_ids.permute(1, 2, 0), axes=a)

    def tables(
        self, positions: torch.Tensor | Positions | MultimodalPositions, *, dtype: torch.dtype = torch.float32
    ) -> RotaryTables:
        """Tables for tokens at ``positions``: ids ``[3, B, S]``, :class:`MultimodalPositions` or 3-axis Positions.

        Returns :class:`~rotary.tables.RotaryTables` ``[B, S, r]`` (``[S, r]`` for shared ids), fp32 or
        ``dtype=float64``. Raises ``rotary.errors.InputError`` for 1-D positions (``[S]``, ``[B, S]``) or another shape
        than ``[3, B, S]``.
        """
        positions = self.positions(positions)
        if dtype not in (torch.float32, torch.float64):
            raise InputTypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        ids = positions.ids
        inv_freq_axes = self._copies.on("inv_freq_axes", self.inv_freq_axes, ids.device)
        cos, sin = cos_sin_table(
            ids, inv_freq_axes, attention_scaling=self.attention_scaling, interleaved=self.interleaved, dtype=dtype
        )
        rows = torch.arange(ids.shape[0], device=ids.device) if positions.packed else None
        return RotaryTables.unchecked(cos, sin, self.interleaved, rows=rows)

    def input_tables(
        self,
        position_ids: torch.Tensor | Positions | MultimodalPositions | None,
        *,
        batch: int,
        seq_len: int,
        device: torch.device | str,
        dtype: torch.dtype = torch.float32,
    ) -> RotaryTables:
        """:meth:`tables` for ``batch`` x ``seq_len`` tokens, as :class:`rotary.nn.RotaryAttention` asks (ids required).

        Example:
            >>> mrope = MRoPE(16, mrope_section=[2, 3, 3])
            >>> ids = torch.arange(5).expand(3, 1, 5)
            >>> mrope.input_tables(ids, batch=2, seq_len=5, device="cpu").cos.shape
            torch.Size([1, 5, 16])
        """
        if position_ids is None:
            raise InputError(
                f"M-RoPE rotates tokens by {_COUNT.get(self.num_axes, self.num_axes)} ids "
                f"({_AXES_WORDS.get(self.num_axes, 'one per axis')}): pass position_ids [{self.num_axes}, B, S], from "
                "rotary.multimodal_positions(...) for a prompt and its .continuation(n) for the next tokens, or "
                f"ids.expand({self.num_axes}, B, S) for text"
            )
        positions = self.positions(position_ids)
        P.from_ids(positions, batch=batch, seq_len=seq_len, axes=self.num_axes, name="M-RoPE position_ids")
        return self.tables(positions.to(device), dtype=dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        position_ids: torch.Tensor | Positions | MultimodalPositions,
        layout: Layout = "bhsd",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys in one kernel call: ``(q_rotated, k_rotated)``.

        ``q`` ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]`` (``"bshd"``), ``k`` the same with ``Hk`` heads;
        ``position_ids`` as in :meth:`tables`, no default.
        """
        batch_dim, seq_dim = check_layout(layout)
        check_rank(q, "q")
        tables = self.input_tables(
            position_ids,
            batch=q.shape[batch_dim],
            seq_len=q.shape[seq_dim],
            device=q.device,
            dtype=table_dtype(q.dtype),
        )
        q, k = rotate([q, k], tables, layout=layout, kinds=("q", "k"), names=("q", "k"))
        return q, k


_AXES_WORDS = {3: "temporal, height, width ids", 4: "position, width, height, image ids (XD-RoPE)"}
_COUNT = {3: "three", 4: "four"}


def _one_d_message(what: str, axes: int = 3) -> str:
    return (
        f"M-RoPE needs positions [{axes}, B, S] ({_AXES_WORDS.get(axes, 'one id per axis')} per token), got 1-D "
        f"positions ({what}); for text only give each token {_COUNT.get(axes, axes)} equal ids, position_ids.expand("
        f"{axes}, B, S), or build them with rotary.variants.multimodal_positions(...)"
    )
