"""Multimodal positions: the M-RoPE ids of text, image, video and audio tokens, and where decoding continues.

:func:`multimodal_positions` is transformers' ``get_rope_index`` under the rules of one model family
(:data:`FAMILIES`; docs/variants.md, "M-RoPE"). Decoding continues from :meth:`MultimodalPositions.continuation`,
which belongs to its sequence: no module keeps ``rope_deltas`` between calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .. import positions as P
from .._checks import check_bool, check_choice, check_positive_int, is_number
from ..errors import InputError, InputTypeError
from ..positions import Positions

__all__ = ["FAMILIES", "MultimodalPositions", "family_settings", "multimodal_positions"]


@dataclass(frozen=True)
class MultimodalPositions:
    """M-RoPE position ids of one batch of sequences, and where each sequence continues (all int64).

    ``position_ids`` ``[3, B, S]`` (t, h, w; HunYuan-VL ``[A, B, S]``), padding 0; ``next_position`` ``[B]``, one past
    the largest id of each row (text continues from there on every axis); ``rope_deltas`` ``[B, 1]``, transformers'
    ``next_position`` minus the row's unpadded token count; ``bound``, a host int above every id.

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
        """The ids as ``A``-axis :class:`~rotary.positions.Positions` (``[B, S, A]``), for :meth:`MRoPE.tables`."""
        return Positions.unchecked(self.position_ids.permute(1, 2, 0), self.bound, axes=self.position_ids.shape[0])

    def continuation(self, seq_len: int) -> MultimodalPositions:
        """Positions of ``seq_len`` further text tokens of every row (``rope_deltas`` unchanged)."""
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
    attention_mask: torch.Tensor | None = None,
    model_type: str | None = None,
    config: Any = None,
    spatial_merge_size: int | None = None,
    tokens_per_second: float | None = None,
    second_per_grid_ts: torch.Tensor | Sequence[float] | None = None,
    split_video_frames: bool | None = None,
    temporal_merge_size: int | None = None,
    text_after_vision: Literal["grid", "max"] = "grid",
    num_axes: int | None = None,
) -> MultimodalPositions:
    """M-RoPE ids ``[3, B, S]`` (HunYuan-VL: ``[A, B, S]``) of a batch of text, image, video and audio tokens.

    ``model_type`` (e.g. ``"qwen3_5"``, ``"hunyuan_vl"``, or its text model's) or ``config`` (the multimodal
    model's, also giving merge sizes and ``num_axes``) selects the family's rules (:data:`FAMILIES`, docs/variants.md;
    default Qwen2-VL's); a keyword may not contradict them.

    Args:
        token_types: integer ``[B, S]``: 0 text, 1 image, 2 video, 3 audio (Omni); ``mm_token_type_ids``.
        image_grid_thw, video_grid_thw: ``[N, 3]`` patch grids (t, h, w) before merging, in order over the batch.
        attention_mask: ``[B, S]`` 1 token / 0 padding; padding gets id 0.
        spatial_merge_size, temporal_merge_size: ``m``; frames per temporal step (ERNIE: 2).
        tokens_per_second, second_per_grid_ts: Qwen2.5-VL's temporal alignment (Omni: ``position_id_per_seconds``);
            seconds per temporal grid step of each video (default 1).
        split_video_frames: each frame its own grid (Qwen3-VL).
        text_after_vision: ``"grid"`` (transformers 5.23) or ``"max"`` (Qwen's release code, transformers 4.x).

    Returns :class:`MultimodalPositions` on ``token_types``' device. Raises ``rotary.errors.InputError`` for unknown
    token types, a vision run that does not match its grid (or grids missing or left over), a bad mask, a
    ``model_type`` not built, a keyword contradicting the family's rule.

    Example:
        >>> types = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]])       # HunYuan-VL: a 2 x 2 grid + 2 row breaks
        >>> mp = multimodal_positions(types, image_grid_thw=torch.tensor([[1, 4, 4]]), model_type="hunyuan_vl")
        >>> mp.position_ids[:, 0].tolist()
        [[0, 1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 2, 0, 1, 2, 7], [0, 0, 0, 0, 1, 1, 1, 7], [0, 0, 0, 0, 0, 0, 0, 7]]
    """
    rules = family_settings(model_type, config)
    spatial_merge_size = _pick(spatial_merge_size, rules.get("spatial_merge_size"), 2, "spatial_merge_size", rules)
    split_video_frames = _pick(split_video_frames, rules.get("split_video_frames"), False, "split_video_frames", rules)
    temporal_merge_size = _pick(temporal_merge_size, rules.get("temporal_merge_size"), 1, "temporal_merge_size", rules)
    num_axes = _pick(num_axes, rules.get("num_axes"), 4, "num_axes", rules)
    if tokens_per_second is None:
        tokens_per_second = rules.get("tokens_per_second")
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
    omni = rules.get("family") in ("omni", "omni3")
    if bool(((token_types < 0) | (token_types > (3 if omni else 2))).any()):
        raise InputError(
            f"token_types must hold 0 (text), 1 (image) or 2 (video){', 3 (audio)' if omni else ''}, got values "
            f"{token_types.unique().tolist()}"
            + ("" if omni else " (3, audio, only for the Omni models: model_type='qwen2_5_omni' or 'qwen3_omni_moe')")
        )
    if omni:
        text_after_vision = "max"  # every Omni piece is followed by the next id past its largest
    check_positive_int(spatial_merge_size, "spatial_merge_size")
    check_positive_int(temporal_merge_size, "temporal_merge_size")
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
    if rules.get("family") == "xd":
        if grids[2].shape[0] or bool((token_types == 2).any()):
            raise InputError(
                "HunYuan-VL takes images only (its processor gives videos as frames, i.e. images): token_types "
                "must hold no 2 and video_grid_thw must be None"
            )
        check_positive_int(num_axes, "num_axes")
        if num_axes < 3:
            raise InputError(
                f"HunYuan-VL's XD-RoPE needs at least 3 axes (column, row, image), got num_axes={num_axes}"
            )
        return _xd_positions(token_types, keep, grids[1], spatial_merge_size, num_axes)
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
        row_kinds = types_cpu[b, kept].tolist()
        runs = list(_merged_runs(row_kinds) if omni else _runs(row_kinds))
        for r, (kind, start, length) in enumerate(runs):
            if kind in (0, 3):  # text, and the Omni models' audio: one id per token on all axes
                ids = torch.arange(length) + current
                if kind == 0 and rules.get("family") == "omni" and length >= 2:
                    # Qwen2.5-Omni's audio in video: its two begin tokens share an id, and its two end tokens
                    if r + 1 < len(runs) and runs[r + 1][0] == 4:
                        ids[-1] -= 1
                    if r > 0 and runs[r - 1][0] == 4:
                        ids[1:] -= 1
                pieces.append(ids.expand(3, -1))
                current = int(ids[-1]) + 1
                continue
            mixed = row_kinds[start : start + length] if kind == 4 else None  # Omni: a video with its audio
            if mixed is not None:
                kind, length = 2, mixed.count(2)
            if used[kind] == grids[kind].shape[0]:
                raise InputError(
                    f"row {b} has a run of {length} {names[kind]} tokens at index {int(kept[start])} but no "
                    f"{names[kind]}_grid_thw entry is left ({grids[kind].shape[0]} given)"
                )
            t, h, w = grids[kind][used[kind]].tolist()
            if h % spatial_merge_size or w % spatial_merge_size:
                raise InputError(
                    f"{names[kind]}_grid_thw entry {used[kind]} is {[t, h, w]}: its height and width must be "
                    f"multiples of spatial_merge_size={spatial_merge_size} (the vision tower merges "
                    f"{spatial_merge_size} x {spatial_merge_size} patches into one token)"
                )
            h, w = h // spatial_merge_size, w // spatial_merge_size
            if kind == 2:
                t = t // temporal_merge_size
            if t * h * w != length:
                raise InputError(
                    f"row {b}: the run of {length} {names[kind]} tokens at index {int(kept[start])} does not match its "
                    f"{names[kind]}_grid_thw {grids[kind][used[kind]].tolist()}, which gives "
                    f"{'t' if kind == 1 or temporal_merge_size == 1 else f't/{temporal_merge_size}'} * "
                    f"(h/{spatial_merge_size}) * (w/{spatial_merge_size}) = {t * h * w} tokens"
                )
            steps = torch.arange(t)
            if omni:
                second = seconds[used[kind]] if kind == 2 and seconds else torch.tensor(1.0)
                steps = _omni_steps(t, second, tokens_per_second, rules["family"], used[kind], names[kind])
            elif kind == 2 and tokens_per_second is not None and t > 1:  # Qwen2.5-VL: temporal ids follow time
                # (one temporal step is τ(0) = 0 at any rate: 0 x a rate past float32's range would be NaN)
                second = seconds[used[kind]] if seconds else 1
                if not (t - 1) * tokens_per_second * float(second) < 2**53:
                    raise InputError(
                        f"video {used[kind]}: {t} temporal steps at tokens_per_second={tokens_per_second!r} x "
                        f"second_per_grid_ts={float(second)!r} give temporal ids beyond "
                        "2**53, which positions cannot hold"
                    )
                steps = (steps * (tokens_per_second * second)).long()
            used[kind] += 1
            grid = torch.stack(torch.meshgrid(steps, torch.arange(h), torch.arange(w), indexing="ij")).reshape(3, -1)
            if mixed is not None:  # the video's ids on its tokens, the audio's (one per token) on the others
                is_video = torch.tensor(mixed) == 2
                block = (torch.arange(len(mixed)) - is_video.long().cumsum(0)).expand(3, -1).clone()
                block[:, is_video] = grid
                grid = block
            pieces.append(grid + current)
            current = current + max(h, w) if text_after_vision == "grid" else int(pieces[-1].max()) + 1
            if mixed is not None:  # the Omni models go on from the block's last run of video or audio tokens only
                last = len(mixed) - next(i for i, k in enumerate(reversed(mixed)) if k != mixed[-1])
                current = int(pieces[-1][:, last:].max()) + 1
        row = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.int64)
        position_ids[:, b, kept] = row
        next_position[b] = int(row.max()) + 1 if row.numel() else 0
        rope_deltas[b, 0] = next_position[b] - kept.numel()
    for kind in (1, 2):
        if used[kind] != grids[kind].shape[0]:
            raise InputError(
                f"{names[kind]}_grid_thw holds {grids[kind].shape[0]} "
                f"{'frames' if kind == 2 and split_video_frames else 'entries'} but the token types hold only "
                f"{used[kind]} {names[kind]} runs"
            )
    device = token_types.device
    bound = int(next_position.max()) if batch else 0
    return MultimodalPositions(position_ids.to(device), next_position.to(device), rope_deltas.to(device), bound)


