"""Multimodal positions: the M-RoPE ids of text, image and video tokens, and where decoding continues.

:func:`multimodal_positions` builds the ``[3, B, S]`` ids from the token types and the
``grid_thw`` of each image and video, as transformers' ``get_rope_index`` does, and returns them
with where the next token goes. Decoding continues from that value
(:meth:`MultimodalPositions.continuation`), which belongs to the sequence it was computed for; no
module keeps ``rope_deltas`` between calls, so a second prompt can never inherit the first one's
(transformers caches them on the model, where they go stale across generate calls).

:class:`rotary.MRoPE` (:mod:`.mrope`) turns these ids into tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from .. import positions as P
from .._checks import check_bool, check_choice, check_positive_int, is_number
from ..errors import InputError
from ..positions import Positions

__all__ = ["MultimodalPositions", "multimodal_positions"]


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
        return Positions.unchecked(self.position_ids.permute(1, 2, 0), self.bound, axes=self.position_ids.shape[0])

    def continuation(self, seq_len: int) -> MultimodalPositions:
        """Positions of ``seq_len`` further tokens of every row (text: three equal ids), e.g. decoding steps.

        The result continues in turn; ``rope_deltas`` are unchanged (the new tokens are text).
        """
        check_positive_int(seq_len, "seq_len")
        steps = torch.arange(seq_len, device=self.next_position.device)
        ids = (self.next_position[:, None] + steps).expand(self.position_ids.shape[0], -1, -1)  # [A, B, S]
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
