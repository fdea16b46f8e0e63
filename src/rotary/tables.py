"""Positions x frequencies -> cos/sin tables: :class:`RotaryTables`, and the cache they are cut from.

Hugging Face forms ``position * inv_freq`` in fp32: at position 2**20 an fp32 angle is only
resolved to 2**20 * 2**-24 = 0.06 rad. Here the product is taken in float64 (exact to ~1e-10 rad at
any position a model will see), cos/sin are evaluated in float64 and rounded once to the table
dtype: fp32, or float64 for float64 inputs.

Angles are ``positions x frequencies`` for any number of axes: 1-D text positions ``[...]`` with
``inv_freq [r/2]``; N-D coordinates ``[..., A]`` with one frequency row per axis ``[A, r/2]`` (axial
RoPE puts each pair on one axis, so its rows are zero elsewhere; RoPE-Mixed mixes them); and per
head ``[H, A, r/2]``, which gives per-head tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import devices
from ._checks import check_positive_int, check_untransformed, inside_a_transform, is_number
from ._limits import MAX_TABLE_BYTES
from ._sync import CopyableLock
from .errors import InputError, InputTypeError
from .table_checks import (
    CHECKED,
    check_not_swapped,
    check_row_range,
    check_rows,
    swapped_rows,
)

__all__ = [
    "RotaryTables",
    "TableCache",
    "angles",
    "cos_sin_table",
    "gather_rows",
    "indexed_device",
    "expand_pairs",
    "row_frequencies",
    "swapped_rows",
    "table_dtype",
]


def table_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The table dtype for inputs of ``x_dtype``: float64 for float64, fp32 for everything else."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def angles(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotation angles ``positions x frequencies`` in float64.

    Args:
        position_ids: integer (or float, for coordinates) ``[...]``, or ``[..., A]`` with A axes.
        inv_freq: ``[r/2]`` (1-D positions), ``[A, r/2]`` (one row per axis), or ``[H, A, r/2]``
            (per head).

    Returns:
        float64 ``[..., r/2]``, or ``[..., H, r/2]`` for per-head frequencies. Differentiable with
        respect to ``inv_freq`` (learnable frequencies).

    Example:
        >>> angles(torch.tensor([[1, 2]]), torch.tensor([[1.0, 0.0], [0.0, 0.5]]))  # y on pair 0, x on pair 1
        tensor([[1., 1.]], dtype=torch.float64)
    """
    pos = position_ids.to(torch.float64)
    freq = inv_freq.to(device=position_ids.device, dtype=torch.float64)
    if freq.dim() == 1:
        return pos.unsqueeze(-1) * freq
    axes = freq.shape[-2]
    if pos.shape[-1:] != (axes,):
        raise InputError(
            f"positions {tuple(position_ids.shape)} need a last axis of {axes} coordinates for frequencies "
            f"{tuple(inv_freq.shape)}"
        )
    if freq.dim() == 2:  # [..., A, 1] * [A, r/2], summed over A
        return (pos.unsqueeze(-1) * freq).sum(-2)
    if freq.dim() == 3:  # [..., 1, A, 1] * [H, A, r/2] -> [..., H, r/2]
        return (pos[..., None, :, None] * freq).sum(-2)
    raise InputError(f"inv_freq must be [r/2], [A, r/2] or [H, A, r/2], got {tuple(inv_freq.shape)}")