# ------------------------------------------------------------------------------------------------
# the rules of each model family


#: model_type -> the rules of its positions: ``"qwen2_vl"`` (the defaults), ``"qwen2_5_vl"`` (videos
#: aligned to time), ``"frames"`` (each video frame its own grid), ``"ernie"`` (two frames per temporal
#: step), ``"xd"`` (HunYuan-VL's XD-RoPE). Each is checked against the model's own ``get_rope_index`` by
#: tests/variants/test_multimodal_positions.py.
FAMILIES: dict[str, str] = {
    "qwen2_vl": "qwen2_vl",
    "paddleocr_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    **dict.fromkeys("qwen3_vl qwen3_vl_moe qwen3_5 qwen3_5_moe glm4v glm4v_moe glm_ocr cosmos3_edge".split(), "frames"),
    "ernie4_5_vl_moe": "ernie",
    "hunyuan_vl": "xd",
    "qwen2_5_omni": "omni",
    "qwen3_omni_moe": "omni3",
}

#: model types with multimodal RoPE whose positions follow other rules, and why they are not built here
NOT_BUILT: dict[str, str] = {
    "glm_image": "GLM-Image places the image tokens it generates after the prompt (decode grids); its "
    "get_rope_index is not reproduced here",
}


def family_settings(model_type: str | None, config: Any = None) -> dict[str, Any]:
    """The rules of ``model_type`` (or of ``config``'s model): its family and the sizes the config states.

    Example:
        >>> family_settings("qwen3_5_text")
        {'family': 'frames', 'split_video_frames': True}
    """
    d = _config_dict(config)
    if config is not None and model_type is None:
        model_type = d.get("model_type")
    if d.get("thinker_config") is not None:  # an Omni model: the thinker reads the prompt
        d = _config_dict(d["thinker_config"])
    if model_type is None:
        return {}
    if not isinstance(model_type, str):
        raise InputError(f"model_type must be a string, e.g. 'qwen3_5', got {model_type!r}")
    key = model_type
    for suffix in ("_text", "_thinker"):
        key = key[: -len(suffix)] if key.endswith(suffix) else key
    if key in NOT_BUILT:
        raise InputError(
            f"multimodal_positions does not build the positions of model_type {model_type!r}: {NOT_BUILT[key]}"
        )
    if key not in FAMILIES:
        raise InputError(
            f"multimodal_positions has no rules for model_type {model_type!r}; it builds {', '.join(sorted(FAMILIES))} "
            "(the keywords split_video_frames, temporal_merge_size, tokens_per_second set the rules by hand)"
        )
    family = FAMILIES[key]
    rules: dict[str, Any] = {"family": family}
    if family == "frames":
        rules["split_video_frames"] = True
    if family == "ernie":
        rules["temporal_merge_size"] = 2
    vision = d.get("vision_config") or {}
    if not isinstance(vision, dict):
        vision = _config_dict(vision)
    if vision.get("spatial_merge_size") is not None:
        rules["spatial_merge_size"] = vision["spatial_merge_size"]
    if family == "ernie" and vision.get("temporal_merge_size") is not None:
        rules["temporal_merge_size"] = vision["temporal_merge_size"]
    if family == "qwen2_5_vl" and vision.get("tokens_per_second") is not None:
        rules["tokens_per_second"] = vision["tokens_per_second"]
    if family in ("omni", "omni3"):  # both thinker configs default to 25
        rules["tokens_per_second"] = d.get("position_id_per_seconds", 25)
    if family == "xd":
        text = _config_dict(d.get("text_config")) if d.get("text_config") is not None else d
        section = (text.get("rope_parameters") or {}).get("mrope_section") or (text.get("rope_parameters") or {}).get(
            "xdrope_section"
        )
        if section is not None:
            rules["num_axes"] = len(section)
    return rules


