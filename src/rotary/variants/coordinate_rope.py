"""What :class:`~rotary.variants.AxialRoPE` and :class:`~rotary.variants.RoPEMixed` share: coordinates in, tables out.

:class:`CoordinateRoPE` builds grids in the published coordinate conventions, validates explicit
coordinates, augments them in training mode, writes identity rows, and rotates through the one
fused kernel; a subclass gives the frequencies (:meth:`CoordinateRoPE.frequencies`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

from .. import devices
from .._checks import check_bool, check_choice, check_finite, check_int, check_positive_int, is_int
from .._device_copies import DeviceCopies
from ..errors import InputError, InputTypeError
from ..positions import Positions
from ..rotation import Layout, check_head_dim, check_layout, check_rank, rotate
from ..tables import RotaryTables, cos_sin_table, table_dtype
from .coordinates import Coordinates, check_identity

__all__ = ["CoordinateRoPE", "GRID_CACHE"]

_NORMALIZE = ("separate", "max", "min")
#: how many grids :meth:`CoordinateRoPE.grid` keeps (per module) to hand out again
GRID_CACHE = 16


class CoordinateRoPE(nn.Module):
    """RoPE over N-D coordinates: grids, coordinate conventions, augmentation, identity rows, tables.

    Subclasses give :meth:`frequencies`, ``[A, r/2]`` (axial) or ``[H, A, r/2]`` (per head, RoPE-Mixed); the
    conventions reproduced are in docs/variants.md, "Coordinates".

    Args:
        head_dim, axes, rotary_dim: ``D`` (even); coordinates per token ``A``; channels rotated ``r`` (even, ``<= D``).
        interleaved: pairs (2i, 2i+1), else (i, i + r/2).
        coordinates: ``"grid"``, indices ``i + grid_offset`` (``(i / n) · reference_grid[a] + grid_offset`` when set,
            EVA-02; an int is every axis's), or ``"normalized"``, cell centres ``2 (i + 0.5) / m - 1`` with ``m`` per
            ``normalize_coords``: the axis's size ``n`` (``"separate"``), the largest or the smallest size of the grid
            (``"max"``, ``"min"``: DINOv3's). ``i < n`` indexes axis ``a`` of a grid; the grid is row-major.
        prefix_tokens, suffix_tokens: tokens before / after the grid that take no rotation (CLS, registers).
        shift_coords, jitter_coords, rescale_coords: training-only augmentation (DINOv3's), drawn from ``generator``.
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
            raise InputError(f"head_dim must be even (channels rotate in pairs), got head_dim={head_dim}")
        self.axes = check_positive_int(axes, "axes")
        r = head_dim if rotary_dim is None else check_positive_int(rotary_dim, "rotary_dim")
        if r % 2 or r > head_dim:
            raise InputError(f"rotary_dim must be even and <= head_dim={head_dim}, got rotary_dim={r}")
        self.rotary_dim = r
        self.interleaved = check_bool(interleaved, "interleaved")
        self.coordinate_kind = check_choice(coordinates, "coordinates", ("grid", "normalized"))
        self.grid_offset = check_finite(grid_offset, "grid_offset")
        self.normalize_coords = check_choice(normalize_coords, "normalize_coords", _NORMALIZE)
        if coordinates == "normalized" and (grid_offset or reference_grid is not None):
            raise InputError(
                "grid_offset and reference_grid shape integer grid coordinates; normalized coordinates are "
                "cell centres in [-1, 1] already (use coordinates='grid' with them, or drop them)"
            )
        self.reference_grid = None if reference_grid is None else self._sizes(reference_grid, "reference_grid")
        self.prefix_tokens = check_int(prefix_tokens, "prefix_tokens", minimum=0)
        self.suffix_tokens = check_int(suffix_tokens, "suffix_tokens", minimum=0)
        self.shift_coords = None if shift_coords is None else check_finite(shift_coords, "shift_coords")
        if self.shift_coords is not None and self.shift_coords < 0:
            raise InputError(f"shift_coords must be >= 0 (a shift drawn from [-shift, shift]), got {shift_coords}")
        self.jitter_coords = self._log_range(jitter_coords, "jitter_coords")
        self.rescale_coords = self._log_range(rescale_coords, "rescale_coords")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InputTypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.generator = generator
        self._copies = DeviceCopies()  # frequencies kept on the host, copied once per device
        self._grids: OrderedDict[tuple, Coordinates] = OrderedDict()  # grid() results, handed out again

    @staticmethod
    def _log_range(value: float | None, name: str) -> float | None:
        if value is None:
            return None
        if not (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 1
        ):
            raise InputError(
                f"{name} must be a number >= 1 (a factor drawn log-uniformly from [1/{name}, {name}]), got {value!r}"
            )
        return float(value)

    def _sizes(self, sizes: int | Sequence[int], name: str) -> tuple[int, ...]:
        if is_int(sizes):
            sizes = (sizes,) * self.axes  # type: ignore[assignment]
        elif isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
            raise InputError(f"{name} must be an int or {self.axes} ints (one size per axis), got {sizes!r:.80}")
        sizes = tuple(sizes)  # type: ignore[arg-type]
        if len(sizes) != self.axes:
            raise InputError(f"{name} needs {self.axes} sizes (one per axis), got {sizes}")
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
        self,
        *sizes: int,
        prefix: int | None = None,
        suffix: int | None = None,
        device: torch.device | str | None = None,
    ) -> Coordinates:
        """Coordinates of a grid of ``sizes`` (``grid(h, w)``, ``grid(t, h, w)``), row-major, with ``prefix`` /
        ``suffix`` identity tokens (default ``prefix_tokens``, ``suffix_tokens``).

        Returns :class:`Coordinates` ``[prefix + Π sizes + suffix, A]``; the last :data:`GRID_CACHE` grids are kept, so
        the same arguments return the same object (one host-to-device copy). Under ``torch.compile`` the grid is
        built in the graph, so that ``dynamic=True`` traces one graph for every size.

        Example:
            >>> AxialRoPE(8, coordinates="normalized").grid(1, 2).values.tolist()
            [[0.0, -0.5], [0.0, 0.5]]
        """
        sizes_t = self._sizes(sizes, "grid")
        prefix = self.prefix_tokens if prefix is None else check_int(prefix, "prefix", minimum=0)
        suffix = self.suffix_tokens if suffix is None else check_int(suffix, "suffix", minimum=0)
        if torch.compiler.is_compiling():  # built in the graph: a lookup would specialise the graph on the sizes
            return self._build_grid(sizes_t, prefix, suffix, device)
        key = (
            sizes_t,
            prefix,
            suffix,
            None if device is None else torch.device(device),
            self.coordinate_kind,
            self.grid_offset,
            self.reference_grid,
            self.normalize_coords,
        )
        found = self._grids.get(key)
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
        """The coordinates :meth:`grid` hands out, built on ``device`` (no host-to-device copy, in a graph too)."""
        per_axis = []
        for a, n in enumerate(sizes_t):
            i = torch.arange(n, dtype=torch.float64, device=device)
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
            identity = torch.zeros(values.shape[0], dtype=torch.bool, device=values.device)
            identity[:prefix] = True
            identity[values.shape[0] - suffix :] = True
        return Coordinates(values, identity)

    def coordinates(
        self,
        positions: Coordinates | Positions | torch.Tensor,
        *,
        identity: torch.Tensor | None = None,
        name: str = "coordinates",
    ) -> Coordinates:
        """Validate explicit coordinates into :class:`Coordinates` (float64 values).

        Args:
            positions: a :class:`Coordinates`, an N-D :class:`~rotary.positions.Positions` with ``A`` axes, or a
                tensor ``[S, A]`` / ``[B, S, A]`` (integer, or float: normalized, interpolated, augmented).
            identity: bool ``[S]`` or ``[B, S]``: tokens that take no rotation. ``name``: the argument, for messages.

        Raises:
            rotary.errors.InputError: not a tensor of numbers (InputTypeError), a wrong shape, non-finite values.

        Example:
            >>> AxialRoPE(8).coordinates(torch.tensor([[0, 1], [2, 3]])).values.dtype
            torch.float64
        """
        if isinstance(positions, Coordinates):
            if positions.axes != self.axes:
                raise InputError(
                    f"{name} have {positions.axes} axes but this {type(self).__name__} has axes={self.axes}"
                )
            if identity is None:
                return positions
            return Coordinates(positions.values, check_identity(identity, positions.values, name))
        if isinstance(positions, Positions):
            if positions.axes != self.axes:
                raise InputError(
                    f"{name} have {positions.axes} coordinate axes but this {type(self).__name__} has "
                    f"axes={self.axes}; give [S, {self.axes}] or [B, S, {self.axes}] coordinates"
                )
            if positions.packed:
                raise InputError(
                    f"packed {name} are not supported by {type(self).__name__}: give [B, S, {self.axes}] coordinates"
                )
            positions = positions.ids if positions.axes > 1 else positions.ids.unsqueeze(-1)  # 1 axis: ids [..., S]
        if not isinstance(positions, torch.Tensor):
            raise InputTypeError(
                f"{name} must be a tensor [S, {self.axes}] or [B, S, {self.axes}], got {type(positions).__name__}"
            )
        if positions.dtype == torch.bool or positions.is_complex():
            raise InputTypeError(f"{name} must hold integer or floating coordinates, got dtype {positions.dtype}")
        if positions.dim() not in (2, 3) or positions.shape[-1] != self.axes:
            raise InputError(
                f"{name} must be [S, {self.axes}] or [B, S, {self.axes}] ({self.axes} coordinates per token), got "
                f"shape {tuple(positions.shape)}; give {self.axes} coordinates per token"
                + (f" or build the module with axes={positions.shape[-1]}" if positions.dim() in (2, 3) else "")
            )
        values = positions.to(torch.float64)
        if not torch.compiler.is_compiling() and values.numel():
            # not read off the CPU: NaN or inf coordinates give NaN tables there (the caller's contract)
            if devices.host_checks(values.device) and not bool(torch.isfinite(values).all()):
                raise InputError(
                    f"{name} hold NaN or inf values; mark tokens that take no rotation with identity= instead"
                )
        return Coordinates(values, check_identity(identity, values, name))

    def augment(self, values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """DINOv3's augmentation of float64 ``values [..., A]`` (shift, per-axis jitter, shared rescale): one CPU draw.

        Example:
            >>> rope = AxialRoPE(8, shift_coords=0.5)
            >>> out = rope.augment(torch.zeros(3, 2, dtype=torch.float64), torch.Generator().manual_seed(0))
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
        """The tables that rotate tokens at ``positions`` (augmented in training mode): once per model forward.

        Args:
            positions: :class:`Coordinates` (from :meth:`grid`) or explicit coordinates (see :meth:`coordinates`).
            identity: bool ``[S]`` or ``[B, S]``, more tokens that take no rotation (cos 1, sin 0).
            dtype: fp32, or float64 for float64 inputs. ``generator``: the augmentation's, for this call.

        Returns :class:`~rotary.tables.RotaryTables` ``[S, r]`` or ``[B, S, r]`` (per head: ``[..., H, r]``).

        Example:
            >>> rope = AxialRoPE(8)
            >>> t = rope.tables(rope.grid(2, 3, prefix=1))
            >>> t.cos.shape, t.cos[0].tolist(), t.sin[0].tolist()
            (torch.Size([7, 8]), [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        """
        coords = self.coordinates(positions)
        if dtype not in (torch.float32, torch.float64):
            raise InputTypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        values = coords.values
        if self.training and self.augments:
            values = self.augment(values, generator)
        mask = coords.identity
        if identity is not None:
            extra = check_identity(identity, values, "coordinates")
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
        """Angles ``Σ_a c_a · f_a`` must be finite (one host read on the CPU; elsewhere the caller's contract)."""
        if not devices.host_checks(values.device):
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
            raise InputError(
                f"coordinates up to {top:g}{augment} times frequencies up to {rate:g} rad per unit give rotation "
                "angles beyond float64's range (cos/sin would be NaN); use smaller coordinates, "
                "augmentation ranges or frequencies"
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
        """:meth:`tables` for ``batch`` x ``seq_len`` tokens, as :class:`rotary.nn.RotaryAttention` asks.

        ``seq_len`` counts identity tokens; ``position_ids`` has no default.

        Example:
            >>> rope = AxialRoPE(8)
            >>> rope.input_tables(rope.grid(2, 3, prefix=1), batch=2, seq_len=7, device="cpu").cos.shape
            torch.Size([7, 8])
        """
        if position_ids is None:
            raise InputError(
                f"{type(self).__name__} rotates tokens by their {self.axes} coordinates: pass "
                "position_ids=rope.grid(...) (identity tokens with prefix=/suffix=) or coordinates [S, "
                f"{self.axes}] / [B, S, {self.axes}]"
            )
        coords = self.coordinates(position_ids, name="position_ids")
        self._check_tokens(coords, batch, seq_len, "the input")
        return self.tables(coords.to(device), dtype=dtype)

    # application ----------------------------------------------------------------------------
    def _check_tokens(self, coords: Coordinates, batch: int, seq_len: int, what: str, detail: str = "") -> None:
        if coords.seq_len != seq_len:
            raise InputError(
                f"the coordinates cover S={coords.seq_len} tokens but {what} has S={seq_len}{detail}; tokens without "
                "a place on the grid (CLS, registers) need an identity row: grid(..., prefix=, suffix=)"
            )
        if coords.batch is not None and coords.batch not in (1, batch):
            raise InputError(f"the coordinates have batch {coords.batch} but {what} has batch {batch}")

    def _check_inputs(self, xs: Sequence[torch.Tensor], names: Sequence[str], coords: Coordinates, layout: str) -> None:
        batch_dim, seq_dim = check_layout(layout)
        for x, name in zip(xs, names):
            check_rank(x, name)
            check_head_dim(x, name, self)
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
        """Rotate queries and keys at ``positions`` in one fused kernel call; returns tensors shaped as ``q`` and ``k``.

        Args:
            q, k: ``[B, H, S, D]`` (``layout="bhsd"``) or ``[B, S, H, D]`` (``"bshd"``); ``k`` may have other heads,
                except with per-head tables.
            positions, identity, generator: as in :meth:`tables`. ``inplace``: rotate in place.
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
