"""The checks of cos/sin tables a caller made (:meth:`rotary.tables.RotaryTables.from_tensors`,
:func:`rotary.check_tables`): rows inside the table, finite rotations laid out for the pairing, and
the exact signature of a swapped ``(sin, cos)`` pair (:func:`swapped_rows`). On the CPU they read the
values and raise; on an accelerator nothing is read (a read would synchronise): tables made there
are the caller's contract, and ``validate="sync"`` reads a few rows at once.
"""

from __future__ import annotations

import threading
import weakref

import torch

from . import devices
from .errors import InputError

__all__ = ["CHECKED", "CheckedTables", "check_not_swapped", "check_row_range", "check_rows", "swapped_rows"]

_PAIRING = {True: "interleaved (pairs 2i, 2i+1)", False: "half (pairs i, i + r/2)"}


def check_row_range(rows: torch.Tensor, table_rows: int) -> None:
    """Every row inside the table, checked on the CPU; on an accelerator the caller's contract (outside: NaN)."""
    if torch.compiler.is_compiling() or not rows.numel() or not devices.host_checks(rows.device):
        return  # on accelerators the kernels give NaN for a row outside the table, never read it
    low, high = (int(v) for v in torch.aminmax(rows))
    if low < 0 or high >= table_rows:
        raise InputError(
            f"rows must index the cos/sin table of {table_rows} rows (0 .. {table_rows - 1}), got rows from {low} to "
            f"{high}; build the tables for the positions you rotate"
        )


def _sample_rows(t: torch.Tensor, sample: int | None) -> torch.Tensor:
    """``t`` as ``[rows, r]`` (per-head tables fold heads into rows), ``sample`` rows spread over it."""
    flat = t.reshape(-1, t.shape[-1])
    if sample is None or flat.shape[0] <= sample:
        return flat
    # evenly spaced, always including the last row (the largest position of a cached table)
    idx = torch.linspace(0, flat.shape[0] - 1, sample, device=flat.device).round().long()
    return flat[idx]


def swapped_rows(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Which rows of ``cos``/``sin`` ``[..., r]`` carry the exact signature of a swapped pair (bool ``[...]``, no read).

    A swapped row has every ``cos`` 0 and every ``sin`` one same non-zero magnitude: position 0 of a real table
    passed as ``(sin, cos)``; no real table's row turns every pair by exactly ±90°.

    Example:
        >>> from rotary.tables import cos_sin_table
        >>> cos, sin = cos_sin_table(torch.arange(3), torch.tensor([1.0, 0.1]))
        >>> swapped_rows(sin, cos).tolist(), swapped_rows(cos, sin).tolist()
        ([True, False, False], [False, False, False])
    """
    magnitude = sin.abs()
    return (cos == 0).all(-1) & (magnitude == magnitude[..., :1]).all(-1) & (magnitude[..., 0] > 0)


def check_not_swapped(cos: torch.Tensor, sin: torch.Tensor, where: str) -> None:
    """Raise when a row has the signature of cos and sin swapped (:func:`swapped_rows`); channel 0 first."""
    if not bool(((cos[..., 0] == 0) & (sin[..., 0] != 0)).any()):
        return
    if bool(swapped_rows(cos, sin).any()):
        raise InputError(
            f"cos and sin swapped: at position 0 ({where}) a cos table holds the attention scaling and a sin table "
            "0, but here cos is 0 and sin is not in every pair; pass cos first (apply_rotary(x, cos, sin, ...))"
        )


def _pairs(t: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (t[..., 0::2], t[..., 1::2]) if interleaved else t.chunk(2, dim=-1)


def check_rows(cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, sample: int | None, rtol: float) -> None:
    """The values of ``sample`` rows (every row for ``None``): finite, not all zero, laid out for the pairing,
    cos²+sin² constant. Every figure the checks need is computed on the device and read in one transfer."""
    if torch.compiler.is_compiling() or not cos.numel():
        return
    c, s = _sample_rows(cos.detach(), sample).double(), _sample_rows(sin.detach(), sample).double()
    norm = c * c + s * s

    def mismatch(inter: bool) -> torch.Tensor:
        (ca, cb), (sa, sb) = _pairs(c, inter), _pairs(s, inter)
        return torch.maximum((ca - cb).abs().max(), (sa - sb).abs().max())

    finite, top, largest, wanted, other, spread = torch.stack(
        (
            (torch.isfinite(c).all() & torch.isfinite(s).all()).double(),
            norm.max(),
            torch.maximum(c.abs().max(), s.abs().max()),
            mismatch(interleaved),
            mismatch(not interleaved),
            (norm - norm.flatten()[0]).abs().max(),
        )
    ).tolist()
    if not finite:
        raise InputError("cos/sin hold NaN or inf values: these are not rotation tables")
    if top == 0.0:
        raise InputError("cos/sin are all zeros: cos²+sin² must be the (constant) attention scaling squared, not 0")
    tol = rtol * max(largest, 1e-30)
    if wanted > tol:
        if other <= tol:
            raise InputError(
                f"cos/sin are laid out for the {_PAIRING[not interleaved]} pairing but interleaved={interleaved} "
                f"was requested; build them with RoPE(..., interleaved={interleaved}) or pass "
                f"interleaved={not interleaved}"
            )
        raise InputError(
            f"cos/sin fit neither pairing: the two channels of a pair differ by up to {wanted:.3g} for the "
            f"{_PAIRING[interleaved]} pairing (half-width tables such as cos[:, 0::2] rotate the wrong channels)"
        )
    if spread > 10 * rtol * top:
        raise InputError(
            f"cos²+sin² is not constant over the table (spread {spread:.3g}): these are not rotation tables"
        )


class CheckedTables:
    """Caller tables that passed :meth:`RotaryTables.check`, by weak identity and ``_version``; bounded, thread-safe."""

    LIMIT = 1024

    def __init__(self) -> None:
        self._entries: dict[int, tuple] = {}
        self._lock = threading.Lock()

    def seen(self, cos: torch.Tensor, sin: torch.Tensor, settings: tuple) -> bool:
        entry = self._entries.get(id(cos))
        return (
            entry is not None
            and entry[0]() is cos
            and entry[1]() is sin
            and entry[2] == (cos._version, sin._version)
            and entry[3] == settings
        )

    def add(self, cos: torch.Tensor, sin: torch.Tensor, settings: tuple) -> None:
        if type(cos) is not torch.Tensor or type(sin) is not torch.Tensor:
            return  # subclasses (fake tensors, wrappers): never remembered
        key = id(cos)
        entries = self._entries

        def forget(_: object) -> None:  # when either tensor is freed
            entry = entries.get(key)
            if entry is not None and (entry[0]() is None or entry[1]() is None):
                entries.pop(key, None)

        with self._lock:
            while len(entries) >= self.LIMIT:
                entries.pop(next(iter(entries)))
            entries[key] = (weakref.ref(cos, forget), weakref.ref(sin, forget), (cos._version, sin._version), settings)


#: the caller tables checked so far (:meth:`rotary.tables.RotaryTables.from_tensors`)
CHECKED = CheckedTables()