def _merged_runs(kinds: list[int]) -> Iterator[tuple[int, int, int]]:
    """The runs of :func:`_runs`, a video and its audio with no text between merged into one run of kind 4."""
    runs = list(_runs(kinds))
    i = 0
    while i < len(runs):
        kind, start, length = runs[i]
        j = i
        while j + 1 < len(runs) and runs[j][0] in (2, 3) and runs[j + 1][0] in (2, 3):
            j += 1
        if j > i:
            yield 4, start, runs[j][1] + runs[j][2] - start
        else:
            yield kind, start, length
        i = j + 1


def _omni_steps(t: int, second: torch.Tensor, per_second: float, family: str, index: int, name: str) -> torch.Tensor:
    """An Omni video's temporal ids before the start: ``j · second · per_second`` in fp32, as transformers."""
    if not (t - 1) * float(second) * per_second < 2**53:
        raise InputError(
            f"{name} {index}: {t} temporal steps at position_id_per_seconds={per_second!r} x second_per_grid_ts="
            f"{float(second)!r} give temporal ids beyond 2**53, which positions cannot hold"
        )
    if t == 1:  # τ(0) = 0 at any rate (0 x a rate past float32's range would be NaN)
        return torch.zeros(1, dtype=torch.long)
    steps = torch.arange(t) * torch.as_tensor(second).float() * per_second
    if family == "omni":
        return steps.long()  # Qwen2.5-Omni truncates
    if not bool((steps == steps.round()).all()):
        raise InputError(
            f"{name} {index}: Qwen3-Omni's temporal ids j * second_per_grid_ts ({float(second)!r}) * "
            f"position_id_per_seconds ({per_second!r}) are fractional ({steps.tolist()[:4]}...), which integer "
            "positions cannot hold; give seconds that make them whole (the processor's 2 frames at 2 fps: 1.0)"
        )
    return steps.long()


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return config
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise InputTypeError(f"config must be a transformers config or a dict, got {type(config).__name__}")


