"""Axial RoPE for images and video: each channel pair turns with one axis (R(h, w) = R_h ⊕ R_w).

    coordinates [..., A] ──► CoordinateRoPE.tables ──► RotaryTables ──► rotary.rotate (fused kernels)
    (grid(h, w[, t]),         (augment in train mode,
     or explicit, float        identity rows, angles
     or integer)               c · inv_freq[A, r/2])

A token at coordinates ``c = (c_0, …, c_{A-1})`` turns pair ``j`` by ``Σ_a c_a · inv_freq[a, j]``. In
axial RoPE each pair belongs to one axis (its column of ``inv_freq`` is zero elsewhere), so attention
scores depend only on the offsets ``(Δc_0, …, Δc_{A-1})``; RoPE-Mixed (:mod:`rotary.variants.mixed`)
fills the whole column, per head. Both are producers of :class:`~rotary.tables.RotaryTables`: the
rotation itself is the one fused kernel every RoPE runs on.

Published conventions differ in the coordinates (integer grid, +1 offsets, cell centres in
[-1, 1], a fine-tuning grid squeezed into the pre-training range), the channels given to each axis,
the frequencies, the order of the axes' blocks and the pairing; :data:`PRESETS` reproduces each
exactly (see ``docs/variants.md``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from .. import deferred
from .._checks import (
    check_bool,
    check_choice,
    check_finite,
    check_int,
    check_positive_float,
    check_positive_int,
    is_int,
)
from .._device_copies import DeviceCopies, version_of
from ..positions import Positions
from ..rope_types import default_inv_freq
from ..rotation import Layout, check_layout, rotate
from ..tables import RotaryTables, cos_sin_table, table_dtype

__all__ = ["AxialRoPE", "Coordinates", "CoordinateRoPE", "PRESETS", "relative_scores"]


# ------------------------------------------------------------------------------------------------
# coordinates: the positions of N-D tokens


@dataclass(frozen=True)
class Coordinates:
    """Validated coordinates of tokens on ``A`` axes, and which tokens take no rotation.

    Made by :meth:`CoordinateRoPE.grid` or :meth:`CoordinateRoPE.coordinates`; whatever holds one
    may trust it.

    Attributes:
        values: float64 ``[S, A]`` (shared by the batch) or ``[B, S, A]``; finite, any sign.
        identity: bool ``[S]`` or ``[B, S]``: ``True`` marks tokens whose rows are the identity (cos 1,
            sin 0): CLS, registers, text tokens beside an image. ``None``: every token rotates.

    Example:
        >>> c = AxialRoPE(8).grid(2, 2, prefix=1)
        >>> c.values.tolist(), c.identity.tolist()
        ([[0.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], [True, False, False, False, False])
    """

    values: torch.Tensor
    identity: torch.Tensor | None = None

    @property
    def axes(self) -> int:
        """Coordinates per token ``A``."""
        return self.values.shape[-1]

    @property
    def seq_len(self) -> int:
        """Tokens ``S``."""
        return self.values.shape[-2]

    @property
    def batch(self) -> int | None:
        """The batch size the coordinates are given for, or ``None`` when shared by the batch."""
        return self.values.shape[0] if self.values.dim() == 3 else None

    def to(self, device: torch.device | str) -> Coordinates:
        """The same coordinates on ``device``.

        The copy is kept: moving the same coordinates to the same device again (a grid from
        :meth:`CoordinateRoPE.grid` passed to every call) returns it without copying anything, as long
        as neither tensor was edited in place since. Coordinates that require grad are moved every time.
        """
        device = torch.device(device)
        if self.values.device == device:
            return self
        copies: dict = self.__dict__.get("_device_copies", {})
        found = copies.get(device)
        if torch.compiler.is_compiling():  # version counters are not traceable: a copy made eagerly is used
            if found is not None and not self.values.requires_grad:
                return found[1]
            return Coordinates(self.values.to(device), None if self.identity is None else self.identity.to(device))
        if self.values.requires_grad:
            return Coordinates(self.values.to(device), None if self.identity is None else self.identity.to(device))
        if found is not None and found[0] == self._version() and found[2] == found[1]._version():
            return found[1]  # neither these nor the copy were edited since
        with torch.inference_mode(False):  # kept: usable outside inference mode later
            moved = Coordinates(self.values.to(device), None if self.identity is None else self.identity.to(device))
        self.__dict__.setdefault("_device_copies", {})[device] = (self._version(), moved, moved._version())
        return moved

    def _version(self) -> tuple[int | None, int | None]:
        """The tensors' version counters (in-place edits move them)."""
        return version_of(self.values), None if self.identity is None else version_of(self.identity)


def _check_identity(identity: object, values: torch.Tensor, name: str) -> torch.Tensor | None:
    if identity is None:
        return None
    if not isinstance(identity, torch.Tensor) or identity.dtype != torch.bool:
        raise TypeError(f"identity must be a bool tensor [S] or [B, S] (True: no rotation), got {identity!r:.80}")
    token_shape = tuple(values.shape[:-1])
    if tuple(identity.shape) not in (token_shape, token_shape[-1:]):
        raise ValueError(
            f"identity has shape {tuple(identity.shape)} but the {name} are {tuple(values.shape)}: "
            f"give one flag per token, {list(token_shape[-1:])} or {list(token_shape)}"
        )
    return identity.to(values.device)


# ------------------------------------------------------------------------------------------------
# what AxialRoPE and RoPEMixed share: coordinates in, tables out

_NORMALIZE = ("separate", "max", "min")
#: how many grids :meth:`CoordinateRoPE.grid` keeps (per module) to hand out again
GRID_CACHE = 16


class CoordinateRoPE(nn.Module):
    """RoPE over N-D coordinates: grids, coordinate conventions, augmentation, identity rows, tables.

    Subclasses give the frequencies (:meth:`frequencies`): ``[A, r/2]`` (one row per axis, axial) or
    ``[H, A, r/2]`` (per head, RoPE-Mixed). The arguments below are keyword arguments of
    :class:`AxialRoPE` and :class:`~rotary.variants.RoPEMixed`.

    Args:
        head_dim: channels per head ``D`` (even).
        axes: coordinates per token ``A``.
        rotary_dim: channels rotated ``r`` (even, ``<= D``); the rest pass through.
        interleaved: pairs (2i, 2i+1) (``True``) or (i, i + r/2) (``False``).
        coordinates: what :meth:`grid` produces: ``"grid"``, integer indices ``i + grid_offset``
            (scaled by ``reference_grid / size`` when that is set); ``"normalized"``, cell centres in
            [-1, 1], ``2 (i + 0.5) / n - 1`` (DINOv3).
        grid_offset: added to ``"grid"`` coordinates (torchtune and Llama 4 count from 1).
        reference_grid: ``"grid"`` only: the grid size the frequencies were trained on; a grid of
            ``n`` cells then has coordinates ``i · reference / n``, spanning the trained range (EVA-02).
        normalize_coords: ``"normalized"`` only: divide by each axis's own size (``"separate"``), by
            the longest (``"max"``) or the shortest (``"min"``), as DINOv3's ``normalize_coords``.
        prefix_tokens: tokens before the grid that take no rotation (CLS, registers), by default in :meth:`grid`.
        suffix_tokens: the same after the grid (torchtune and Llama 4 append CLS).
        shift_coords: training only: add one uniform draw in ``[-shift, shift]`` per axis to every
            coordinate (DINOv3's augmentation).
        jitter_coords: training only: multiply each axis by a log-uniform draw in ``[1/jitter, jitter]``.
        rescale_coords: training only: multiply all axes by one log-uniform draw in ``[1/rescale, rescale]``.
        generator: draws the augmentation (a CPU ``torch.Generator``); default the global generator
            (``torch.manual_seed``). A call may pass its own.
    """

    def __init__(
        self,
        head_dim: int,
        axes: int,
        *,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        coordinates: Literal["grid", "normalized"] = "grid",
        grid_offset: float = 0.0,
        reference_grid: int | Sequence[int] | None = None,
        normalize_coords: Literal["separate", "max", "min"] = "separate",
        prefix_tokens: int = 0,
        suffix_tokens: int = 0,
        shift_coords: float | None = None,
        jitter_coords: float | None = None,
        rescale_coords: float | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int(head_dim, "head_dim")
        if head_dim % 2:
            raise ValueError(f"head_dim must be even (channels rotate in pairs), got head_dim={head_dim}")
        self.axes = check_positive_int(axes, "axes")
        r = head_dim if rotary_dim is None else check_positive_int(rotary_dim, "rotary_dim")
        if r % 2 or r > head_dim:
            raise ValueError(f"rotary_dim must be even and <= head_dim={head_dim}, got rotary_dim={r}")
        self.rotary_dim = r
        self.interleaved = check_bool(interleaved, "interleaved")
        self.coordinate_kind = check_choice(coordinates, "coordinates", ("grid", "normalized"))
        self.grid_offset = check_finite(grid_offset, "grid_offset")
        self.normalize_coords = check_choice(normalize_coords, "normalize_coords", _NORMALIZE)
        if coordinates == "normalized" and (grid_offset or reference_grid is not None):
            raise ValueError(
                "grid_offset and reference_grid shape integer grid coordinates; normalized coordinates are "
                "cell centres in [-1, 1] already (use coordinates='grid' with them, or drop them)"
            )
        self.reference_grid = None if reference_grid is None else self._sizes(reference_grid, "reference_grid")
        self.prefix_tokens = check_int(prefix_tokens, "prefix_tokens", minimum=0)
        self.suffix_tokens = check_int(suffix_tokens, "suffix_tokens", minimum=0)
        self.shift_coords = None if shift_coords is None else check_finite(shift_coords, "shift_coords")
        if self.shift_coords is not None and self.shift_coords < 0:
            raise ValueError(f"shift_coords must be >= 0 (a shift drawn from [-shift, shift]), got {shift_coords}")
        self.jitter_coords = self._log_range(jitter_coords, "jitter_coords")
        self.rescale_coords = self._log_range(rescale_coords, "rescale_coords")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator
        self._copies = DeviceCopies()  # frequencies kept on the host, copied once per device
        self._grids: OrderedDict[tuple, Coordinates] = OrderedDict()  # grid() results, handed out again

    @staticmethod
    def _log_range(value: float | None, name: str) -> float | None:
        if value is None:
            return None
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 1):
            raise ValueError(f"{name} must be a number >= 1 (a factor drawn log-uniformly from [1/{name}, {name}]), got {value!r}")
        return float(value)

    def _sizes(self, sizes: int | Sequence[int], name: str) -> tuple[int, ...]:
        if is_int(sizes):
            sizes = (sizes,) * self.axes  # type: ignore[assignment]
        elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            raise ValueError(f"{name} must be an int or {self.axes} ints (one size per axis), got {sizes!r:.80}")
        sizes = tuple(sizes)  # type: ignore[arg-type]
        if len(sizes) != self.axes:
            raise ValueError(f"{name} needs {self.axes} sizes (one per axis), got {sizes}")
        return tuple(check_positive_int(n, f"{name}[{i}]") for i, n in enumerate(sizes))

    # frequencies ------------------------------------------------------------------------------
    def frequencies(self) -> torch.Tensor:
        """Frequencies of each pair over the axes: ``[A, r/2]`` or per head ``[H, A, r/2]``."""
        raise NotImplementedError

    @property
    def heads(self) -> int | None:
        """Head count of per-head frequencies, else ``None``."""
        freq = self.frequencies()
        return freq.shape[0] if freq.dim() == 3 else None

    @property
    def augments(self) -> bool:
        """Whether coordinates are augmented in training mode."""
        return any(v is not None for v in (self.shift_coords, self.jitter_coords, self.rescale_coords))

    # coordinates ------------------------------------------------------------------------------
    def grid(
        self, *sizes: int, prefix: int | None = None, suffix: int | None = None, device: torch.device | str | None = None
    ) -> Coordinates:
        """Coordinates of a grid of ``sizes`` (one per axis, e.g. ``grid(h, w)``, ``grid(t, h, w)``), row-major.

        Args:
            sizes: cells per axis.
            prefix: identity tokens before the grid (default ``prefix_tokens``).
            suffix: identity tokens after it (default ``suffix_tokens``).
            device: where to put them.

        Returns:
            :class:`Coordinates` ``[prefix + Π sizes + suffix, A]`` in this module's convention
            (``coordinates``, ``grid_offset``, ``reference_grid``, ``normalize_coords``). The same
            arguments return the same object (the last :data:`GRID_CACHE` grids are kept), so a grid
            built per call and moved to an accelerator is copied host-to-device once, not per call.

        Example:
            >>> AxialRoPE(8, coordinates="normalized").grid(1, 2).values.tolist()
            [[0.0, -0.5], [0.0, 0.5]]
        """
        sizes_t = self._sizes(sizes, "grid")
        prefix = self.prefix_tokens if prefix is None else check_int(prefix, "prefix", minimum=0)
        suffix = self.suffix_tokens if suffix is None else check_int(suffix, "suffix", minimum=0)
        key = (
            sizes_t, prefix, suffix, None if device is None else torch.device(device), self.coordinate_kind,
            self.grid_offset, self.reference_grid, self.normalize_coords,
        )  # fmt: skip
        found = self._grids.get(key)
        if torch.compiler.is_compiling():  # version counters are not traceable: a grid made eagerly is used
            return found if found is not None else self._build_grid(sizes_t, prefix, suffix, device)
        if found is not None and found._version() == found.__dict__.get("_built_version"):
            self._grids.move_to_end(key)
            return found  # not edited in place since it was built
        with torch.inference_mode(False):  # kept: usable outside inference mode later
            coords = self._build_grid(sizes_t, prefix, suffix, device)
        coords.__dict__["_built_version"] = coords._version()
        self._grids[key] = coords
        while len(self._grids) > GRID_CACHE:
            self._grids.popitem(last=False)
        return coords

    def _build_grid(
        self, sizes_t: tuple[int, ...], prefix: int, suffix: int, device: torch.device | str | None
    ) -> Coordinates:
        """The coordinates :meth:`grid` hands out (built on the host, then moved to ``device``)."""
        per_axis = []
        for a, n in enumerate(sizes_t):
            i = torch.arange(n, dtype=torch.float64)
            if self.coordinate_kind == "normalized":
                denom = {"separate": n, "max": max(sizes_t), "min": min(sizes_t)}[self.normalize_coords]
                c = 2.0 * ((i + 0.5) / denom) - 1.0
            else:
                c = i if self.reference_grid is None else i / n * self.reference_grid[a]
                c = c + self.grid_offset
            per_axis.append(c)
        values = torch.stack(torch.meshgrid(*per_axis, indexing="ij"), dim=-1).reshape(-1, self.axes)
        identity = None
        if prefix or suffix:
            values = torch.cat((values.new_zeros(prefix, self.axes), values, values.new_zeros(suffix, self.axes)))
            identity = torch.zeros(values.shape[0], dtype=torch.bool)
            identity[:prefix] = True
            identity[values.shape[0] - suffix :] = True
        coords = Coordinates(values, identity)
        return coords if device is None else coords.to(device)

    def coordinates(
        self,
        positions: Coordinates | Positions | torch.Tensor,
        *,
        identity: torch.Tensor | None = None,
        name: str = "coordinates",
    ) -> Coordinates:
        """Validate explicit coordinates.

        Args:
            positions: a :class:`Coordinates`, an N-D :class:`~rotary.positions.Positions` with ``A``
                axes, or a tensor ``[S, A]`` / ``[B, S, A]`` (integer, or float for coordinates
                between cells: normalized, interpolated, augmented).
            identity: bool ``[S]`` or ``[B, S]``: tokens that take no rotation.
            name: the argument's name, for messages.

        Returns:
            :class:`Coordinates` (float64 values).

        Raises:
            TypeError: not a tensor of numbers.
            ValueError: a wrong number of axes or shape, or non-finite coordinates.

        Example:
            >>> AxialRoPE(8).coordinates(torch.tensor([[0, 1], [2, 3]])).values.dtype
            torch.float64
        """
        if isinstance(positions, Coordinates):
            if positions.axes != self.axes:
                raise ValueError(f"{name} have {positions.axes} axes but this {type(self).__name__} has axes={self.axes}")
            if identity is None:
                return positions
            return Coordinates(positions.values, _check_identity(identity, positions.values, name))
        if isinstance(positions, Positions):
            if positions.axes != self.axes:
                raise ValueError(
                    f"{name} have {positions.axes} coordinate axes but this {type(self).__name__} has axes={self.axes}; "
                    f"give [S, {self.axes}] or [B, S, {self.axes}] coordinates"
                )
            if positions.packed:
                raise ValueError(f"packed {name} are not supported by {type(self).__name__}: give [B, S, {self.axes}] coordinates")
            positions = positions.ids
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"{name} must be a tensor [S, {self.axes}] or [B, S, {self.axes}], got {type(positions).__name__}")
        if positions.dtype == torch.bool or positions.is_complex():
            raise TypeError(f"{name} must hold integer or floating coordinates, got dtype {positions.dtype}")
        if positions.dim() not in (2, 3) or positions.shape[-1] != self.axes:
            raise ValueError(
                f"{name} must be [S, {self.axes}] or [B, S, {self.axes}] ({self.axes} coordinates per token), got shape "
                f"{tuple(positions.shape)}; give {self.axes} coordinates per token"
                + (f" or build the module with axes={positions.shape[-1]}" if positions.dim() in (2, 3) else "")
            )
        values = positions.to(torch.float64)
        if not torch.compiler.is_compiling() and values.numel():
            if not deferred.host_checks(values.device):  # not read: NaN tables, and a deferred error
                deferred.record(deferred.COORDINATES_SLOT, ~torch.isfinite(values.detach()))
            elif not bool(torch.isfinite(values).all()):
                raise ValueError(f"{name} hold NaN or inf values; mark tokens that take no rotation with identity= instead")
        return Coordinates(values, _check_identity(identity, values, name))

    def augment(self, values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """DINOv3's coordinate augmentation: shift, per-axis jitter, shared rescale (any that are set).

        Draws on the CPU in float64, in this order: shift ``[A]``, jitter ``[A]``, rescale ``[1]``; one
        draw per call, shared by every token and batch row. The draws reach an accelerator by
        non-blocking copies (no synchronisation; a CUDA graph would replay the captured draw).

        Args:
            values: float64 ``[..., A]``.
            generator: default this module's ``generator``, else the global one.

        Example:
            >>> rope = AxialRoPE(8, shift_coords=0.5)
            >>> c = torch.zeros(3, 2, dtype=torch.float64)
            >>> out = rope.augment(c, torch.Generator().manual_seed(0))
            >>> bool((out == out[0]).all()), bool(out.abs().max() <= 0.5)
            (True, True)
        """
        g = self.generator if generator is None else generator
        a = self.axes
        if self.shift_coords is not None:
            shift = torch.empty(a, dtype=torch.float64).uniform_(-self.shift_coords, self.shift_coords, generator=g)
            values = values + shift.to(values.device, non_blocking=True)
        if self.jitter_coords is not None:
            top = math.log(self.jitter_coords)
            jitter = torch.empty(a, dtype=torch.float64).uniform_(-top, top, generator=g).exp()
            values = values * jitter.to(values.device, non_blocking=True)
        if self.rescale_coords is not None:
            top = math.log(self.rescale_coords)
            rescale = torch.empty(1, dtype=torch.float64).uniform_(-top, top, generator=g).exp()
            values = values * rescale.to(values.device, non_blocking=True)
        return values

    # tables ---------------------------------------------------------------------------------
    def tables(
        self,
        positions: Coordinates | Positions | torch.Tensor,
        *,
        identity: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        generator: torch.Generator | None = None,
    ) -> RotaryTables:
        """The tables that rotate tokens at ``positions`` (augmented in training mode, if configured).

        Compute them once per model forward and hand them to every layer (one augmentation draw for
        the whole forward, as DINOv3 does).

        Args:
            positions: :class:`Coordinates` (from :meth:`grid`) or explicit coordinates (see :meth:`coordinates`).
            identity: bool ``[S]`` or ``[B, S]``, tokens that take no rotation (added to those of ``positions``).
            dtype: fp32, or float64 for float64 inputs.
            generator: the augmentation's generator for this call.

        Returns:
            :class:`~rotary.tables.RotaryTables` ``[S, r]`` or ``[B, S, r]`` (per head: ``[S, H, r]``,
            ``[B, S, H, r]``) on the coordinates' device; identity rows are cos 1, sin 0.

        Example:
            >>> rope = AxialRoPE(8)
            >>> t = rope.tables(rope.grid(2, 3, prefix=1))
            >>> t.cos.shape, t.cos[0].tolist(), t.sin[0].tolist()
            (torch.Size([7, 8]), [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        """
        coords = self.coordinates(positions)
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        values = coords.values
        if self.training and self.augments:
            values = self.augment(values, generator)
        mask = coords.identity
        if identity is not None:
            extra = _check_identity(identity, values, "coordinates")
            mask = extra if mask is None else mask | extra
        if mask is not None:  # angle 0: cos 1, sin 0 (also a zero gradient into learnable frequencies)
            values = values.masked_fill(mask.unsqueeze(-1), 0.0)
        freq = self.frequencies()
        if freq.device != values.device and not freq.requires_grad:  # a constant: copied once per device
            freq = self._copies.on("frequencies", freq, values.device)
        if not torch.compiler.is_compiling() and values.numel():
            self._check_angles(values, freq)
        cos, sin = cos_sin_table(values, freq, interleaved=self.interleaved, dtype=dtype)
        return RotaryTables.unchecked(cos, sin, self.interleaved, heads=freq.shape[0] if freq.dim() == 3 else None)

    def _check_angles(self, values: torch.Tensor, freq: torch.Tensor) -> None:
        """Angles ``Σ_a c_a · f_a`` must be finite: an inf angle makes cos/sin NaN.

        One host read on the CPU; elsewhere the same bound ``max |c| · max_j Σ_a |f_a,j|`` is computed
        on the device and a non-finite one is a deferred error (:data:`rotary.deferred.ANGLES_SLOT`).

        Args:
            values: float64 coordinates ``[..., A]``.
            freq: ``[A, r/2]`` or ``[H, A, r/2]`` on the device of ``values``.
        """
        if not deferred.host_checks(values.device):
            with torch.no_grad():
                top = values.detach().abs().amax()
                rate = freq.detach().abs().sum(-2).amax().to(torch.float64)
                deferred.record(deferred.ANGLES_SLOT, ~torch.isfinite(top * rate))
            return
        top = float(values.detach().abs().amax())
        rate = float(freq.detach().abs().sum(-2).amax())
        if not math.isfinite(top * rate):
            augment = (
                f" after augmentation (shift_coords={self.shift_coords}, jitter_coords={self.jitter_coords}, "
                f"rescale_coords={self.rescale_coords})"
                if self.training and self.augments
                else ""
            )
            raise ValueError(
                f"coordinates up to {top:g}{augment} times frequencies up to {rate:g} rad per unit give rotation angles "
                "beyond float64's range (cos/sin would be NaN); use smaller coordinates, augmentation ranges or frequencies"
            )

    def input_tables(
        self,
        position_ids: Coordinates | Positions | torch.Tensor | None,
        *,
        batch: int,
        seq_len: int,
        device: torch.device | str,
        dtype: torch.dtype = torch.float32,
    ) -> RotaryTables:
        """The tables for a batch of ``batch`` x ``seq_len`` tokens at ``position_ids``, checked against them.

        What :class:`rotary.nn.RotaryAttention` calls with its ``position_ids``: the coordinates are
        this module's, so the layer passes them through unread.

        Args:
            position_ids: :class:`Coordinates` (e.g. ``grid(h, w, prefix=1)``) or coordinates ``[S, A]`` /
                ``[B, S, A]``; there is no default.
            batch: ``B`` of the input.
            seq_len: ``S`` of the input (identity tokens included).
            device: where the tables go (the input's device).
            dtype: fp32, or float64 for float64 inputs.

        Returns:
            :class:`~rotary.tables.RotaryTables` (augmented in training mode, if configured).

        Example:
            >>> rope = AxialRoPE(8)
            >>> rope.input_tables(rope.grid(2, 3, prefix=1), batch=2, seq_len=7, device="cpu").cos.shape
            torch.Size([7, 8])
        """
        if position_ids is None:
            raise ValueError(
                f"{type(self).__name__} rotates tokens by their {self.axes} coordinates: pass position_ids=rope.grid(...) "
                f"(identity tokens with prefix=/suffix=) or coordinates [S, {self.axes}] / [B, S, {self.axes}]"
            )
        coords = self.coordinates(position_ids, name="position_ids")
        self._check_tokens(coords, batch, seq_len, "the input")
        return self.tables(coords.to(device), dtype=dtype)

    # application ----------------------------------------------------------------------------
    def _check_tokens(self, coords: Coordinates, batch: int, seq_len: int, what: str, detail: str = "") -> None:
        if coords.seq_len != seq_len:
            raise ValueError(
                f"the coordinates cover S={coords.seq_len} tokens but {what} has S={seq_len}{detail}; tokens without a place "
                "on the grid (CLS, registers) need an identity row: grid(..., prefix=, suffix=)"
            )
        if coords.batch is not None and coords.batch not in (1, batch):
            raise ValueError(f"the coordinates have batch {coords.batch} but {what} has batch {batch}")

    def _check_inputs(self, xs: Sequence[torch.Tensor], names: Sequence[str], coords: Coordinates, layout: str) -> None:
        batch_dim, seq_dim = check_layout(layout)
        for x, name in zip(xs, names):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be 4-D ([B, H, S, D] or [B, S, H, D]), got {shape}")
            if x.shape[-1] != self.head_dim:
                raise ValueError(f"{name} has head_dim {x.shape[-1]} but this {type(self).__name__} was built for head_dim={self.head_dim}")
            self._check_tokens(coords, x.shape[batch_dim], x.shape[seq_dim], name, f" (layout {layout!r})")

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: Coordinates | Positions | torch.Tensor,
        *,
        identity: torch.Tensor | None = None,
        layout: Layout = "bhsd",
        inplace: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys at ``positions``, both in one fused kernel call.

        Args:
            q: ``[B, H, S, D]`` (``layout="bhsd"``) or ``[B, S, H, D]`` (``"bshd"``).
            k: same layout and S (any head count, except per-head tables: the same H).
            positions: :class:`Coordinates` or coordinates ``[S, A]`` / ``[B, S, A]``.
            identity: bool ``[S]`` / ``[B, S]``: tokens that take no rotation.
            layout: ``"bhsd"`` or ``"bshd"``.
            inplace: rotate in place.
            generator: the augmentation's generator for this call (training mode).

        Returns:
            ``(q_rotated, k_rotated)``, shapes and dtypes of ``q`` and ``k``.
        """
        coords = self.coordinates(positions, identity=identity)
        self._check_inputs((q, k), ("q", "k"), coords, layout)
        tables = self.tables(coords.to(q.device), dtype=table_dtype(q.dtype), generator=generator)
        q, k = rotate([q, k], tables, layout=layout, inplace=inplace, kinds=("q", "k"), names=("q", "k"))
        return q, k

    def rotate(
        self,
        x: torch.Tensor,
        positions: Coordinates | Positions | torch.Tensor,
        *,
        identity: torch.Tensor | None = None,
        layout: Layout = "bhsd",
        inplace: bool = False,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Rotate one tensor; arguments as in :meth:`forward`.

        Example:
            >>> rope = AxialRoPE(16)
            >>> x = torch.randn(1, 2, 6, 16)
            >>> torch.equal(rope.rotate(x, rope.grid(2, 3)), rope(x, x, rope.grid(2, 3))[0])
            True
        """
        coords = self.coordinates(positions, identity=identity)
        self._check_inputs((x,), ("x",), coords, layout)
        tables = self.tables(coords.to(x.device), dtype=table_dtype(x.dtype), generator=generator)
        return rotate([x], tables, layout=layout, inplace=inplace, names=("x",))[0]


# ------------------------------------------------------------------------------------------------
# axial RoPE


def _geometric(base: float, channels: int, dtype: torch.dtype) -> torch.Tensor:
    """``1 / base ** (arange(0, channels, 2) / channels)``: fp32 exactly as Hugging Face / torchtune
    write it, or float64 (FLUX forms its frequencies in float64)."""
    if dtype == torch.float32:
        return default_inv_freq(base, channels)
    exponent = torch.arange(0, channels, 2, dtype=torch.int64, device="cpu").to(torch.float64) / channels
    return 1.0 / (base**exponent)


class AxialRoPE(CoordinateRoPE):
    """Axial RoPE over ``A`` axes: each channel pair turns with one axis (vision, video).

    The rotary channels are split into one block per axis (``split``); a block of ``c`` channels
    carries a 1-D RoPE of its axis with ``c / 2`` frequencies. Attention scores then depend only on
    the offsets per axis ``(Δt, Δh, Δw)``. :data:`PRESETS` (:meth:`preset`) reproduce the published
    models exactly: ``torchtune``, ``llama4_vision``, ``pixtral``, ``dinov3``, ``eva02``, ``flux``,
    ``cogvideox``. Coordinates come from :meth:`grid` or are given explicitly ``[..., A]``; tokens
    marked identity (CLS, registers) are not rotated.

    Args:
        head_dim: channels per head ``D`` (even).
        axes: coordinates per token ``A`` (2 for images (y, x), 3 for video (t, y, x)).
        split: channels per axis, in axis order (each even, summing to ``rotary_dim``); default equal blocks.
        base: the frequencies' base θ.
        coordinates: ``"grid"`` or ``"normalized"`` (see :class:`CoordinateRoPE`).
        max_freq: ``None``: geometric frequencies ``base^(-2k/c)`` per block of ``c`` channels
            ("lang"); a number: linear frequencies ``linspace(1, max_freq / 2, c / 2) · π`` ("pixel",
            rotary-embedding-torch's convention for coordinates in [-1, 1]).
        interleaved: pairs (2i, 2i+1) or (i, i + r/2).
        rotary_dim: channels rotated (default ``head_dim``).
        frequencies: ``"per_axis"`` (each block its own frequencies, as above) or ``"alternating"``
            (Pixtral: one geometric set ``base^(-2j/r)`` over all pairs, dealt to the axes in turn:
            axis ``a`` takes ``j = a, a + A, …``; equal blocks only).
        block_order: the order of the axes' blocks among the pairs; default ``(0, 1, …)``. torchtune
            and Llama 4 put x (axis 1) first: ``(1, 0)``.
        frequency_scale: multiplies every frequency (DINOv3: 2π, its periods are in units of the
            normalized coordinate).
        frequency_dtype: the precision the frequencies are formed in before the (float64) angles:
            ``torch.float32`` (Hugging Face, torchtune, DINOv3) or ``torch.float64`` (FLUX).
        **kwargs: grid conventions, identity tokens and augmentation: see :class:`CoordinateRoPE`.

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
        frequency_scale: float = 1.0,
        frequency_dtype: torch.dtype = torch.float32,
        **kwargs: Any,
    ) -> None:
        super().__init__(head_dim, axes, rotary_dim=rotary_dim, interleaved=interleaved, coordinates=coordinates, **kwargs)
        a = self.axes
        self.split = self._check_split(split)
        self.base = check_positive_float(base, "base")
        self.max_freq = None if max_freq is None else check_positive_float(max_freq, "max_freq")
        self.frequency_kind = check_choice(frequencies, "frequencies", ("per_axis", "alternating"))
        if frequencies == "alternating" and (len(set(self.split)) != 1 or max_freq is not None):
            raise ValueError(
                f"frequencies='alternating' deals one geometric set to equal blocks; got split={self.split}"
                + (f" and max_freq={max_freq}" if max_freq is not None else "")
            )
        if block_order is not None and (isinstance(block_order, (str, bytes)) or not isinstance(block_order, Sequence)):
            raise ValueError(f"block_order must be a permutation of the axes {tuple(range(a))}, got {block_order!r:.80}")
        order = tuple(range(a)) if block_order is None else tuple(block_order)
        if not all(is_int(i) for i in order) or sorted(int(i) for i in order) != list(range(a)):
            raise ValueError(f"block_order must be a permutation of the axes {tuple(range(a))}, got {block_order!r}")
        self.block_order = tuple(int(i) for i in order)
        self.frequency_scale = check_positive_float(frequency_scale, "frequency_scale")
        if frequency_dtype not in (torch.float32, torch.float64):
            raise TypeError(f"frequency_dtype must be torch.float32 or torch.float64, got {frequency_dtype}")
        self.frequency_dtype = frequency_dtype
        # the exact frequencies on the host; the buffer mirrors them on the module's device
        self._exact_inv_freq = self._build_inv_freq()
        self._check_frequencies()
        self.register_buffer("inv_freq", self._exact_inv_freq.clone(), persistent=False)

    def _check_split(self, split: Sequence[int] | None) -> tuple[int, ...]:
        r, a = self.rotary_dim, self.axes
        if split is None:
            if r % (2 * a):
                raise ValueError(
                    f"rotary_dim={r} does not split into {a} equal blocks of an even number of channels; "
                    f"pass split=(...) with {a} even numbers summing to {r}"
                )
            return (r // a,) * a
        if isinstance(split, (str, bytes)) or not isinstance(split, Sequence):
            raise ValueError(f"split must be {a} even channel counts (one per axis) summing to rotary_dim={r}, got {split!r:.80}")
        split = tuple(split)
        if len(split) != a:
            raise ValueError(f"split gives {len(split)} blocks but axes={a}: give one channel count per axis")
        for i, c in enumerate(split):
            if isinstance(c, bool) or not isinstance(c, int) or c <= 0 or c % 2:
                raise ValueError(f"split[{i}]={c!r}: each axis needs a positive even number of channels (they rotate in pairs)")
        if sum(split) != r:
            raise ValueError(f"split={split} adds up to {sum(split)} channels but rotary_dim={r}; make the blocks sum to {r}")
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
        start = 0
        for axis in self.block_order:
            n = self.split[axis] // 2
            inv_freq[axis, start : start + n] = per_axis[axis]
            start += n
        return inv_freq

    def _check_frequencies(self) -> None:
        """Every pair must turn at a finite, nonzero rate: an fp32 frequency underflows to 0 for a huge
        base (that pair would silently never rotate) and overflows to inf for a huge max_freq."""
        per_pair = self._exact_inv_freq.sum(0)
        bad = ~(torch.isfinite(per_pair) & (per_pair > 0))
        if bool(bad.any()):
            j = int(bad.nonzero()[0])
            raise ValueError(
                f"pair {j}'s frequency is {float(per_pair[j])!r} (base={self.base:g}, max_freq={self.max_freq}, "
                f"frequency_scale={self.frequency_scale:g}, frequency_dtype={self.frequency_dtype}): the frequencies must "
                "be finite and > 0; use a smaller base, max_freq or frequency_scale (or frequency_dtype=torch.float64)"
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
        """The axial RoPE of a published model, exactly (see :data:`PRESETS` and ``docs/variants.md``).

        Args:
            name: ``"torchtune"``, ``"llama4_vision"``, ``"pixtral"``, ``"dinov3"``, ``"eva02"``,
                ``"flux"`` or ``"cogvideox"``.
            head_dim: channels per head (default: the model's; FLUX needs 128).
            **overrides: any keyword of :class:`AxialRoPE` (e.g. ``prefix_tokens=5`` for DINOv3 with
                four registers, ``reference_grid=16`` for EVA-02, ``shift_coords=`` for training).

        Example:
            >>> rope = AxialRoPE.preset("pixtral", 64)
            >>> rope.interleaved, rope.slot_axes[15], rope.slot_axes[16]
            (False, 0, 1)
        """
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"unknown axial preset {name!r}; presets: {', '.join(PRESETS)}")
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
        raise ValueError(f"the {name} preset needs head_dim divisible by 4 (two axes of paired channels), got {head_dim!r}")


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
        raise ValueError(f"the flux preset has axes of (16, 56, 56) channels: head_dim must be 128, got {head_dim}")
    return dict(axes=3, split=(16, 56, 56), base=10000.0, interleaved=True, frequency_dtype=torch.float64)


def _cogvideox(head_dim: int) -> dict[str, Any]:
    if not isinstance(head_dim, int) or head_dim % 16:
        raise ValueError(f"the cogvideox preset splits head_dim into D/4, 3D/8, 3D/8 even blocks: head_dim must be a multiple of 16, got {head_dim!r}")
    return dict(axes=3, split=(head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3), base=10000.0, interleaved=True)


#: name -> :class:`Preset`; :meth:`AxialRoPE.preset` builds them
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("torchtune", "torchtune's VisionRotaryPositionalEmbeddings (Llama 3.2 Vision-style encoders)", 64, {
            "axes": "(y, x); x's block first", "channels": "D/2, D/2", "frequencies": "base^(-4k/D), base 10000",
            "coordinates": "grid + 1: angles (x+1)θ, (y+1)θ", "pairing": "interleaved", "identity": "CLS appended last",
        }, _torchtune),
        Preset("llama4_vision", "Llama 4 vision encoder (transformers Llama4VisionRotaryEmbedding)", 88, {
            "axes": "(y, x); x's block first", "channels": "D/2, D/2", "frequencies": "base^(-4k/D), base 10000",
            "coordinates": "grid + 1", "pairing": "interleaved (complex)", "identity": "CLS appended last",
        }, _torchtune),
        Preset("pixtral", "Pixtral / Mistral vision encoders (transformers PixtralVisionRotaryEmbedding)", 64, {
            "axes": "(h, w); h's block first", "channels": "D/2, D/2",
            "frequencies": "one set base^(-2j/D): h takes [::2], w [1::2]; base 10000",
            "coordinates": "grid", "pairing": "half", "identity": "none",
        }, _pixtral),
        Preset("dinov3", "DINOv3 ViTs (facebookresearch/dinov3 RopePositionEmbedding)", 64, {
            "axes": "(h, w); h's block first", "channels": "D/2, D/2",
            "frequencies": "2π / periods, periods base^(4k/D), base 100",
            "coordinates": "cell centres in [-1, 1]; train-time shift / jitter / rescale", "pairing": "half",
            "identity": "CLS + registers first",
        }, _dinov3),
        Preset("eva02", "EVA-02 (baaivision/EVA VisionRotaryEmbeddingFast)", 64, {
            "axes": "(h, w); h's block first", "channels": "D/2, D/2", "frequencies": "base^(-4k/D), base 10000",
            "coordinates": "grid · pretrain / finetune (reference_grid)", "pairing": "interleaved",
            "identity": "CLS first",
        }, _eva02),
        Preset("flux", "FLUX.1 (black-forest-labs/flux EmbedND)", 128, {
            "axes": "(t, h, w)", "channels": "16, 56, 56", "frequencies": "base^(-2k/c) per axis, float64; base 10000",
            "coordinates": "grid (t = 0 for images)", "pairing": "interleaved", "identity": "text tokens (ids 0)",
        }, _flux),
        Preset("cogvideox", "CogVideoX (diffusers get_3d_rotary_pos_embed)", 64, {
            "axes": "(t, h, w)", "channels": "D/4, 3D/8, 3D/8", "frequencies": "base^(-2k/c) per axis, base 10000",
            "coordinates": "grid", "pairing": "interleaved", "identity": "text tokens first",
        }, _cogvideox),
    )
}  # fmt: skip


# ------------------------------------------------------------------------------------------------
# scores against offsets (for figures and checks)


def relative_scores(rope: CoordinateRoPE, q: torch.Tensor, k: torch.Tensor, extent: int) -> torch.Tensor:
    """Scores ``⟨R(c) q, R(c + Δ) k⟩`` over offsets ``Δ = (Δh, Δw)`` in grid cells, ``|Δ| <= extent``.

    The query sits at the centre of a ``(2 extent + 1)²`` grid built by ``rope.grid`` (so offsets are in
    cells whatever the coordinate convention); leading axes (t of video) are held at one cell. Computed
    in float64 through the fused kernel.

    Args:
        rope: an :class:`AxialRoPE` or :class:`~rotary.variants.RoPEMixed` with at least 2 axes.
        q: ``[D]`` (or ``[H, D]`` for per-head tables: one query per head).
        k: same shape.
        extent: largest offset per axis.

    Returns:
        float64 ``[2 extent + 1, 2 extent + 1]`` (``[H, …]`` per head); entry ``[i, j]`` is the score at
        ``Δh = i - extent``, ``Δw = j - extent``.

    Example:
        >>> s = relative_scores(AxialRoPE(16), torch.ones(16), torch.ones(16), 2)
        >>> s.shape, float(s[2, 2])  # no offset: the plain dot product
        (torch.Size([5, 5]), 16.0)
    """
    if rope.axes < 2:
        raise ValueError(f"relative_scores needs at least 2 axes, got axes={rope.axes}")
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
