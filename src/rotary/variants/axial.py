"""Axial RoPE for images and video: each channel pair turns with one axis (R(h, w) = R_h ⊕ R_w).

    coordinates [..., A] ──► CoordinateRoPE.tables ──► RotaryTables ──► rotary.rotate (fused kernels)

Pair ``j`` of a token at ``c`` turns by ``Σ_a c_a · inv_freq[a, j]``, one axis per pair, so scores depend only on
the offsets per axis. :data:`PRESETS` reproduces the published conventions exactly (docs/variants.md,
"Presets"); what axial RoPE shares with RoPE-Mixed is :class:`~rotary.variants.coordinate_rope.CoordinateRoPE`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .._checks import check_choice, check_positive_float, check_positive_int, is_int
from ..errors import InputError, InputTypeError
from ..rope_types import default_inv_freq
from ..rotation import rotate
from .coordinate_rope import CoordinateRoPE
from .coordinates import Coordinates

__all__ = ["AxialRoPE", "Coordinates", "CoordinateRoPE", "PRESETS", "relative_scores"]


# ------------------------------------------------------------------------------------------------
# axial RoPE


def _geometric(base: float, channels: int, dtype: torch.dtype) -> torch.Tensor:
    """``1 / base ** (arange(0, channels, 2) / channels)``: fp32 as Hugging Face / torchtune, or float64 (FLUX)."""
    if dtype == torch.float32:
        return default_inv_freq(base, channels)
    exponent = torch.arange(0, channels, 2, dtype=torch.int64, device="cpu").to(torch.float64) / channels
    return 1.0 / (base**exponent)


class AxialRoPE(CoordinateRoPE):
    """Axial RoPE over ``A`` axes: each channel pair turns with one axis (vision, video); see the module docstring.

    Args:
        head_dim, axes: ``D`` (even); coordinates per token ``A`` (2: images (y, x), 3: video (t, y, x)).
        split: channels per axis, in axis order (each even, summing to ``rotary_dim``); default equal blocks.
        base, max_freq: geometric ``base^(-2k/c)`` per block of ``c`` channels, or with ``max_freq`` linear
            ``linspace(1, max_freq / 2, c / 2) · π`` (rotary-embedding-torch's "pixel", coordinates in [-1, 1]);
            formed in ``frequency_dtype`` as ``1 / base ** (arange(0, c, 2) / c)`` (fp32: Hugging Face's, bit for
            bit) and ``linspace(..., dtype=frequency_dtype) * π``, then in float64 times ``frequency_scale``.
        frequencies: ``"per_axis"`` or ``"alternating"`` (Pixtral: one set, ``c = rotary_dim`` above, axis ``a`` takes
            ``[a::A]``; equal blocks). Axis ``a``'s pairs lie in its frequencies' order within its block.
        block_order: the order of the axes' blocks among the pairs; default ``(0, 1, …)`` (torchtune: ``(1, 0)``).
        axis_slots: ``"blocks"`` or ``"alternating"`` (pair ``A·j + i`` is frequency ``j`` of axis ``block_order[i]``,
            Kimi-K2.5's; equal blocks only).
        frequency_scale, frequency_dtype: multiplies every frequency (DINOv3: 2π); their precision (fp32 or fp64).
        interleaved, rotary_dim, coordinates, **kwargs: as :class:`CoordinateRoPE` (conventions, identity tokens,
            augmentation).

    Raises:
        rotary.errors.InputError: a ``split`` that is odd, lacks an axis or does not sum to ``rotary_dim``, a
            ``block_order`` that is not a permutation, a bad ``frequency_dtype``.

    Example:
        >>> rope = AxialRoPE(64, axes=2, base=100.0)
        >>> q = k = torch.randn(1, 4, 12, 64)          # [B, H, S, D]: a 3 x 4 grid of patches
        >>> q_rot, k_rot = rope(q, k, rope.grid(3, 4))
        >>> q_rot.shape, rope.slot_axes[:2], rope.slot_axes[-2:]
        (torch.Size([1, 4, 12, 64]), [0, 0], [1, 1])
    """

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        axes: int = 2,
        *,
        split: Sequence[int] | None = None,
        base: float = 10000.0,
        coordinates: Literal["grid", "normalized"] = "grid",
        max_freq: float | None = None,
        interleaved: bool = False,
        rotary_dim: int | None = None,
        frequencies: Literal["per_axis", "alternating"] = "per_axis",
        block_order: Sequence[int] | None = None,
        axis_slots: Literal["blocks", "alternating"] = "blocks",
        frequency_scale: float = 1.0,
        frequency_dtype: torch.dtype = torch.float32,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            head_dim, axes, rotary_dim=rotary_dim, interleaved=interleaved, coordinates=coordinates, **kwargs
        )
        a = self.axes
        self.split = self._check_split(split)
        self.base = check_positive_float(base, "base")
        self.max_freq = None if max_freq is None else check_positive_float(max_freq, "max_freq")
        self.frequency_kind = check_choice(frequencies, "frequencies", ("per_axis", "alternating"))
        if frequencies == "alternating" and (len(set(self.split)) != 1 or max_freq is not None):
            raise InputError(
                f"frequencies='alternating' deals one geometric set to equal blocks; got split={self.split}"
                + (f" and max_freq={max_freq}" if max_freq is not None else "")
            )
        if block_order is not None and (isinstance(block_order, (str, bytes)) or not isinstance(block_order, Sequence)):
            raise InputError(
                f"block_order must be a permutation of the axes {tuple(range(a))}, got {block_order!r:.80}"
            )
        order = tuple(range(a)) if block_order is None else tuple(block_order)
        if not all(is_int(i) for i in order) or sorted(int(i) for i in order) != list(range(a)):
            raise InputError(f"block_order must be a permutation of the axes {tuple(range(a))}, got {block_order!r}")
        self.block_order = tuple(int(i) for i in order)
        self.axis_slots = check_choice(axis_slots, "axis_slots", ("blocks", "alternating"))
        if axis_slots == "alternating" and len(set(self.split)) != 1:
            raise InputError(
                f"axis_slots='alternating' deals the pairs to the axes in turn, so every axis needs as many "
                f"channels; got split={self.split}"
            )
        self.frequency_scale = check_positive_float(frequency_scale, "frequency_scale")
        if frequency_dtype not in (torch.float32, torch.float64):
            raise InputTypeError(f"frequency_dtype must be torch.float32 or torch.float64, got {frequency_dtype}")
        self.frequency_dtype = frequency_dtype
        if self.max_freq is not None and self.max_freq / 2 > torch.finfo(frequency_dtype).max:
            raise InputError(
                f"max_freq={max_freq:g} puts the frequencies linspace(1, max_freq / 2) · π past {frequency_dtype}'s "
                "range; use a smaller max_freq (or frequency_dtype=torch.float64)"
            )
        # the exact frequencies on the host; the buffer mirrors them on the module's device
        self._exact_inv_freq = self._build_inv_freq()
        self._check_frequencies()
        self.register_buffer("inv_freq", self._exact_inv_freq.clone(), persistent=False)

    def _check_split(self, split: Sequence[int] | None) -> tuple[int, ...]:
        r, a = self.rotary_dim, self.axes
        if split is None:
            if r % (2 * a):
                raise InputError(
                    f"rotary_dim={r} does not split into {a} equal blocks of an even number of channels; "
                    f"pass split=(...) with {a} even numbers summing to {r}"
                )
            return (r // a,) * a
        if isinstance(split, (str, bytes)) or not isinstance(split, Sequence):
            raise InputError(
                f"split must be {a} even channel counts (one per axis) summing to rotary_dim={r}, got {split!r:.80}"
            )
        split = tuple(split)
        if len(split) != a:
            raise InputError(f"split gives {len(split)} blocks but axes={a}: give one channel count per axis")
        for i, c in enumerate(split):
            if isinstance(c, bool) or not isinstance(c, int) or c <= 0 or c % 2:
                raise InputError(
                    f"split[{i}]={c!r}: each axis needs a positive even number of channels (they rotate in pairs)"
                )
        if sum(split) != r:
            raise InputError(
                f"split={split} adds up to {sum(split)} channels but rotary_dim={r}; make the blocks sum to {r}"
            )
        return split

    def _build_inv_freq(self) -> torch.Tensor:
        r, a = self.rotary_dim, self.axes
        per_axis = []
        for axis, c in enumerate(self.split):
            if self.frequency_kind == "alternating":
                f = _geometric(self.base, r, self.frequency_dtype)[axis::a]
            elif self.max_freq is not None:
                f = torch.linspace(1.0, self.max_freq / 2, c // 2, dtype=self.frequency_dtype, device="cpu") * math.pi
            else:
                f = _geometric(self.base, c, self.frequency_dtype)
            per_axis.append(f.to(torch.float64) * self.frequency_scale)
        inv_freq = torch.zeros(a, r // 2, dtype=torch.float64, device="cpu")
        if self.axis_slots == "alternating":
            for i, axis in enumerate(self.block_order):
                inv_freq[axis, i::a] = per_axis[axis]
            return inv_freq
        start = 0
        for axis in self.block_order:
            n = self.split[axis] // 2
            inv_freq[axis, start : start + n] = per_axis[axis]
            start += n
        return inv_freq

    def _check_frequencies(self) -> None:
        """Every pair must turn at a finite, nonzero rate (fp32: not for a huge base or max_freq)."""
        per_pair = self._exact_inv_freq.sum(0)
        bad = ~(torch.isfinite(per_pair) & (per_pair > 0))
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            raise InputError(
                f"pair {j}'s frequency is {float(per_pair[j])!r} (base={self.base:g}, max_freq={self.max_freq}, "
                f"frequency_scale={self.frequency_scale:g}, frequency_dtype={self.frequency_dtype}): the frequencies "
                "must be finite and > 0; use a smaller base, max_freq or frequency_scale (or "
                "frequency_dtype=torch.float64)"
            )

    def frequencies(self) -> torch.Tensor:
        """``inv_freq`` ``[A, r/2]`` (float64): row ``a`` holds the frequencies of axis ``a``'s pairs, 0 elsewhere."""
        return self.inv_freq

    @property
    def slot_axes(self) -> list[int]:
        """The axis each pair (frequency slot) belongs to, ``[r/2]``."""
        return self._exact_inv_freq.ne(0).to(torch.int64).argmax(0).tolist()

    @property
    def wavelengths(self) -> torch.Tensor:
        """``2π / frequency`` of each pair along its axis, float64 ``[r/2]``, in coordinate units.

        Example:
            >>> [round(w, 4) for w in AxialRoPE.preset("dinov3", 64).wavelengths[:3].tolist()]  # DINOv3's periods
            [1.0, 1.3335, 1.7783]
        """
        return (2 * math.pi) / self._exact_inv_freq.sum(0)

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # .to(bfloat16) casts every floating buffer; frequencies stay exact (also after to_empty()).
        super()._apply(fn, recurse)
        self.inv_freq = self._exact_inv_freq.to(self.inv_freq.device)
        return self

    def extra_repr(self) -> str:
        kind = "pixel" if self.max_freq is not None else self.frequency_kind
        return (
            f"head_dim={self.head_dim}, axes={self.axes}, split={self.split}, base={self.base:g}, frequencies={kind}, "
            f"coordinates={self.coordinate_kind!r}, interleaved={self.interleaved}"
        )

    @classmethod
    def preset(cls, name: str, head_dim: int | None = None, **overrides: Any) -> AxialRoPE:
        """The axial RoPE of a published model, exactly (:data:`PRESETS`, docs/variants.md "Presets").

        ``name``: ``"torchtune"``, ``"llama4_vision"``, ``"pixtral"``, ``"dinov3"``, ``"eva02"``, ``"flux"`` or
        ``"cogvideox"``; ``head_dim`` defaults to the model's (FLUX needs 128); ``overrides`` are :class:`AxialRoPE`
        keywords (``prefix_tokens=5`` for DINOv3 with four registers, ``reference_grid=16`` for EVA-02).

        Example:
            >>> rope = AxialRoPE.preset("pixtral", 64)
            >>> rope.interleaved, rope.slot_axes[15], rope.slot_axes[16]
            (False, 0, 1)
        """
        if not isinstance(name, str) or name not in PRESETS:
            raise InputError(f"unknown axial preset {name!r}; presets: {', '.join(PRESETS)}")
        preset = PRESETS[name]
        head_dim = preset.head_dim if head_dim is None else head_dim
        kwargs = {**preset.kwargs(head_dim), **overrides}
        return cls(head_dim, **kwargs)


# ------------------------------------------------------------------------------------------------
# presets


@dataclass(frozen=True)
class Preset:
    """A published axial-RoPE convention: :class:`AxialRoPE` keywords for a head_dim, and what they mean."""

    name: str
    models: str
    head_dim: int
    conventions: Mapping[str, str]
    kwargs: Callable[[int], dict[str, Any]]


def _quarters(head_dim: int, name: str) -> None:
    if not isinstance(head_dim, int) or head_dim % 4:
        raise InputError(
            f"the {name} preset needs head_dim divisible by 4 (two axes of paired channels), got {head_dim!r}"
        )


def _torchtune(head_dim: int) -> dict[str, Any]:
    _quarters(head_dim, "torchtune")
    return dict(axes=2, base=10000.0, interleaved=True, block_order=(1, 0), grid_offset=1.0, suffix_tokens=1)


def _pixtral(head_dim: int) -> dict[str, Any]:
    _quarters(head_dim, "pixtral")
    return dict(axes=2, base=10000.0, frequencies="alternating")


def _dinov3(head_dim: int) -> dict[str, Any]:
    _quarters(head_dim, "dinov3")
    return dict(axes=2, base=100.0, coordinates="normalized", frequency_scale=2 * math.pi, prefix_tokens=1)


def _eva02(head_dim: int) -> dict[str, Any]:
    _quarters(head_dim, "eva02")
    return dict(axes=2, base=10000.0, interleaved=True, prefix_tokens=1)


def _flux(head_dim: int) -> dict[str, Any]:
    if head_dim != 128:
        raise InputError(f"the flux preset has axes of (16, 56, 56) channels: head_dim must be 128, got {head_dim}")
    return dict(axes=3, split=(16, 56, 56), base=10000.0, interleaved=True, frequency_dtype=torch.float64)


def _cogvideox(head_dim: int) -> dict[str, Any]:
    if not isinstance(head_dim, int) or head_dim % 16:
        raise InputError(
            "the cogvideox preset splits head_dim into D/4, 3D/8, 3D/8 even blocks: head_dim must be a "
            f"multiple of 16, got {head_dim!r}"
        )
    return dict(axes=3, split=(head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3), base=10000.0, interleaved=True)


#: name -> :class:`Preset`; :meth:`AxialRoPE.preset` builds them
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "torchtune",
            "torchtune's VisionRotaryPositionalEmbeddings (Llama 3.2 Vision-style encoders)",
            64,
            {
                "axes": "(y, x); x's block first",
                "channels": "D/2, D/2",
                "frequencies": "base^(-4k/D), base 10000",
                "coordinates": "grid + 1: angles (x+1)θ, (y+1)θ",
                "pairing": "interleaved",
                "identity": "CLS appended last",
            },
            _torchtune,
        ),
        Preset(
            "llama4_vision",
            "Llama 4 vision encoder (transformers Llama4VisionRotaryEmbedding)",
            88,
            {
                "axes": "(y, x); x's block first",
                "channels": "D/2, D/2",
                "frequencies": "base^(-4k/D), base 10000",
                "coordinates": "grid + 1",
                "pairing": "interleaved (complex)",
                "identity": "CLS appended last",
            },
            _torchtune,
        ),
        Preset(
            "pixtral",
            "Pixtral / Mistral vision encoders (transformers PixtralVisionRotaryEmbedding)",
            64,
            {
                "axes": "(h, w); h's block first",
                "channels": "D/2, D/2",
                "frequencies": "one set base^(-2j/D): h takes [::2], w [1::2]; base 10000",
                "coordinates": "grid",
                "pairing": "half",
                "identity": "none",
            },
            _pixtral,
        ),
        Preset(
            "dinov3",
            "DINOv3 ViTs (facebookresearch/dinov3 RopePositionEmbedding)",
            64,
            {
                "axes": "(h, w); h's block first",
                "channels": "D/2, D/2",
                "frequencies": "2π / periods, periods base^(4k/D), base 100",
                "coordinates": "cell centres in [-1, 1]; train-time shift / jitter / rescale",
                "pairing": "half",
                "identity": "CLS + registers first",
            },
            _dinov3,
        ),
        Preset(
            "eva02",
            "EVA-02 (baaivision/EVA VisionRotaryEmbeddingFast)",
            64,
            {
                "axes": "(h, w); h's block first",
                "channels": "D/2, D/2",
                "frequencies": "base^(-4k/D), base 10000",
                "coordinates": "grid · pretrain / finetune (reference_grid)",
                "pairing": "interleaved",
                "identity": "CLS first",
            },
            _eva02,
        ),
        Preset(
            "flux",
            "FLUX.1 (black-forest-labs/flux EmbedND)",
            128,
            {
                "axes": "(t, h, w)",
                "channels": "16, 56, 56",
                "frequencies": "base^(-2k/c) per axis, float64; base 10000",
                "coordinates": "grid (t = 0 for images)",
                "pairing": "interleaved",
                "identity": "text tokens (ids 0)",
            },
            _flux,
        ),
        Preset(
            "cogvideox",
            "CogVideoX (diffusers get_3d_rotary_pos_embed)",
            64,
            {
                "axes": "(t, h, w)",
                "channels": "D/4, 3D/8, 3D/8",
                "frequencies": "base^(-2k/c) per axis, base 10000",
                "coordinates": "grid",
                "pairing": "interleaved",
                "identity": "text tokens first",
            },
            _cogvideox,
        ),
    )
}