def _pick(given: Any, rule: Any, default: Any, name: str, rules: dict[str, Any]) -> Any:
    """The keyword's value if given (unless it contradicts the family's rule), else the rule's, else the default."""
    if given is None:
        return default if rule is None else rule
    if rule is not None and given != rule and name in ("split_video_frames", "temporal_merge_size"):
        raise InputError(
            f"{name}={given!r} contradicts the rule of the {rules['family']!r} family ({name}={rule!r}); drop the "
            "keyword or the model_type"
        )
    return given


def _xd_positions(
    token_types: torch.Tensor, keep: torch.Tensor, grids: torch.Tensor, merge: int, num_axes: int
) -> MultimodalPositions:
    """HunYuan-VL's XD-RoPE ids ``[A, B, S]``."""
    batch, seq_len = token_types.shape
    types_cpu = token_types.detach().to("cpu")
    position_ids = torch.zeros(num_axes, batch, seq_len, dtype=torch.int64)
    next_position = torch.zeros(batch, dtype=torch.int64)
    rope_deltas = torch.zeros(batch, 1, dtype=torch.int64)
    image = 0
    for b in range(batch):
        kept = keep[b].nonzero().flatten()
        row = torch.arange(kept.numel()).expand(num_axes, -1).clone()
        for kind, start, length in _runs(types_cpu[b, kept].tolist()):
            if kind == 0:
                continue
            if image == grids.shape[0]:
                raise InputError(
                    f"row {b} has a run of {length} image tokens at index {int(kept[start])} but no image_grid_thw "
                    f"entry is left ({grids.shape[0]} given)"
                )
            _, h, w = grids[image].tolist()
            h, w = h // merge, w // merge
            tokens = h * (w + 1)  # a row-break token after each row
            if length not in (tokens, tokens + 2):
                raise InputError(
                    f"row {b}: the run of {length} image tokens at index {int(kept[start])} does not match its "
                    f"image_grid_thw {grids[image].tolist()}: (h/{merge}) * (w/{merge} + 1) = {tokens} tokens, or "
                    f"{tokens + 2} with the begin and end tokens"
                )
            first = start + (length - tokens) // 2
            y, x = torch.meshgrid(torch.arange(h), torch.arange(w + 1), indexing="ij")
            row[num_axes - 3, first : first + tokens] = x.flatten()
            row[num_axes - 2, first : first + tokens] = y.flatten()
            row[num_axes - 1, first : first + tokens] = image
            image += 1
        position_ids[:, b, kept] = row
        next_position[b] = int(row.max()) + 1 if row.numel() else 0
        rope_deltas[b, 0] = next_position[b] - kept.numel()
    if image != grids.shape[0]:
        raise InputError(
            f"image_grid_thw holds {grids.shape[0]} entries but the token types hold only {image} image runs"
        )
    device = token_types.device
    bound = int(next_position.max()) if batch else 0
    return MultimodalPositions(position_ids.to(device), next_position.to(device), rope_deltas.to(device), bound)
