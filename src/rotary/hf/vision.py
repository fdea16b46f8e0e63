"""The RoPE of Hugging Face vision encoders, built from their configs: :func:`vision_rope`.

    vision_config ──► vision_rope ──► VisionRoPE ──.positions(grid)──► Coordinates [N, A]
    (model_type,      (the form of     (AxialRoPE +   .tables(grid) ──► RotaryTables [N, r]
     rope_parameters,  its tower)       token order)                    (what the model applies)
     heads, merge)

A tower's RoPE is an :class:`~rotary.variants.AxialRoPE` (frequencies, pairing, the axes' slots, identity
tokens) plus the order the tower lays its patches out in (Qwen-VL's ``spatial_merge_size`` blocks, Qwen2.5-VL's
attention windows, several images and videos packed into one sequence), checked against each tower in
transformers on tiny models (tests/hf/test_vision_encoders.py). :data:`VISION_ROPE` maps a model_type to its
form (:data:`FORMS` says what each is); :data:`ENCODER_STATUS` gives every other RoPE-applying encoder of
transformers with the reason it is not built. What ``grid`` is for each form: docs/vision.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .._checks import is_int
from ..errors import ConfigError, InputError
from ..tables import RotaryTables
from ..variants.axial import AxialRoPE
from ..variants.coordinates import Coordinates
from .encoder_tables import SEQUENCE_ROPE
from .vision_tables import ENCODER_STATUS, FORMS, VISION_ROPE

__all__ = ["ENCODER_STATUS", "FORMS", "VISION_ROPE", "VisionRoPE", "vision_rope"]

#: model_type -> the hidden width its rotary embedding divides by the heads (transformers' own choice)
_WIDTH = {"qwen2_vl_vision": "embed_dim"}
#: model_type -> the spatial merge its positions use whatever the config says (transformers passes 1)
_MERGE_ONE = {"paddleocr_vl_vision", "kimi_k25_vision"}
#: model_types whose merge size is given per image or video with the grid (VideoLLaMA3's ``merge_sizes``)
_MERGE_PER_CALL = {"video_llama_3_vision"}
#: keys a checkpoint's config may leave out -> transformers' config-class defaults (checked by the tests)
CONFIG_DEFAULTS: dict[str, dict[str, int]] = {
    **{
        t: {"spatial_merge_size": 2}
        for t in VISION_ROPE
        if VISION_ROPE[t] in ("qwen_vl", "minimax", "inkling2") and t not in _MERGE_ONE | _MERGE_PER_CALL
    },
    **{
        t: {"spatial_merge_size": 2, "window_size": 112, "patch_size": 14}
        for t in VISION_ROPE
        if VISION_ROPE[t] == "qwen_vl_window"
    },
    "efficientloftr": {"q_aggregation_kernel_size": 4, "q_aggregation_stride": 4},
    **{
        t: {
            "memory_attention_hidden_size": 256,
            "memory_attention_downsample_rate": 1,
            "memory_attention_num_attention_heads": 1,
        }
        for t in VISION_ROPE
        if VISION_ROPE[t] in ("sam2_memory", "edgetam_memory")
    },
    **{t: {"perceiver_resampler_num_latents": 256} for t in VISION_ROPE if VISION_ROPE[t] == "edgetam_memory"},
}
#: the forms whose towers merge spatial_merge_size x spatial_merge_size blocks of patches (grid rows per image)
_MERGING = ("qwen_vl", "qwen_vl_window", "kimi", "minimax", "inkling2")
#: form -> the rope_type its rotary embedding accepts (else "axial"); DINOv3's config has none
_ROPE_TYPE = {"llama4": "default", "dinov3": "default", "loftr": "default"}
#: model_type -> rope_theta when the config states none (transformers' config-class default; else 10000)
_DEFAULT_THETA = {
    "dinov3_vit": 100.0,
    "eomt_dinov3": 100.0,
    "sapiens2": 100.0,
    "lfm3_vl_vision": 1e6,
    "gemma4_vision": 100.0,
}


def _as_dict(config: Any, label: str) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    raise ConfigError(f"{label}: expected a transformers config or a dict, got {type(config).__name__}")


def _vision_part(config: Any) -> dict[str, Any]:
    """``config`` or the tower it wraps (``vision_config``, ``backbone_config``, ``thinker_config``)."""
    d = _as_dict(config, "vision_rope")
    for _ in range(3):
        if d.get("model_type") in VISION_ROPE:
            return d
        keys = ("vision_config", "backbone_config", "thinker_config")
        key = next((k for k in keys if d.get(k) is not None), None)
        if key is None:
            return d
        d = _as_dict(d[key], f"vision_rope: {key}")
    return d


def _refuse(model_type: object) -> ConfigError:
    from .architectures import MROPE_MODELS, PAIRING  # text tables: only for the message

    if model_type in ENCODER_STATUS:
        return ConfigError(f"vision_rope: model_type {model_type!r} is not built: {ENCODER_STATUS[model_type]}")
    if model_type in SEQUENCE_ROPE:
        return ConfigError(
            f"vision_rope: model_type {model_type!r} is a sequence encoder (its RoPE rotates audio frames, codec steps "
            "or patches of a series, one position each); build it with rotary.RoPE.from_hf_config(config)"
        )
    if model_type in PAIRING or model_type in MROPE_MODELS:
        return ConfigError(
            f"vision_rope: model_type {model_type!r} is a text decoder; build its RoPE with "
            "rotary.RoPE.from_hf_config(config) (or rotary.MRoPE.from_hf_config for multimodal RoPE)"
        )
    what = f"model_type {model_type!r}" if model_type else "a config without model_type"
    return ConfigError(
        f"vision_rope: {what} is not a vision encoder rotary builds; give a vision config (a VL model's "
        f"vision_config) of one of: {', '.join(sorted(VISION_ROPE))}"
    )


def _int(d: Mapping[str, Any], keys: Sequence[str], label: str) -> int:
    for key in keys:
        value = d.get(key)
        if value is not None:
            if not is_int(value) or value <= 0:
                raise ConfigError(f"{label}: {key} must be a positive int, got {value!r}")
            return int(value)
    raise ConfigError(f"{label}: the config has none of {', '.join(keys)}; the tower's RoPE depends on it")


def _head_dim(d: Mapping[str, Any], model_type: str, label: str) -> int:
    """``head_dim``, else the hidden width over the heads, as the model's rotary embedding reads them."""
    head_dim = d.get("head_dim")
    if head_dim is not None:
        return _int(d, ("head_dim",), label)
    width = _int(d, (_WIDTH.get(model_type, "hidden_size"),), label)
    heads = _int(d, ("num_attention_heads", "num_heads"), label)
    return width // heads