def expand_pairs(half_table: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Lay a per-pair table ``[..., r/2]`` out per channel ``[..., r]`` for a pairing.

    Half pairing (channels i and i + r/2 form a pair): ``[t0 .. t(r/2-1), t0 .. t(r/2-1)]``.
    Interleaved pairing (channels 2i and 2i+1): ``[t0, t0, t1, t1, ...]``.
    """
    if interleaved:
        return half_table.repeat_interleave(2, dim=-1)
    return torch.cat((half_table, half_table), dim=-1)


def cos_sin_table(
    position_ids: torch.Tensor,
    inv_freq: torch.Tensor,
    *,
    attention_scaling: float | torch.Tensor = 1.0,
    interleaved: bool = False,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``positions x frequencies``, times ``attention_scaling``, in ``dtype``.

    Args:
        position_ids: ``[...]`` or ``[..., A]`` (see :func:`angles`).
        inv_freq: ``[r/2]``, ``[A, r/2]`` or ``[H, A, r/2]``.
        attention_scaling: multiplied into both tables (a float, or a tensor broadcasting against
            ``[..., r/2]``, e.g. xPos's per-position scales).
        interleaved: channel layout (see :func:`expand_pairs`).
        dtype: fp32 (default) or float64.

    Returns:
        ``(cos, sin)``, ``[..., r]`` (``[..., H, r]`` per head) on ``position_ids.device``.

    Example:
        >>> cos, sin = cos_sin_table(torch.arange(4), torch.tensor([1.0, 0.01]))
        >>> cos.shape
        torch.Size([4, 4])
    """
    theta = angles(position_ids, inv_freq)
    cos = (theta.cos() * attention_scaling).to(dtype)
    sin = (theta.sin() * attention_scaling).to(dtype)
    return expand_pairs(cos, interleaved), expand_pairs(sin, interleaved)


def row_frequencies(inv_freq: torch.Tensor, attention_scaling: float, device: torch.device | str) -> torch.Tensor:
    """What a kernel needs to compute a table row: float64 ``[r/2 + 1]``, the frequencies then the attention scaling.

    A row computed from it is :func:`cos_sin_table`'s row (the float64 product exact for ``|position| < 2**29``).

    Example:
        >>> row_frequencies(torch.tensor([1.0, 0.5]), 2.0, "cpu")
        tensor([1.0000, 0.5000, 2.0000], dtype=torch.float64)
    """
    freq = inv_freq.detach().to("cpu", torch.float64).reshape(-1)
    scale = torch.tensor([float(attention_scaling)], dtype=torch.float64, device=freq.device)  # also under meta
    return torch.cat((freq, scale)).to(device)


def gather_rows(
    cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor, frequencies: torch.Tensor | None, interleaved: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``rows`` ``[...]`` of the tables ``[N, r]``, as ``[..., r]``; no value is read on the host.

    With ``frequencies`` (:func:`row_frequencies`) a row the table does not hold (any int64) is computed, as the
    kernels compute it; without, a row outside is NaN (the caller's contract), never another row's values.

    Example:
        >>> cos, sin = cos_sin_table(torch.arange(4), torch.tensor([1.0]))
        >>> c, s = gather_rows(cos, sin, torch.tensor([2, 9]), row_frequencies(torch.tensor([1.0]), 1.0, "cpu"), False)
        >>> torch.equal(c, cos_sin_table(torch.tensor([2, 9]), torch.tensor([1.0]))[0])
        True
    """
    n = cos.shape[0]
    inside = (rows >= 0) & (rows < n)
    safe = torch.where(inside, rows, torch.zeros_like(rows)) if n else rows
    c, s = (
        (cos[safe], sin[safe])
        if n
        else (cos.new_zeros(*rows.shape, cos.shape[-1]), sin.new_zeros(*rows.shape, cos.shape[-1]))
    )
    keep = inside.reshape(*inside.shape, *([1] * (c.dim() - inside.dim())))
    if frequencies is None:
        nan = torch.full((), float("nan"), dtype=c.dtype, device=c.device)
        return torch.where(keep, c, nan), torch.where(keep, s, nan)
    freq = frequencies.to(rows.device)
    cc, ss = cos_sin_table(rows, freq[:-1], attention_scaling=freq[-1], interleaved=interleaved, dtype=cos.dtype)
    return torch.where(keep, c, cc), torch.where(keep, s, ss)


# ------------------------------------------------------------------------------------------------
# the value handed from the tables stage to the apply stage


_CPU = torch.device("cpu")
_CPU_FP32 = (_CPU, torch.float32)  # the key of the tables decoding on the CPU reads


@dataclass(frozen=True, eq=False)  # tensors inside: equality is identity, not an ambiguous tensor comparison
class RotaryTables:
    """cos/sin tables and how the tokens of a call find their rows: what :func:`rotary.rotate` applies.

    Made by a table producer (:meth:`rotary.RoPE.tables`, the variants) or from raw tensors (:meth:`from_tensors`);
    they carry their pairing, so a table of one pairing cannot be applied with the other.

    Attributes:
        cos, sin: fp32 (float64 for float64 inputs), same shape and device: the tokens' own rows ``[S, r]`` /
            ``[B, S, r]`` when ``rows`` is None, else a table ``[N, r]``; per-head tables add ``H`` before ``r``.
        interleaved: the pairing the tables were built for.
        rows: int64 ``[S]``, ``[B, S]`` or packed ``[T]``: token (b, s) reads row ``rows[b, s]`` (nothing
            gathered), or ``None``.
        k_cos, k_sin: separate tables for keys (xPos), or ``None`` (keys use ``cos``/``sin``).
        heads: the head count of per-head tables, else ``None``.
        frequencies: float64 ``[r/2 + 1]`` (:func:`row_frequencies`), or ``None``; with it ``rows`` may be any
            int64 (rows past the table are computed by the kernel), without it ``rows`` must lie inside.

    Example:
        >>> import rotary
        >>> t = rotary.RoPE(8).tables(rotary.positions.arange(4))  # positions 0..3: a slice of the cache
        >>> t.cos.shape, t.interleaved, t.rotary_dim, t.addressing
        (torch.Size([4, 8]), False, 8, 'shared')
    """

    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool
    rows: torch.Tensor | None = None
    k_cos: torch.Tensor | None = None
    k_sin: torch.Tensor | None = None
    heads: int | None = None
    frequencies: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self._check_structure()
        self.check()  # a few rows: made by hand, the values are checked too (producers use unchecked)

    @classmethod
    def unchecked(
        cls,
        cos: torch.Tensor,
        sin: torch.Tensor,
        interleaved: bool,
        rows: torch.Tensor | None = None,
        k_cos: torch.Tensor | None = None,
        k_sin: torch.Tensor | None = None,
        heads: int | None = None,
        frequencies: torch.Tensor | None = None,
    ) -> RotaryTables:
        """Tables whose values are not checked (shapes, dtypes and rows still are), for producers that vouch for them.

        xPos-like tables (cos²+sin² varies with the position) can only be made this way; tables from anywhere else go
        through the constructor or :meth:`from_tensors`.

        Example:
            >>> cos, sin = torch.ones(3, 8), torch.zeros(3, 8)
            >>> RotaryTables.unchecked(cos, sin, False).addressing
            'shared'
        """
        tables = object.__new__(cls)
        for name, value in (
            ("cos", cos),
            ("sin", sin),
            ("interleaved", interleaved),
            ("rows", rows),
            ("k_cos", k_cos),
            ("k_sin", k_sin),
            ("heads", heads),
            ("frequencies", frequencies),
        ):
            object.__setattr__(tables, name, value)
        tables._check_structure()
        return tables

    def _check_structure(self) -> None:
        """Shapes, dtypes, devices, pairing flag and row range: host-side checks (rows: see below)."""
        cos, sin = self.cos, self.sin
        if not (isinstance(cos, torch.Tensor) and isinstance(sin, torch.Tensor)):
            raise InputTypeError("cos and sin must be tensors (use RoPE.tables(positions) to make them)")
        if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.device != sin.device:
            raise InputError(
                f"cos and sin must have the same shape, dtype and device; got {tuple(cos.shape)} {cos.dtype} "
                f"{cos.device} and "
                f"{tuple(sin.shape)} {sin.dtype} {sin.device}"
            )
        if not cos.is_floating_point():
            raise InputTypeError(f"cos/sin must be floating point, got dtype {cos.dtype}")
        if inside_a_transform():  # tables carrying a tangent or a torch.func wrapper: the kernels would drop it
            for name in ("cos", "sin", "k_cos", "k_sin"):
                if isinstance(getattr(self, name), torch.Tensor):
                    check_untransformed(getattr(self, name), name)
        if not isinstance(self.interleaved, bool):
            raise InputTypeError(f"interleaved must be True or False, got {self.interleaved!r}")
        r = cos.shape[-1] if cos.dim() else 0
        if r == 0 or r % 2:
            raise InputError(f"cos/sin rotate r={r} channels (shape {tuple(cos.shape)}); r must be even and > 0")
        head_axis = 0 if self.heads is None else 1
        if self.heads is not None and (cos.dim() < 3 or cos.shape[-2] != self.heads):
            raise InputError(f"per-head tables need a head axis of {self.heads} before r, got shape {tuple(cos.shape)}")
        if self.rows is None:
            if cos.dim() - head_axis not in (2, 3):
                raise InputError(f"cos/sin must be [S, r] or [B, S, r] (tokens' rows), got shape {tuple(cos.shape)}")
        else:
            rows = self.rows
            if not isinstance(rows, torch.Tensor) or rows.dtype != torch.int64 or rows.dim() not in (1, 2):
                raise InputTypeError(f"rows must be an int64 tensor [S] or [B, S], got {rows!r:.80}")
            if rows.device != cos.device:
                raise InputError(f"rows are on {rows.device} but the tables on {cos.device}")
            if cos.dim() - head_axis != 2:
                raise InputError(
                    f"with rows, cos/sin must be a table [N, r] indexed by row, got shape {tuple(cos.shape)}"
                )
            if self.frequencies is None:  # with frequencies, rows past the table are computed
                self._check_row_range(rows)
        if self.frequencies is not None:
            f = self.frequencies
            if (
                not isinstance(f, torch.Tensor)
                or f.dtype != torch.float64
                or f.shape != (cos.shape[-1] // 2 + 1,)
                or not f.is_contiguous()  # the kernels read them as one row
                or f.device != cos.device
                or self.rows is None
                or self.heads is not None
                or self.k_cos is not None
            ):
                raise InputError(
                    "frequencies (rows computed past the table) are contiguous float64 [r/2 + 1] on the tables' "
                    "device, for a table [N, r] indexed by rows without per-head or key tables (see "
                    "rotary.tables.row_frequencies; a strided view: pass .contiguous())"
                )
        if (self.k_cos is None) != (self.k_sin is None):
            raise InputError("give both k_cos and k_sin, or neither")
        if self.k_cos is not None:
            for name, t in (("k_cos", self.k_cos), ("k_sin", self.k_sin)):
                if (
                    not isinstance(t, torch.Tensor)
                    or t.shape != cos.shape
                    or t.dtype != cos.dtype
                    or t.device != cos.device
                ):
                    raise InputError(f"{name} must have cos's shape {tuple(cos.shape)}, dtype and device")

    def check_rows(self) -> None:
        """Rows edited in place since they were checked (their ``_version`` moved) are checked again: on the CPU, an
        :class:`~rotary.errors.InputError` naming the rows outside the table (on accelerators the kernels give NaN)."""
        rows = self.rows
        if rows is None or self.frequencies is not None or torch.compiler.is_compiling() or rows.is_inference():
            return  # inference tensors carry no version: an edit of one made under inference_mode meets the kernel's
            # own bounds check (a RuntimeError naming the position), never memory outside the table
        if rows._version != getattr(self, "_rows_version", None):
            self._check_row_range(rows)

    def _check_row_range(self, rows: torch.Tensor) -> None:
        """Every row inside the table (:func:`check_row_range`), and the rows' version that passed."""
        check_row_range(rows, self.cos.shape[0])
        if not torch.compiler.is_compiling() and not rows.is_inference():  # (no version: see check_rows)
            object.__setattr__(self, "_rows_version", rows._version)

    @property
    def requires_grad(self) -> bool:
        """Whether any of the tables (the keys' own included) requires grad (learnable frequencies).

        Example:
            >>> RotaryTables.unchecked(torch.ones(3, 8), torch.zeros(3, 8), False).requires_grad
            False
        """
        return any(t is not None and t.requires_grad for t in (self.cos, self.sin, self.k_cos, self.k_sin))

    @property
    def rotary_dim(self) -> int:
        """Channels rotated ``r``."""
        return self.cos.shape[-1]

    @property
    def addressing(self) -> str:
        """``"shared"`` (``[S, r]``), ``"per_token"`` (``[B, S, r]``) or ``"indexed"`` (``rows`` into ``[N, r]``)."""
        if self.rows is not None:
            return "indexed"
        return "shared" if self.cos.dim() - (self.heads is not None) == 2 else "per_token"

    def key_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys' ``(cos, sin)``: ``k_cos``/``k_sin`` when set, else the queries'."""
        if self.k_cos is None:
            return self.cos, self.sin
        return self.k_cos, self.k_sin  # type: ignore[return-value]

    def gather(self, *, keys: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens' own rows: ``[S, r]`` or ``[B, S, r]`` (``[..., H, r]`` per head)."""
        cos, sin = self.key_tables() if keys else (self.cos, self.sin)
        if self.rows is None:
            return cos, sin
        if self.frequencies is not None or not devices.host_checks(self.rows.device):
            return gather_rows(cos, sin, self.rows, self.frequencies, self.interleaved)
        self.check_rows()
        return cos[self.rows], sin[self.rows]

    def to(self, dtype: torch.dtype) -> RotaryTables:
        """The same tables in another dtype (fp32 or float64)."""
        if dtype == self.cos.dtype:
            return self
        k_cos = None if self.k_cos is None else self.k_cos.to(dtype)
        k_sin = None if self.k_sin is None else self.k_sin.to(dtype)  # type: ignore[union-attr]
        return RotaryTables.unchecked(
            self.cos.to(dtype),
            self.sin.to(dtype),
            self.interleaved,
            self.rows,
            k_cos,
            k_sin,
            self.heads,
            self.frequencies,
        )

    def check(self, *, sample: int | None = 4, rtol: float = 1e-5, position_zero: bool = False) -> None:
        """Check that the tables are finite rotations laid out for their pairing (a host read: a GPU synchronisation).

        Args:
            sample: check this many rows spread over the table, or ``None`` for every row.
            rtol: relative tolerance between the two channels of a pair.
            position_zero: row 0 is position 0 (tables indexed by position): it is checked for cos and sin swapped
                (:func:`swapped_rows`); per-token tables are so checked in every row.

        Raises:
            rotary.errors.InputError: naming the pairing the tables were built for, a non-finite value, a table
                of zeros, or the worst cos²+sin² mismatch.
        """
        if self.cos.device.type == "meta":  # no values to check (a model built on the meta device)
            return
        if not is_number(rtol) or not 0 < rtol < 1:
            raise InputError(f"rtol must be a number in (0, 1), got {rtol!r}")
        if sample is not None:
            check_positive_int(sample, "sample")
        rows = None
        if self.rows is not None and sample is not None and not torch.compiler.is_compiling():
            # the rows the tokens read, not rows spread over a table most of which no token reads
            used = self.rows.reshape(-1)
            if used.numel() > sample:
                used = used[torch.linspace(0, used.numel() - 1, sample, device=used.device).round().long()]
            rows = used
        for cos, sin in {id(t[0]): t for t in ((self.cos, self.sin), self.key_tables())}.values():
            if not torch.compiler.is_compiling() and cos.numel():
                if position_zero:
                    check_not_swapped(cos[:1].detach(), sin[:1].detach(), "row 0 of tables indexed by position")
                elif self.rows is None:
                    check_not_swapped(cos.detach(), sin.detach(), "a row of these per-token tables")
            if rows is not None:
                cos, sin = cos[rows], sin[rows]
            check_rows(cos, sin, self.interleaved, sample, rtol)

    @classmethod
    def from_tensors(
        cls,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *,
        interleaved: bool,
        rows: torch.Tensor | None = None,
        validate: bool | str = True,
        indexed_by_position: bool = False,
    ) -> RotaryTables:
        """Tables from raw cos/sin tensors (e.g. Hugging Face's ``position_embeddings``); other float dtypes become
        fp32.

        ``validate``: ``True`` a few rows on the CPU (nothing read on an accelerator: the caller's contract),
        ``"sync"`` a few rows on every device, ``"full"`` every row, ``False`` nothing. ``indexed_by_position``: row
        ``p`` is position ``p``, so row 0 is checked for cos and sin swapped (:meth:`check`).
        """
        if validate not in (True, False, "full", "sync"):
            raise InputError(
                f"validate must be True (a few rows), 'sync' (a few rows, read at once on any device), 'full' (every "
                f"row) or False, got {validate!r}"
            )
        rtol = 1e-5
        if (
            isinstance(cos, torch.Tensor)
            and isinstance(sin, torch.Tensor)
            and cos.dtype not in (torch.float32, torch.float64)
        ):
            if cos.is_floating_point() and cos.dtype.itemsize >= 2:  # bf16/fp16 (Hugging Face's tables of a bf16 model)
                # each value is within half an ulp, so cos²+sin² varies by about eps: loose enough for that,
                # tight enough that a table scaled by 1.1 is still refused
                rtol = max(rtol, torch.finfo(cos.dtype).eps / 2)
                cos, sin = cos.float(), sin.float()
            elif cos.is_floating_point():
                raise InputTypeError(
                    f"cos/sin of dtype {cos.dtype} cannot hold rotation tables; give fp32, float64, bf16 or fp16"
                )
        given = cos, sin
        tables = cls.unchecked(cos, sin, interleaved, rows)
        if not validate:
            return tables
        if validate is True and not devices.host_checks(cos.device):
            return tables  # the caller's contract on an accelerator: validate="sync" reads them at once
        # tables of the tokens' own rows (what Hugging Face hands every layer) are checked once per table: the
        # same tensors, unchanged since (version counters), with the same settings; tables indexed by rows
        # are checked at the rows each call reads
        settings = (validate, interleaved, rtol, indexed_by_position)
        once = rows is None and not torch.compiler.is_compiling()  # (a graph reads no version counters)
        if once and CHECKED.seen(*given, settings):
            return tables
        tables.check(sample=None if validate == "full" else 4, rtol=rtol, position_zero=indexed_by_position)
        if once:
            CHECKED.add(*given, settings)
        return tables


# ------------------------------------------------------------------------------------------------
# the cache


def indexed_device(device: torch.device | str) -> torch.device:
    """``device`` as a tensor's ``.device`` names it: ``"cuda"`` becomes ``cuda:<current device>``, so that
    what :meth:`rotary.RoPE.prepare` made for ``"cuda"`` is found by calls on tensors of that device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class TableCache:
    """cos/sin tables for positions ``0 .. length-1`` of one frequency set, per device and dtype; thread-safe.

    Built on the CPU in float64 and moved (devices without float64 get the same values); growth doubles the
    length up to ``limit`` rows and :data:`~rotary._limits.MAX_TABLE_BYTES`, beyond which :meth:`get` returns
    ``None`` and callers compute the rows they need. Lookups read an immutable snapshot, growth happens under a
    lock, and tables are built outside inference mode (a cache filled under it still serves training).
    """

    def __init__(
        self, inv_freq: torch.Tensor, attention_scaling: float, interleaved: bool, length: int, *, limit: int = 1 << 16
    ) -> None:
        self.inv_freq = inv_freq.detach().to("cpu", torch.float32)
        self.attention_scaling = float(attention_scaling)
        self.interleaved = interleaved
        self.limit = max(int(limit), int(length), 1)
        self.length = min(max(int(length), 1), self.limit)
        self._lock = CopyableLock()
        # (device, dtype) -> (cos, sin) [rows, r]; replaced whole, never mutated
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def cpu(self, needed_length: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """fp32 tables on the CPU, as :meth:`get` (a dictionary lookup when they already cover ``needed_length``)."""
        tables = self._tables.get(_CPU_FP32)
        if tables is not None and tables[0].shape[0] >= needed_length:
            return tables
        return self.get(_CPU, needed_length)

    def ready(
        self, device: torch.device, needed_length: int, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Tables already on ``device`` (an indexed ``torch.device``, as a tensor's ``.device`` is) with at
        least ``needed_length`` rows, or ``None``: a dictionary lookup that never grows them."""
        tables = self._tables.get((device, dtype))
        return tables if tables is not None and tables[0].shape[0] >= needed_length else None

    def get(
        self, device: torch.device | str, needed_length: int, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Tables ``[>= needed_length, r]`` on ``device``, or ``None`` past ``limit`` rows or the memory budget."""
        if needed_length > self.limit:
            return None
        device = indexed_device(device)
        key = (device, dtype)
        tables = self._tables.get(key)
        if tables is not None and tables[0].shape[0] >= needed_length:
            return tables
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            have = 0 if tables is None else tables[0].shape[0]
            raise InputError(
                f"rotary: the cos/sin tables on {device} hold {have} rows but this call needs {needed_length}, and "
                "they "
                "cannot grow while a CUDA graph is being captured (growing allocates and copies from the host); "
                f"call rope.prepare({needed_length}, device={str(device)!r}) (or RoPE(..., max_position=...)) before "
                "capturing"
            )
        with self._lock, torch.inference_mode(False):
            tables = self._tables.get(key)
            if tables is not None and tables[0].shape[0] >= needed_length:
                return tables  # another thread grew it meanwhile
            length = self.length
            while length < needed_length:
                length *= 2
            length = min(length, self.limit)
            if 2 * length * 2 * self.inv_freq.numel() * dtype.itemsize > MAX_TABLE_BYTES:
                return None  # cos and sin [length, r] past the memory budget: callers compute the rows a call needs
            cpu = self._tables.get((torch.device("cpu"), dtype))
            if cpu is None or cpu[0].shape[0] < length:
                cpu = cos_sin_table(
                    torch.arange(length),
                    self.inv_freq,
                    attention_scaling=self.attention_scaling,
                    interleaved=self.interleaved,
                    dtype=dtype,
                )
                self._tables[(torch.device("cpu"), dtype)] = cpu
            tables = cpu if device.type == "cpu" else (cpu[0].to(device), cpu[1].to(device))
            self._tables[key] = tables
            self.length = max(self.length, length)
            return tables
