"""M-RoPE: the multimodal RoPE of Qwen2-VL, Qwen2.5-VL and Qwen3-VL.

Every token has three position ids, temporal, height and width (``[3, B, S]``, as transformers
passes them). Text tokens have three equal ids, so for text M-RoPE *is* 1-D RoPE; an image's tokens
share one temporal id and spread over a grid of height and width ids. Each of the ``r/2`` frequency
slots reads one of the three ids, assigned by ``mrope_section`` (sizes per axis, summing to ``r/2``):

- chunked (Qwen2-VL, Qwen2.5-VL): the first ``s_t`` slots read t, the next ``s_h`` read h, the last
  ``s_w`` read w; ``[16, 24, 24]`` gives slots 0-15 to t, 16-39 to h, 40-63 to w. The temporal axis
  gets only the fastest frequencies, the width axis only the slowest.
- interleaved (Qwen3-VL, ``mrope_interleaved``): slots cycle t, h, w while h and w have slots left,
  then the rest go to t; ``[24, 20, 20]`` gives "THW" x 20 then "TTTT". Every axis spans the whole
  spectrum.

Papers: Wang et al., *Qwen2-VL: Enhancing Vision-Language Model's Perception of the World at Any
Resolution* (2024); Bai et al., *Qwen2.5-VL Technical Report* (2025); the Qwen3-VL technical
report (2025) for the interleaved layout.

:class:`MRoPE` turns the three ids into tables: the frequency of slot ``i`` sits in row ``axis(i)`` of a
``[3, r/2]`` frequency matrix (zero elsewhere), so the angles are the same float64
``positions x frequencies`` product as axial RoPE's (:func:`rotary.tables.angles`), and equal bit
for bit to 1-D RoPE's when t = h = w.

:func:`multimodal_positions` builds the ``[3, B, S]`` ids from the token types and the
``grid_thw`` of each image and video, as transformers' ``get_rope_index`` does, and returns them
with where the next token goes. Decoding continues from that value
(:meth:`MultimodalPositions.continuation`), which belongs to the sequence it was computed for; no
module keeps ``rope_deltas`` between calls, so a second prompt can never inherit the first one's
(transformers caches them on the model, where they go stale across generate calls).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from .. import positions as P
from .._checks import check_bool, check_choice, check_positive_int, is_int, is_number
from .._device_copies import DeviceCopies
from ..errors import InputError, InputTypeError
from ..frequencies import frequencies
from ..positions import Positions
from ..rope_types import ROPE_TYPES
from ..rotation import Layout, check_layout, rotate
from ..tables import RotaryTables, cos_sin_table, table_dtype

__all__ = ["MRoPE", "MultimodalPositions", "check_mrope_section", "mrope_axes", "multimodal_positions"]

#: the three axes of M-RoPE positions, in the order of the ``[3, B, S]`` ids
AXES = ("t", "h", "w")


def _sections(mrope_section: Sequence[int], mrope_interleaved: bool) -> tuple[int, ...]:
    """The sections as a tuple of positive ints, checked to fit the layout (not yet against a width)."""
    if isinstance(mrope_section, (str, bytes)) or not isinstance(mrope_section, Sequence) or not mrope_section:
        raise InputError(
            f"mrope_section must be a list of section sizes (t, h, w), e.g. [16, 24, 24], got {mrope_section!r}"
        )
    if any(not is_int(s) or s <= 0 for s in mrope_section):
        raise InputError(f"mrope_section sizes must be positive ints, got {list(mrope_section)!r}")
    section = tuple(int(s) for s in mrope_section)
    if check_bool(mrope_interleaved, "mrope_interleaved"):
        if len(section) != 3:
            raise InputError(f"the interleaved layout needs three sections (t, h, w), got {list(section)}")
        got = tuple(torch.bincount(_interleaved_axes(section), minlength=3).tolist())
        if got != section:
            slots = sum(section)
            raise InputError(
                f"mrope_section {list(section)} cannot be interleaved over {slots} slots: cycling t, h, w gives "
                f"t, h, w = {list(got)} slots (h and w take every third slot: 3 * h <= {slots + 1}, 3 * w <= {slots})"
            )
    return section


def _interleaved_axes(section: tuple[int, ...]) -> torch.Tensor:
    axes = torch.zeros(sum(section), dtype=torch.int64)
    for axis in (1, 2):  # h on slots 1, 4, 7, ...; w on 2, 5, 8, ...; while their sections last
        axes[axis : 3 * section[axis] : 3] = axis
    return axes


def check_mrope_section(
    mrope_section: Sequence[int], rotary_dim: int, *, mrope_interleaved: bool = False
) -> tuple[int, ...]:
    """Validate ``mrope_section`` for ``rotary_dim`` rotated channels and return it as a tuple.

    Raises:
        rotary.errors.InputError: sections that are not positive ints, that do not sum to ``rotary_dim / 2``, or
            (interleaved) that cannot be laid out: not three of them, or h/w sections too large to
            take every third slot.

    Example:
        >>> check_mrope_section([16, 24, 24], 128)
        (16, 24, 24)
    """
    section = _sections(mrope_section, mrope_interleaved)
    slots = rotary_dim // 2
    if sum(section) != slots:
        raise InputError(
            f"mrope_section {list(section)} sums to {sum(section)} but rotary_dim={rotary_dim} has {slots} frequency "
            f"slots (rotary_dim / 2); make the sections sum to {slots}"
        )
    return section


def mrope_axes(mrope_section: Sequence[int], *, mrope_interleaved: bool = False) -> torch.Tensor:
    """The axis (0 = t, 1 = h, 2 = w) each frequency slot reads, int64 ``[sum(mrope_section)]``.

    Chunked: section ``j`` covers consecutive slots and reads axis ``j % 3``. Interleaved: see the
    module docstring.

    Example:
        >>> "".join("THW"[a] for a in mrope_axes([2, 3, 3]))
        'TTHHHWWW'
        >>> "".join("THW"[a] for a in mrope_axes([4, 2, 2], mrope_interleaved=True))
        'THWTHWTT'
    """
    section = _sections(mrope_section, mrope_interleaved)
    if mrope_interleaved:
        return _interleaved_axes(section)
    return torch.cat([torch.full((size,), j % 3, dtype=torch.int64) for j, size in enumerate(section)])


class MRoPE(nn.Module):
    """Multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a producer of rotary tables from ``[3, B, S]`` positions.

    Args:
        head_dim: channels per head ``D``.
        mrope_section: slots per axis (t, h, w), summing to ``rotary_dim / 2``: ``[16, 24, 24]``
            (Qwen2-VL, Qwen2.5-VL), ``[24, 20, 20]`` (Qwen3-VL).
        mrope_interleaved: Qwen3-VL's interleaved layout instead of the chunked one.
        base: RoPE base ``theta``.
        rotary_dim: channels rotated ``r`` (default ``D``).
        scaling: a static Hugging Face scaling block (``default``, ``linear``, ``yarn``, ...); the
            length-dependent types (``dynamic``, ``longrope``) are refused.
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
                f"rope_type {self.freqs.rope_type!r} changes the frequencies with the sequence length, which M-RoPE does "
                "not support here; use a static rope_type (default, linear, yarn, ...)"
            )
        self.mrope_interleaved = check_bool(mrope_interleaved, "mrope_interleaved")
        self.mrope_section = check_mrope_section(
            mrope_section, self.freqs.rotary_dim, mrope_interleaved=mrope_interleaved
        )
        self.interleaved = check_bool(interleaved, "interleaved")
        #: the axis each frequency slot reads, int64 ``[r/2]``
        self.axes = mrope_axes(self.mrope_section, mrope_interleaved=mrope_interleaved)
        slots = torch.arange(self.axes.numel())
        inv_freq_axes = torch.zeros(3, slots.numel(), dtype=torch.float32)
        inv_freq_axes[self.axes, slots] = self.freqs.inv_freq
        # plain host attributes, not buffers: .to(bfloat16) must not round them; each device gets its copy
        # once (self._copies), so no call copies them host-to-device
        self.inv_freq = self.freqs.inv_freq
        #: ``[3, r/2]``: slot i's frequency in row axes[i], zero in the two others
        self.inv_freq_axes = inv_freq_axes
        self._copies = DeviceCopies()

    @classmethod
    def from_hf_config(cls, config: Any, *, strict: bool = True) -> MRoPE:
        """The M-RoPE of a Qwen2-VL, Qwen2.5-VL or Qwen3-VL text model, from its config (never modified).

        Reads what :meth:`rotary.RoPE.from_hf_config` reads (head width, ``rope_theta``, the scaling
        block, 4.x ``rope_scaling`` with ``"type": "mrope"`` or 5.x ``rope_parameters``) and the
        ``mrope_section``; the layout is the model's (Qwen3-VL interleaved, the others chunked).
        :meth:`rotary.RoPE.from_hf_config` refuses these configs (a 1-D RoPE cannot represent M-RoPE);
        its error names this call and the ``rotary.RoPE(...)`` whose tables these equal on text
        positions (t = h = w).

        Args:
            config: a transformers config (the multimodal one or its ``text_config``), a path to a
                config.json, or a dict.
            strict: ``False`` turns configuration mistakes into warnings where possible.

        Raises:
            ConfigError: a config of a model without multimodal RoPE, or an invalid one; an
                ``mrope_section`` that does not sum to ``rotary_dim / 2`` names both.

        Example:
            >>> cfg = {"model_type": "qwen2_5_vl", "hidden_size": 2048, "num_attention_heads": 16,
            ...        "rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
            >>> MRoPE.from_hf_config(cfg).slot_axes()[14:18]
            'TTHH'
        """
        from ..hf.config import read_hf_config
        from ..rope_types import ConfigError

        settings = read_hf_config(config, strict=strict)
        if settings.mrope_section is None:
            raise ConfigError(
                f"model_type {settings.model_type!r} has no multimodal RoPE (no mrope_section); build its RoPE with "
                "rotary.RoPE.from_hf_config"
            )
        try:
            return cls(
                settings.head_dim, mrope_section=settings.mrope_section, mrope_interleaved=settings.mrope_interleaved,
                base=settings.base, rotary_dim=settings.rotary_dim, scaling=settings.scaling,
                interleaved=settings.interleaved, strict=strict,
            )  # fmt: skip
        except ConfigError:
            raise
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
        layout = "interleaved" if self.mrope_interleaved else "chunked"
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, mrope_section={list(self.mrope_section)}, "
            f"layout={layout}, base={self.freqs.base:g}, rope_type={self.freqs.rope_type!r}, interleaved={self.interleaved}"
        )

    def slot_axes(self) -> str:
        """The axis of each frequency slot as a string, e.g. ``"TTTT...HHHH...WWWW"``.

        Example:
            >>> MRoPE(16, mrope_section=[2, 3, 3]).slot_axes()
            'TTHHHWWW'
        """
        return "".join("THW"[a] for a in self.axes.tolist())

    def positions(self, position_ids: torch.Tensor | Positions | MultimodalPositions) -> Positions:
        """Validate M-RoPE positions: ids ``[3, B, S]`` (transformers' order), or 3-axis :class:`Positions`.

        Returns:
            :class:`~rotary.positions.Positions` with ids ``[B, S, 3]`` (the library's N-D order).
        """
        if isinstance(position_ids, MultimodalPositions):
            return position_ids.positions
        if isinstance(position_ids, Positions):
            if position_ids.axes != 3:
                raise InputError(_one_d_message(f"Positions with {position_ids.axes} axis/axes"))
            return position_ids
        if not isinstance(position_ids, torch.Tensor):
            raise InputTypeError(
                f"M-RoPE positions must be an integer tensor [3, B, S], got {type(position_ids).__name__}"
            )
        if position_ids.dim() in (1, 2):
            raise InputError(_one_d_message(f"shape {tuple(position_ids.shape)}"))
        if position_ids.dim() != 3 or position_ids.shape[0] != 3:
            raise InputError(
                f"M-RoPE positions must be [3, B, S] (temporal, height, width ids per token), got shape "
                f"{tuple(position_ids.shape)}"
            )
        return P.from_ids(position_ids.permute(1, 2, 0), axes=3)

    def tables(
        self, positions: torch.Tensor | Positions | MultimodalPositions, *, dtype: torch.dtype = torch.float32
    ) -> RotaryTables:
        """The tables that rotate tokens at ``positions``.

        Args:
            positions: ids ``[3, B, S]``, a :class:`MultimodalPositions`, or a 3-axis
                :class:`~rotary.positions.Positions` (ids ``[B, S, 3]``, ``[S, 3]`` or packed ``[T, 3]``).
            dtype: fp32, or float64 for float64 inputs.

        Returns:
            :class:`~rotary.tables.RotaryTables`, per token ``[B, S, r]`` (``[S, r]`` for shared ids).

        Raises:
            rotary.errors.InputError: 1-D positions (``[S]``, ``[B, S]``), or another shape than ``[3, B, S]``.
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
        """The tables for a batch of ``batch`` x ``seq_len`` tokens at ``position_ids``, checked against them.

        What :class:`rotary.nn.RotaryAttention` calls with its ``position_ids``: M-RoPE's ids are
        ``[3, B, S]``, so the layer passes them through unread.

        Args:
            position_ids: ids ``[3, B, S]`` (or ``[3, 1, S]``), a :class:`MultimodalPositions` or a 3-axis
                :class:`~rotary.positions.Positions`; there is no default.
            batch: ``B`` of the input.
            seq_len: ``S`` of the input.
            device: where the tables go (the input's device).
            dtype: fp32, or float64 for float64 inputs.

        Example:
            >>> mrope = MRoPE(16, mrope_section=[2, 3, 3])
            >>> ids = torch.arange(5).expand(3, 1, 5)
            >>> mrope.input_tables(ids, batch=2, seq_len=5, device="cpu").cos.shape
            torch.Size([1, 5, 16])
        """
        if position_ids is None:
            raise InputError(
                "M-RoPE rotates tokens by three ids (temporal, height, width): pass position_ids [3, B, S], from "
                "rotary.multimodal_positions(...) for a prompt and its .continuation(n) for the next tokens, or "
                "ids.expand(3, B, S) for text"
            )
        positions = self.positions(position_ids)
        P.from_ids(positions, batch=batch, seq_len=seq_len, axes=3, name="M-RoPE position_ids")
        return self.tables(positions.to(device), dtype=dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        position_ids: torch.Tensor | Positions | MultimodalPositions,
        layout: Layout = "bhsd",
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys (one kernel call).

        Args:
            q: ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]`` (``"bshd"``).
            k: same layout, ``Hk`` heads.
            position_ids: ``[3, B, S]`` ids (or :class:`MultimodalPositions`); there is no default.
            layout: ``"bhsd"`` or ``"bshd"``.

        Returns:
            ``(q_rotated, k_rotated)``.
        """
        batch_dim, seq_dim = check_layout(layout)
        if not isinstance(q, torch.Tensor) or q.dim() != 4:
            raise InputError(
                f"q must be 4-D ([B, H, S, D] or [B, S, H, D]), got {getattr(q, 'shape', type(q).__name__)}"
            )
        tables = self.input_tables(
            position_ids,
            batch=q.shape[batch_dim],
            seq_len=q.shape[seq_dim],
            device=q.device,
            dtype=table_dtype(q.dtype),
        )
        q, k = rotate([q, k], tables, layout=layout, kinds=("q", "k"), names=("q", "k"))
        return q, k


def _one_d_message(what: str) -> str:
    return (
        f"M-RoPE needs positions [3, B, S] (temporal, height, width ids per token), got 1-D positions ({what}); "
        "for text only give each token three equal ids, position_ids.expand(3, B, S), or build them with "
        "rotary.variants.multimodal_positions(...)"
    )


# ------------------------------------------------------------------------------------------------
# positions of text, images and videos


@dataclass(frozen=True)
class MultimodalPositions:
    """M-RoPE position ids of one batch of sequences, and where each sequence continues.

    Attributes:
        position_ids: int64 ``[3, B, S]`` (t, h, w); padding gets 0.
        next_position: int64 ``[B]``: the position of the next token of each row, one past the
            largest id of its tokens (text after the prompt continues from there on all three axes).
        rope_deltas: int64 ``[B, 1]``: ``next_position`` minus the row's real (unpadded) token count,
            transformers' ``rope_deltas``.
        bound: a host int, every id ``< bound`` (the largest ``next_position``).

    Example:
        >>> types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])          # text, a 2 x 2 image, text
        >>> mp = multimodal_positions(types, image_grid_thw=torch.tensor([[1, 4, 4]]), spatial_merge_size=2)
        >>> mp.position_ids[:, 0].tolist()
        [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
        >>> mp.next_position.tolist(), mp.rope_deltas.tolist()
        ([5], [[-2]])
        >>> mp.continuation(2).position_ids[:, 0].tolist()
        [[5, 6], [5, 6], [5, 6]]
    """

    position_ids: torch.Tensor
    next_position: torch.Tensor
    rope_deltas: torch.Tensor
    bound: int

    @property
    def positions(self) -> Positions:
        """The ids as 3-axis :class:`~rotary.positions.Positions` (``[B, S, 3]``), for :meth:`MRoPE.tables`."""
        return Positions.unchecked(self.position_ids.permute(1, 2, 0), self.bound, axes=3)

    def continuation(self, seq_len: int) -> MultimodalPositions:
        """Positions of ``seq_len`` further tokens of every row (text: three equal ids), e.g. decoding steps.

        The result continues in turn; ``rope_deltas`` are unchanged (the new tokens are text).
        """
        check_positive_int(seq_len, "seq_len")
        steps = torch.arange(seq_len, device=self.next_position.device)
        ids = (self.next_position[:, None] + steps).expand(3, -1, -1)  # [3, B, S]
        return MultimodalPositions(ids, self.next_position + seq_len, self.rope_deltas, self.bound + seq_len)


def _runs(kinds: list[int]) -> Iterator[tuple[int, int, int]]:
    """``(kind, start, length)`` of each run of equal values."""
    start = 0
    for i in range(1, len(kinds) + 1):
        if i == len(kinds) or kinds[i] != kinds[start]:
            yield kinds[start], start, i - start
            start = i


def _grids(grid_thw: torch.Tensor | None, name: str) -> torch.Tensor:
    if grid_thw is None:
        return torch.zeros(0, 3, dtype=torch.int64)
    if not isinstance(grid_thw, torch.Tensor) or grid_thw.dim() != 2 or grid_thw.shape[-1] != 3:
        raise InputError(f"{name} must be an integer tensor [N, 3] of (t, h, w) per item, got {grid_thw!r:.80}")
    if (
        grid_thw.is_floating_point()
        or grid_thw.is_complex()
        or grid_thw.dtype == torch.bool
        or bool((grid_thw <= 0).any())
    ):
        raise InputError(
            f"{name} must hold positive integer (t, h, w) sizes, got {grid_thw.tolist()} ({grid_thw.dtype})"
        )
    return grid_thw.detach().to("cpu", torch.int64)


def multimodal_positions(
    token_types: torch.Tensor,
    *,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    spatial_merge_size: int = 2,
    attention_mask: torch.Tensor | None = None,
    tokens_per_second: float | None = None,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None = None,
    split_video_frames: bool = False,
    text_after_vision: Literal["grid", "max"] = "grid",
) -> MultimodalPositions:
    """M-RoPE ids ``[3, B, S]`` of a batch of text, image and video tokens (transformers' ``get_rope_index``).

    Each run of text tokens counts on from the current position on all three axes. Each run of
    image (video) tokens takes the next ``image_grid_thw`` (``video_grid_thw``) entry, in order over
    the whole batch: its ``t x (h/m) x (w/m)`` tokens (``m = spatial_merge_size``) get the temporal id
    ``start + τ(j)`` and height/width ids ``start + y``, ``start + x``, in row-major order; the run after
    it starts at ``start + max(h, w) / m`` (``text_after_vision="grid"``). ``τ(j) = j`` except for
    Qwen2.5-VL's videos, which are aligned to time: ``τ(j) = int(j · tokens_per_second ·
    second_per_grid_ts[v])`` (fp32 product truncated, as transformers does).

    ``"grid"`` is what transformers 5.23 computes. Qwen's release code (and transformers 4.x) starts
    the text after a vision run one past the largest id so far (``text_after_vision="max"``). The two
    agree for images and single frames, and differ for videos whose temporal ids run past their
    height and width ids (Qwen2.5-VL's time-aligned videos, Qwen2-VL videos with more frames than rows
    or columns). Either way the next token after the whole prompt goes one past the largest id.

    Settings per model: Qwen2-VL: the defaults. Qwen2.5-VL: ``tokens_per_second`` from
    ``vision_config.tokens_per_second`` and the processor's ``second_per_grid_ts``. Qwen3-VL:
    ``split_video_frames=True`` (each video frame is its own run, frames separated by timestamp text).

    Args:
        token_types: integer ``[B, S]``: 0 text, 1 image, 2 video (the processor's ``mm_token_type_ids``;
            from ids: ``(input_ids == image_token_id) + 2 * (input_ids == video_token_id)``).
        image_grid_thw: ``[N_images, 3]`` patch grids (t, h, w) before merging.
        video_grid_thw: ``[N_videos, 3]``.
        spatial_merge_size: ``m`` (``vision_config.spatial_merge_size``; 2 in every Qwen-VL model).
        attention_mask: ``[B, S]`` 1 token / 0 padding; padding gets id 0 and is skipped.
        tokens_per_second: Qwen2.5-VL's temporal alignment (``None``: frames step by 1).
        second_per_grid_ts: seconds per temporal grid step of each video (default 1 each).
        split_video_frames: Qwen3-VL: a video of ``t`` frames is ``t`` grids ``(1, h, w)``.
        text_after_vision: ``"grid"`` (transformers 5.23) or ``"max"`` (Qwen's release code), see above.

    Returns:
        :class:`MultimodalPositions` on ``token_types``' device.

    Raises:
        rotary.errors.InputError: token types other than 0/1/2; a run of vision tokens whose length is not its
            grid's token count, or with no grid left; grids left over; a bad mask.
    """
    if (
        not isinstance(token_types, torch.Tensor)
        or token_types.dim() != 2
        or token_types.is_floating_point()
        or token_types.is_complex()
        or token_types.dtype == torch.bool
    ):
        raise InputError(
            f"token_types must be an integer tensor [B, S] (0 text, 1 image, 2 video), got {token_types!r:.80}"
        )
    if bool(((token_types < 0) | (token_types > 2)).any()):
        raise InputError(
            f"token_types must hold 0 (text), 1 (image) or 2 (video), got values {token_types.unique().tolist()}"
        )
    check_positive_int(spatial_merge_size, "spatial_merge_size")
    check_bool(split_video_frames, "split_video_frames")
    check_choice(text_after_vision, "text_after_vision", ("grid", "max"))
    if tokens_per_second is not None and (not is_number(tokens_per_second) or tokens_per_second <= 0):
        raise InputError(f"tokens_per_second must be a number > 0 (Qwen2.5-VL) or None, got {tokens_per_second!r}")
    batch, seq_len = token_types.shape
    if attention_mask is None:
        keep = torch.ones(batch, seq_len, dtype=torch.bool)
    else:
        keep = P.check_attention_mask(attention_mask).to("cpu")
        if keep.shape != token_types.shape:
            raise InputError(
                f"attention_mask must match token_types {tuple(token_types.shape)}, got {tuple(keep.shape)}"
            )
    grids = {1: _grids(image_grid_thw, "image_grid_thw"), 2: _grids(video_grid_thw, "video_grid_thw")}
    seconds: list[torch.Tensor] = []
    if second_per_grid_ts is not None:
        seconds = list(torch.as_tensor(second_per_grid_ts).reshape(-1).unbind())
        if len(seconds) != grids[2].shape[0]:
            raise InputError(
                f"second_per_grid_ts has {len(seconds)} entries but video_grid_thw {grids[2].shape[0]} videos"
            )
        if tokens_per_second is None:
            raise InputError(
                "second_per_grid_ts is given but tokens_per_second is None, so the seconds would be ignored; pass "
                "tokens_per_second (Qwen2.5-VL: vision_config.tokens_per_second) or drop second_per_grid_ts"
            )
        for v, second in enumerate(seconds):
            if (
                second.dtype == torch.bool
                or second.is_complex()
                or not (math.isfinite(float(second)) and float(second) > 0)
            ):
                raise InputError(
                    f"second_per_grid_ts[{v}] must be a finite number of seconds > 0, got {second.item()!r}"
                )
    if split_video_frames:  # Qwen3-VL: frame j of a video is a grid (1, h, w) of its own
        grids[2] = torch.repeat_interleave(grids[2], grids[2][:, 0], dim=0)
        grids[2][:, 0] = 1
    used = {1: 0, 2: 0}
    names = {1: "image", 2: "video"}
    types_cpu = token_types.detach().to("cpu")
    position_ids = torch.zeros(3, batch, seq_len, dtype=torch.int64)
    next_position = torch.zeros(batch, dtype=torch.int64)
    rope_deltas = torch.zeros(batch, 1, dtype=torch.int64)
    for b in range(batch):
        kept = keep[b].nonzero().flatten()
        pieces, current = [], 0
        for kind, start, length in _runs(types_cpu[b, kept].tolist()):
            if kind == 0:
                pieces.append((torch.arange(length) + current).expand(3, -1))
                current += length
                continue
            if used[kind] == grids[kind].shape[0]:
                raise InputError(
                    f"row {b} has a run of {length} {names[kind]} tokens at index {int(kept[start])} but no "
                    f"{names[kind]}_grid_thw entry is left ({grids[kind].shape[0]} given)"
                )
            t, h, w = grids[kind][used[kind]].tolist()
            if h % spatial_merge_size or w % spatial_merge_size:
                raise InputError(
                    f"{names[kind]}_grid_thw entry {used[kind]} is {[t, h, w]}: its height and width must be multiples of "
                    f"spatial_merge_size={spatial_merge_size} (the vision tower merges {spatial_merge_size} x "
                    f"{spatial_merge_size} patches into one token)"
                )
            h, w = h // spatial_merge_size, w // spatial_merge_size
            if t * h * w != length:
                raise InputError(
                    f"row {b}: the run of {length} {names[kind]} tokens at index {int(kept[start])} does not match its "
                    f"{names[kind]}_grid_thw {grids[kind][used[kind]].tolist()}, which gives t * (h/{spatial_merge_size}) "
                    f"* (w/{spatial_merge_size}) = {t * h * w} tokens"
                )
            steps = torch.arange(t)
            if kind == 2 and tokens_per_second is not None:  # Qwen2.5-VL: temporal ids follow time
                second = seconds[used[kind]] if seconds else 1
                if not (t - 1) * tokens_per_second * float(second) < 2**53:
                    raise InputError(
                        f"video {used[kind]}: {t} temporal steps at tokens_per_second={tokens_per_second!r} x "
                        f"second_per_grid_ts={float(second)!r} give temporal ids beyond 2**53, which positions cannot hold"
                    )
                steps = (steps * (tokens_per_second * second)).long()
            used[kind] += 1
            grid = torch.stack(torch.meshgrid(steps, torch.arange(h), torch.arange(w), indexing="ij")).reshape(3, -1)
            pieces.append(grid + current)
            current = current + max(h, w) if text_after_vision == "grid" else int(pieces[-1].max()) + 1
        row = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.int64)
        position_ids[:, b, kept] = row
        next_position[b] = int(row.max()) + 1 if row.numel() else 0
        rope_deltas[b, 0] = next_position[b] - kept.numel()
    for kind in (1, 2):
        if used[kind] != grids[kind].shape[0]:
            raise InputError(
                f"{names[kind]}_grid_thw holds {grids[kind].shape[0]} {'frames' if kind == 2 and split_video_frames else 'entries'} "
                f"but the token types hold only {used[kind]} {names[kind]} runs"
            )
    device = token_types.device
    bound = int(next_position.max()) if batch else 0
    return MultimodalPositions(position_ids.to(device), next_position.to(device), rope_deltas.to(device), bound)