def _theta(d: Mapping[str, Any], form: str, label: str) -> float:
    params = d.get("rope_parameters") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{label}: rope_parameters must be a dict, got {params!r:.80}")
    want = _ROPE_TYPE.get(form, "axial")
    rope_type = params.get("rope_type", want)
    if rope_type != want:
        raise ConfigError(
            f"{label}: rope_type {rope_type!r}, but this vision tower builds its RoPE with rope_type {want!r} only "
            f"(as transformers does); set rope_parameters['rope_type'] = {want!r}"
        )
    theta = params.get("rope_theta", d.get("rope_theta", _DEFAULT_THETA.get(d.get("model_type"), 10000.0)))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ConfigError(f"{label}: rope_theta must be a positive number, got {theta!r}")
    return float(theta)


def _feat_grid(d: Mapping[str, Any], key: str, default: list[int], label: str) -> tuple[int, int]:
    """A SAM 2-style ``[w, h]`` config key as ``(h, w)``."""
    sizes = d.get(key, default)
    if not (isinstance(sizes, Sequence) and len(sizes) == 2 and all(is_int(n) and n > 0 for n in sizes)):
        raise ConfigError(f"{label}: {key} must be two positive ints [w, h], got {sizes!r:.60}")
    return int(sizes[1]), int(sizes[0])


def _memory_head_dim(d: Mapping[str, Any], label: str) -> int:
    """SAM 2 video's memory attention: ``memory_attention_hidden_size / (downsample_rate * heads)``."""
    width = _int(d, ("memory_attention_hidden_size",), label)
    rate = _int(d, ("memory_attention_downsample_rate",), label)
    heads = _int(d, ("memory_attention_num_attention_heads",), label)
    return width // (rate * heads)


def _even_quarters(head_dim: int, label: str) -> None:
    if head_dim % 4:
        raise ConfigError(
            f"{label}: head_dim {head_dim} is not a multiple of 4: a 2-D axial RoPE gives each axis head_dim/2 "
            "channels of pairs, as the model's rotary embedding needs"
        )