# ------------------------------------------------------------------------------------------------
# scores against offsets (for figures and checks)


def relative_scores(rope: CoordinateRoPE, q: torch.Tensor, k: torch.Tensor, extent: int) -> torch.Tensor:
    """Scores ``⟨R(c) q, R(c + Δ) k⟩`` over offsets ``Δ = (Δh, Δw)`` in grid cells, ``|Δ| <= extent``, float64.

    The query sits at the centre of a ``(2 extent + 1)²`` grid from ``rope.grid`` (leading axes at one cell). ``rope``
    has at least 2 axes; ``q`` and ``k`` are ``[D]`` (``[H, D]`` for per-head tables). Returns
    ``[2 extent + 1, 2 extent + 1]`` (``[H, …]`` per head), ``[i, j]`` at ``Δ = (i, j) - extent``.

    Example:
        >>> s = relative_scores(AxialRoPE(16), torch.ones(16), torch.ones(16), 2)
        >>> s.shape, float(s[2, 2])  # no offset: the plain dot product
        (torch.Size([5, 5]), 16.0)
    """
    if rope.axes < 2:
        raise InputError(f"relative_scores needs at least 2 axes, got axes={rope.axes}")
    extent = check_positive_int(extent, "extent")
    n = 2 * extent + 1
    coords = rope.grid(*([1] * (rope.axes - 2)), n, n, prefix=0, suffix=0)
    heads = rope.heads or 1
    q, k = q.double().reshape(heads, rope.head_dim), k.double().reshape(heads, rope.head_dim)
    centre = extent * n + extent
    training = rope.training
    rope.eval()  # no coordinate augmentation: the figure of the trained convention
    try:
        with torch.no_grad():
            tables = rope.tables(coords, dtype=torch.float64)
    finally:
        rope.train(training)
    with torch.no_grad():
        qs = q[None, :, None, :].expand(1, heads, n * n, rope.head_dim)  # [1, H, S, D]
        ks = k[None, :, None, :].expand(1, heads, n * n, rope.head_dim)
        q_rot, k_rot = rotate([qs, ks], tables)
    scores = (q_rot[0, :, centre : centre + 1, :] * k_rot[0]).sum(-1)  # [H, S]
    scores = scores.reshape(heads, n, n)
    return scores if rope.heads else scores[0]