def vision_rope(config: Any) -> VisionRoPE:
    """The RoPE a Hugging Face vision encoder applies, built from its config.

    ``config``: a transformers vision config (or its ``to_dict()``), or a multimodal config whose ``vision_config``
    is one; its ``model_type`` must be in :data:`VISION_ROPE`. Returns :class:`VisionRoPE` in eval mode (``.train()``
    turns on a DINOv3 config's coordinate augmentation). Raises ``rotary.errors.ConfigError`` for a text model (use
    :meth:`rotary.RoPE.from_hf_config`), an encoder not built (saying why: :data:`ENCODER_STATUS`), or keys the
    tower cannot run with.

    Example:
        >>> rope = rotary.hf.vision_rope({"model_type": "qwen2_vl_vision", "embed_dim": 64, "num_heads": 4})
        >>> rope.tables([[1, 4, 6], [2, 2, 2]]).cos.shape  # an image of 4 x 6 patches, a video of 2 frames
        torch.Size([32, 16])
    """
    d = _vision_part(config)
    model_type = d.get("model_type")
    if model_type not in VISION_ROPE:
        raise _refuse(model_type)
    d = {**CONFIG_DEFAULTS.get(model_type, {}), **{k: v for k, v in d.items() if v is not None}}
    form = VISION_ROPE[model_type]
    label = f"vision_rope({model_type})"
    memory_form = form in ("sam2_memory", "edgetam_memory")
    head_dim = _memory_head_dim(d, label) if memory_form else _head_dim(d, model_type, label)
    theta = _theta(d, form, label)
    merge, window, temporal = 1, None, False
    if model_type in _MERGE_PER_CALL:
        merge = None
    elif form in _MERGING:
        if model_type not in _MERGE_ONE:
            merge = _int(d, ("spatial_merge_size",), label)
    if form == "minimax":
        channels = 2 * ((head_dim // 3) // 2)  # per axis, as the model's rotary embedding
        if channels == 0:
            raise ConfigError(f"{label}: head_dim {head_dim} is too small for three axes of channel pairs")
        rope = AxialRoPE(head_dim, axes=3, rotary_dim=3 * channels, base=theta)
        temporal = True
    elif form == "llama4":
        _even_quarters(head_dim, label)
        rope = AxialRoPE.preset("llama4_vision", head_dim, base=theta)
    elif form == "pixtral":
        _even_quarters(head_dim, label)
        rope = AxialRoPE.preset("pixtral", head_dim, base=theta)
    elif form == "dinov3":
        _even_quarters(head_dim, label)
        registers = d.get("num_register_tokens", 0) or 0
        if not is_int(registers) or registers < 0:
            raise ConfigError(f"{label}: num_register_tokens must be an int >= 0, got {registers!r}")
        augment = {
            name: d.get(key)
            for name, key in (
                ("shift_coords", "pos_embed_shift"),
                ("jitter_coords", "pos_embed_jitter"),
                ("rescale_coords", "pos_embed_rescale"),
            )
        }
        rope = AxialRoPE.preset("dinov3", head_dim, base=theta, prefix_tokens=1 + int(registers), **augment)
    elif form == "gemma4":  # each half of the head is a 1-D RoPE of one axis, with Qwen-VL's frequencies
        _even_quarters(head_dim, label)
        rope = AxialRoPE(head_dim, axes=2, base=theta)
    elif form == "step3p5":  # Qwen-VL's frequencies and pairing, w's block first
        _even_quarters(head_dim, label)
        rope = AxialRoPE(head_dim, axes=2, base=theta, block_order=(1, 0))
    elif memory_form:  # the memory attention's: pairs (2i, 2i+1), w's block first, one fixed grid
        _even_quarters(head_dim, label)
        rope = AxialRoPE(head_dim, axes=2, base=theta, interleaved=True, block_order=(1, 0))
    elif form == "muse":  # Qwen-VL's frequencies and pairing, w's block first, at (row + 1, col + 1)
        _even_quarters(head_dim, label)
        rope = AxialRoPE(head_dim, axes=2, base=theta, block_order=(1, 0))
        window = _int(d, ("pos_emb_height",), label)  # its attention windows, in patches (no merge before them)
    elif form == "inkling2":  # Qwen-VL's frequencies, pairs (2i, 2i+1), w's block first
        _even_quarters(head_dim, label)
        rope = AxialRoPE(head_dim, axes=2, base=theta, interleaved=True, block_order=(1, 0))
    elif form == "loftr":
        rope = _loftr(d, head_dim, theta, label)
    elif form == "sam3":
        _even_quarters(head_dim, label)
        rope = AxialRoPE(head_dim, axes=2, base=theta, interleaved=True, block_order=(1, 0))
        window = _int(d, ("window_size",), label)
    else:
        _even_quarters(head_dim, label)
        kimi = form == "kimi"
        rope = AxialRoPE(
            head_dim,
            axes=2,
            base=theta,
            axis_slots="alternating" if kimi else "blocks",
            block_order=(1, 0) if kimi else None,
        )
        if form == "qwen_vl_window":
            size, patch = _int(d, ("window_size",), label), _int(d, ("patch_size",), label)
            if size // merge // patch < 1:
                raise ConfigError(
                    f"{label}: window_size {size} holds no {merge} x {merge} block of {patch}-pixel patches; "
                    f"window_size must be at least spatial_merge_size * patch_size = {merge * patch}"
                )
            window = size // merge // patch
    fixed, keys = None, None
    if memory_form:  # memory_attention_rope_feat_sizes is (w, h); so are EdgeTAM's key sizes
        fixed = _feat_grid(d, "memory_attention_rope_feat_sizes", [64, 64], label)
        keys = (fixed, 0)  # SAM 2: the keys of a memory frame are the queries' grid
        if form == "edgetam_memory":  # its perceiver's latents: the 1-D ones unrotated, then the 2-D grid
            keys = (
                _feat_grid(d, "memory_attention_rope_k_sizes", [16, 16], label),
                _int(d, ("perceiver_resampler_num_latents",), label),
            )
    if form in ("llama4", "sam3"):
        image, patch = d.get("image_size"), d.get("patch_size")
        if not (is_int(image) and is_int(patch) and 0 < patch <= image):
            raise ConfigError(f"{label}: image_size and patch_size must be ints with patch_size <= image_size")
        fixed = (image // patch, image // patch)
    if form == "loftr":  # the aggregation of the coarse feature map before the attention: (kernel, stride)
        window = (_int(d, ("q_aggregation_kernel_size",), label), _int(d, ("q_aggregation_stride",), label))
    producer = VisionRoPE(
        model_type, form, rope, merge_size=merge, window=window, temporal=temporal, fixed_grid=fixed, memory_keys=keys
    )
    return producer.eval()  # as a loaded model: DINOv3's coordinate augmentation only after .train()


def _loftr(d: Mapping[str, Any], head_dim: int, theta: float, label: str) -> AxialRoPE:
    """EfficientLoFTR's RoPE: one 2-D axial RoPE over the whole hidden width (docs/vision.md, ``loftr``)."""
    hidden = _int(d, ("hidden_size",), label)
    params = d.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", d.get("partial_rotary_factor", 4.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or int(head_dim * factor) * 2 != hidden:
        raise ConfigError(
            f"{label}: head_dim {head_dim} x partial_rotary_factor {factor!r} must be "
            f"hidden_size / 2 = {hidden / 2:g}: "
            "its rotary embedding lays hidden_size / 4 frequencies per axis over the whole hidden width (the "
            "model cannot form its tables otherwise)"
        )
    if hidden % 4:
        raise ConfigError(f"{label}: hidden_size {hidden} is not a multiple of 4 (two axes of channel pairs)")
    return AxialRoPE(hidden, axes=2, base=theta, interleaved=True, axis_slots="alternating")


# ------------------------------------------------------------------------------------------------
# the producer


class VisionRoPE(nn.Module):
    """The RoPE of one vision tower, made by :func:`vision_rope`: an AxialRoPE and its tokens' order.

    ``.rope`` is the :class:`~rotary.variants.AxialRoPE`; what ``grid`` is for each :attr:`form`: docs/vision.md.

    Example:
        >>> rope = rotary.hf.vision_rope({"model_type": "kimi_k25_vision", "hidden_size": 64, "num_attention_heads": 4})
        >>> rope.positions([[1, 2, 3]]).values.tolist()[:4]
        [[0.0, 0.0], [0.0, 1.0], [0.0, 2.0], [1.0, 0.0]]
    """

    def __init__(
        self,
        model_type: str,
        form: str,
        rope: AxialRoPE,
        *,
        merge_size: int | None = 1,
        window: int | None = None,
        temporal: bool = False,
        fixed_grid: tuple[int, int] | None = None,
        memory_keys: tuple[tuple[int, int], int] | None = None,
    ) -> None:
        super().__init__()
        self.model_type, self.form, self.rope = model_type, form, rope
        self.merge_size, self.window, self.temporal, self.fixed_grid = merge_size, window, temporal, fixed_grid
        #: the memory attentions': the (h, w) grid of a memory frame's keys, and the unrotated tokens before it
        self.memory_keys = memory_keys

    def extra_repr(self) -> str:
        return f"model_type={self.model_type!r}, form={self.form!r}, merge_size={self.merge_size}, window={self.window}"

    # grids ------------------------------------------------------------------------------------------
    def _merges(self, merge_sizes: Any, rows: int) -> list[int]:
        if self.merge_size is not None:
            if merge_sizes is not None:
                raise InputError(
                    f"merge_sizes= is for towers that merge each image by its own size (VideoLLaMA3); "
                    f"{self.model_type} merges {self.merge_size} x {self.merge_size} blocks (its config)"
                )
            return [self.merge_size] * rows
        if isinstance(merge_sizes, torch.Tensor):
            merge_sizes = merge_sizes.tolist()
        if (
            not isinstance(merge_sizes, Sequence)
            or len(merge_sizes) != rows
            or not all(is_int(m) and m > 0 for m in merge_sizes)
        ):
            raise InputError(
                f"{self.model_type} merges each image or video by its own size: give merge_sizes= with one positive "
                f"int per grid row ({rows}), as the model's merge_sizes; got {merge_sizes!r:.60}"
            )
        return [int(m) for m in merge_sizes]

    def _rows(self, grid: Any, merge_sizes: Any = None, *, in_blocks: bool = False) -> list[tuple[int, int, int, int]]:
        """``(t, h, w, merge)`` per grid row in patches (``in_blocks``: rows count merged tokens, as Inkling2's)."""
        if isinstance(grid, torch.Tensor):
            if grid.dtype.is_floating_point or grid.dtype == torch.bool or grid.dim() not in (1, 2):
                raise InputError(
                    f"grid must be integer rows (t, h, w) or (h, w), got a {grid.dtype} tensor {tuple(grid.shape)}"
                )
            grid = grid.tolist()
        if isinstance(grid, (str, bytes)) or not isinstance(grid, Sequence) or not len(grid):
            raise InputError(
                f"grid must be rows (t, h, w) or (h, w) of patches, one per image or video; got {grid!r:.80}"
            )
        if all(is_int(v) for v in grid):
            grid = [grid]  # one row
        rows = []
        for i, row in enumerate(grid):
            if isinstance(row, torch.Tensor):
                row = row.tolist()
            if not isinstance(row, Sequence) or len(row) not in (2, 3) or not all(is_int(v) and v > 0 for v in row):
                raise InputError(f"grid[{i}] = {row!r:.60}: give (t, h, w) or (h, w) as positive ints (patches)")
            rows.append((1, *row) if len(row) == 2 else tuple(row))
        merges = self._merges(merge_sizes, len(rows))
        if in_blocks:
            rows = [(t, h * m, w * m) for (t, h, w), m in zip(rows, merges)]
        for i, ((t, h, w), m) in enumerate(zip(rows, merges)):
            if h % m or w % m:
                raise InputError(
                    f"grid[{i}] = {(t, h, w)}: h and w must be multiples of the spatial merge size {m} (the tower "
                    f"merges {m} x {m} patches), got h={h}, w={w}"
                )
        return [(int(t), int(h), int(w), m) for (t, h, w), m in zip(rows, merges)]

    def _image(self, grid: Any) -> tuple[int, int]:
        if grid is None:
            if self.fixed_grid is None:
                raise InputError(f"{self.model_type}: give grid=(h, w), the patches of the image")
            return self.fixed_grid
        rows = self._rows(grid)
        if len(rows) != 1 or rows[0][0] != 1:
            raise InputError(f"{self.model_type} takes one image grid (h, w) per call, got {grid!r:.80}")
        h, w = rows[0][1:3]
        if (self.form == "llama4" or self.memory_keys is not None) and (h, w) != self.fixed_grid:
            raise InputError(
                f"{self.model_type} rotates the fixed grid of its "
                f"{'image_size / patch_size' if self.memory_keys is None else 'memory_attention_rope_feat_sizes'} "
                f"= {self.fixed_grid}; got {(h, w)}"
            )
        return h, w

    def positions(
        self,
        grid: Any = None,
        *,
        prefix: int | None = None,
        merge_sizes: Any = None,
        memory_frames: int | None = None,
        object_pointers: int = 0,
    ) -> Coordinates:
        """The coordinates of the tower's tokens in the model's order, :class:`~rotary.variants.Coordinates` ``[N, A]``.

        Args:
            grid: ``grid_thw`` rows or one ``(h, w)``, per form (docs/vision.md).
            prefix: ``dinov3`` only: unrotated tokens before the patches (default 1 + registers).
            merge_sizes: VideoLLaMA3 only: the merge size of each grid row (the model's ``merge_sizes``).
            memory_frames, object_pointers: ``sam2_memory`` and ``edgetam_memory`` only: the cross-attention's keys,
                this many memory frames, then this many unrotated object-pointer tokens.
        """
        if merge_sizes is not None and self.form not in _MERGING:
            raise InputError(f"merge_sizes= is for towers that merge patches; {self.model_type} does not")
        if prefix is not None and self.form != "dinov3":
            raise InputError(f"prefix= is for DINOv3-style towers; {self.model_type} has no unrotated prefix tokens")
        if (memory_frames is not None or object_pointers) and self.memory_keys is None:
            raise InputError(
                f"memory_frames= and object_pointers= are for SAM 2 video's memory attention, not {self.model_type}"
            )
        if self.memory_keys is not None:
            return self._memory(grid, memory_frames, object_pointers)
        if self.form == "dinov3":
            return self.rope.grid(*self._image(grid), prefix=prefix)
        if self.form == "llama4":
            return self.rope.grid(*self._image(grid))
        if self.form == "loftr":  # the aggregated coarse map, row by row, from (1, 1)
            (h, w), (kernel, stride) = self._image(grid), self.window
            if h < kernel or w < kernel:
                raise InputError(
                    f"{self.model_type}: the coarse feature map {(h, w)} is smaller than its aggregation kernel "
                    f"{kernel} (q_aggregation_kernel_size); give a map of at least {kernel} x {kernel}"
                )
            ys, xs = torch.meshgrid(
                torch.arange((h - kernel) // stride + 1), torch.arange((w - kernel) // stride + 1), indexing="ij"
            )
            return self.rope.coordinates(torch.stack([ys.flatten(), xs.flatten()], dim=-1) + 1)
        if self.form == "step3p5":  # row by row at (h, w)
            h, w = self._image(grid)
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            return self.rope.coordinates(torch.stack([ys.flatten(), xs.flatten()], dim=-1))
        if self.form == "gemma4":
            h, w = self._image(grid)
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            return self.rope.coordinates(torch.stack([xs.flatten(), ys.flatten()], dim=-1))
        if self.form == "sam3":
            h, w = self._image(grid)
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            scale = self.window / w  # transformers scales both axes by the width's factor
            values = torch.stack([ys.flatten(), xs.flatten()], dim=-1).to(torch.float64) * scale
            return self.rope.coordinates(values)
        if self.form == "inkling2":  # per image: its class token at (0, 0), then its patches from (1, 1)
            images = [
                torch.cat([torch.zeros(1, 2, dtype=torch.long), _block_major(h, w, m).repeat(t, 1) + 1])
                for t, h, w, m in self._rows(grid, merge_sizes, in_blocks=True)
            ]
            return self.rope.coordinates(torch.cat(images))
        parts, blocks = [], 0
        for t, h, w, m in self._rows(grid, merge_sizes):
            frame = _block_major(h, w, m)  # [h w, 2]
            if self.temporal:
                ts = torch.arange(t).repeat_interleave(h * w)
                coords = torch.cat([ts[:, None], frame.repeat(t, 1)], dim=-1)
            else:
                coords = frame.repeat(t, 1)
            if self.window is not None:
                order = _window_order(t, h // m, w // m, self.window) + blocks
                parts.append((coords, order))
            else:
                parts.append((coords, None))
            blocks += t * (h // m) * (w // m)
        values = torch.cat([c for c, _ in parts])
        if self.window is not None:  # whole m x m blocks move into their windows (one m: the config's)
            m = self.merge_size
            order = torch.cat([o for _, o in parts])
            values = values.reshape(blocks, m * m, -1)[order].reshape(values.shape)
        if self.form == "muse":  # its patches count from (1, 1)
            values = values + 1
        return self.rope.coordinates(values)

    def _memory(self, grid: Any, frames: int | None, pointers: int) -> Coordinates:
        """A memory attention's queries (its grid); its keys (``frames`` frames, then ``pointers`` unrotated tokens)."""
        h, w = self._image(grid)
        if frames is None:
            if pointers:
                raise InputError("object_pointers= follow the memory frames of the keys: give memory_frames= too")
            return self.rope.coordinates(_row_major(h, w))
        if not is_int(frames) or frames < 1 or not is_int(pointers) or pointers < 0:
            raise InputError(
                f"memory_frames must be an int >= 1 and object_pointers an int >= 0, got {frames!r} and {pointers!r}"
            )
        (kh, kw), latents = self.memory_keys
        frame = torch.cat([torch.zeros(latents, 2, dtype=torch.long), _row_major(kh, kw)])
        values = torch.cat([frame.repeat(frames, 1), frame.new_zeros(pointers, 2)])
        rotated = torch.cat(
            [torch.arange(latents + kh * kw) >= latents] * frames + [torch.zeros(pointers, dtype=torch.bool)]
        )
        return self.rope.coordinates(values, identity=~rotated)

    def tables(
        self,
        grid: Any = None,
        *,
        prefix: int | None = None,
        merge_sizes: Any = None,
        memory_frames: int | None = None,
        object_pointers: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> RotaryTables | tuple[RotaryTables, RotaryTables]:
        """The tables ``[N, r]`` the tower's attention applies to its tokens (arguments as :meth:`positions`).

        Identity rows for class and register tokens; apply them to q and k ``[..., N, H, D]`` or ``[..., H, N, D]`` with
        :func:`rotary.rotate`. ``gemma4``: a pair of tables ``[N, D/2]`` (half pairing), x's for ``q[..., :D/2]`` and
        y's for ``q[..., D/2:]`` (docs/vision.md).
        """
        positions = self.positions(
            grid, prefix=prefix, merge_sizes=merge_sizes, memory_frames=memory_frames, object_pointers=object_pointers
        )
        tables = self.rope.tables(positions, dtype=dtype)
        if self.form != "gemma4":
            return tables
        quarter = tables.cos.shape[-1] // 4
        return tuple(
            RotaryTables.from_tensors(
                torch.cat([cos[:, a * quarter : (a + 1) * quarter]] * 2, dim=-1),
                torch.cat([sin[:, a * quarter : (a + 1) * quarter]] * 2, dim=-1),
                interleaved=False,
                validate=False,
            )
            for cos, sin in [(tables.cos, tables.sin)]
            for a in (0, 1)
        )


def _row_major(h: int, w: int) -> torch.Tensor:
    """``(row, col)`` ``[h w, 2]`` of an ``h x w`` grid, row by row."""
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([ys.flatten(), xs.flatten()], dim=-1)


def _block_major(h: int, w: int, m: int) -> torch.Tensor:
    """``(row, col)`` ``[h w, 2]`` of an ``h x w`` grid of patches read in ``m x m`` blocks, block by block."""
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    # [h/m, m, w/m, m] -> [h/m, w/m, m, m]
    ys = ys.reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
    xs = xs.reshape(h // m, m, w // m, m).transpose(1, 2).flatten()
    return torch.stack([ys, xs], dim=-1)


def _window_order(t: int, h: int, w: int, window: int) -> torch.Tensor:
    """The merged blocks of a ``t x h x w`` grid (in blocks) read window by window, as Qwen2.5-VL's tower."""
    index = torch.arange(t * h * w).reshape(t, h, w)
    pad_h, pad_w = -h % window, -w % window
    index = torch.nn.functional.pad(index, (0, pad_w, 0, pad_h), value=-1)
    nh, nw = (h + pad_h) // window, (w + pad_w) // window
    index = index.reshape(t, nh, window, nw, window).permute(0, 1, 3, 2, 4).reshape(-1)
    return index[index >= 0]
