"""The table side of :class:`rotary.RoPE`: frequencies + schedule + table cache -> ``tables(positions)``.

    positions ──► TableSource.tables(positions) ──► RotaryTables
                  (frequencies of the call,
                   cached rows or computed rows)

:class:`TableSource` holds what ``RoPE`` is made of (frequencies, learnable factors, the read-only
``inv_freq`` buffer, the length schedule, the per-device table caches) and hands out tables;
:class:`rotary.RoPE` adds the constructors from configs and the rotation (``forward``, ``rotate``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from torch import nn

from . import devices
from . import positions as P
from ._checks import check_bool, check_choice, check_positive_int
from ._limits import MAX_TABLE_BYTES, check_bytes
from ._sync import CopyableLock
from .errors import InputError, InputTypeError
from .frequencies import Frequencies, frequencies
from .plans import PlanCache
from .positions import Positions
from .schedule import FrequencySchedule
from .tables import RotaryTables, TableCache, cos_sin_table, indexed_device, row_frequencies

__all__ = ["CACHE_ROWS", "TableSource", "keep_float32"]

#: rows a table cache grows to at most; positions beyond get their rows computed per call
CACHE_ROWS = 1 << 16

#: what to do instead of editing ``rope.inv_freq``, for the errors saying it is read-only
_OTHER_FREQUENCIES = (
    "to rotate with other frequencies build a new RoPE (rotary.RoPE(head_dim, base=..., scaling={...}) or "
    "rope.with_scaling({...})), or train them with learnable_frequencies=True"
)


def _made(
    cos: torch.Tensor,
    sin: torch.Tensor,
    interleaved: bool,
    rows: torch.Tensor | None = None,
    frequencies: torch.Tensor | None = None,
) -> RotaryTables:
    """:class:`RotaryTables` of a :class:`TableSource`'s own making (its cache, or rows it computed from its
    frequencies), valid by construction: their structure is not checked again (rows the host knows lie inside
    the cache, grown to cover them). Under ``torch.compile``, :meth:`RotaryTables.unchecked`, which dynamo traces."""
    if torch.compiler.is_compiling():
        return RotaryTables.unchecked(cos, sin, interleaved, rows=rows, frequencies=frequencies)
    tables = object.__new__(RotaryTables)
    tables.__dict__.update(
        cos=cos,
        sin=sin,
        interleaved=interleaved,
        rows=rows,
        k_cos=None,
        k_sin=None,
        heads=None,
        frequencies=frequencies,
    )
    return tables


def keep_float32(parameters: Sequence[nn.Parameter], apply: Callable[[], Any]) -> None:
    """Run ``apply`` (a module's ``nn.Module._apply``) and keep ``parameters`` fp32 with their values.

    ``model.to(torch.bfloat16)`` would round learned frequencies to bf16 (angles off by up to 0.4%); the same
    ``Parameter`` objects keep their fp32 values and follow device moves.

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> keep_float32([m.weight], lambda: torch.nn.Module._apply(m, lambda t: t.to(torch.bfloat16)))
        >>> m.weight.dtype, m.bias.dtype
        (torch.float32, torch.bfloat16)
    """
    # detached aliases: _apply swaps the storage of the parameter and of its grad, not of these
    saved = [(p, p.detach(), None if p.grad is None else p.grad.detach()) for p in parameters]
    apply()
    for p, data, grad in saved:
        if p.dtype == torch.float32:
            continue  # a device move or to_empty(): nothing to undo
        p.grad = None  # a grad of the cast dtype could not be assigned back beside fp32 data
        p.data = data.to(p.device)
        if grad is not None:
            p.grad = grad.to(p.device, torch.float32)


class TableSource(nn.Module):
    """Frequencies, length schedule and table caches of a :class:`rotary.RoPE` (its arguments), and their tables."""

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        base: float | None = None,
        rotary_dim: int | None = None,
        scaling: Mapping[str, Any] | None = None,
        interleaved: bool = False,
        max_position: int = 2048,
        dynamic: Literal["hf", "stateless"] = "hf",
        strict: bool = True,
        learnable_frequencies: bool = False,
    ) -> None:
        super().__init__()
        check_positive_int(max_position, "max_position")
        check_choice(dynamic, "dynamic", ("hf", "stateless"))
        # deep copies: a scaling dict edited by the caller afterwards must not change this RoPE
        self._frequency_args: dict[str, Any] = dict(
            # the block as given (a string is frequencies()' ConfigError, not a dict-conversion error)
            head_dim=head_dim,
            base=base,
            rotary_dim=rotary_dim,
            scaling=copy.deepcopy(scaling),
            strict=check_bool(strict, "strict"),
        )
        original = frequencies(**self._frequency_args)
        if not check_bool(learnable_frequencies, "learnable_frequencies"):  # learnable: tables never cached
            # the first call builds rows 0 .. max_position - 1 (fp32 cos and sin [max_position, r]): refuse a
            # size that cannot be built here, before torch's allocator fails on the first call
            fits = MAX_TABLE_BYTES // (8 * original.rotary_dim)
            check_bytes(
                8 * max_position * original.rotary_dim,
                f"RoPE(max_position={max_position}) with rotary_dim={original.rotary_dim}: its cos/sin table cache, "
                "built on the first call,",
                f"use max_position <= {fits} (it is the length of the table cache, not a limit on positions: rows "
                "of positions past the cache are computed per call)",
                limit=MAX_TABLE_BYTES,
            )
        self.original_freqs: Frequencies = original
        self.freqs: Frequencies = original  # the frequencies of the latest call (length-dependent types)
        self.interleaved = check_bool(interleaved, "interleaved")
        self.max_position = max_position
        self.dynamic = dynamic
        self.schedule = FrequencySchedule(self._frequency_args, original, dynamic)
        self._device_inv_freq: dict[tuple[int, torch.device], tuple[Frequencies, torch.Tensor]] = {}
        self._device_row_freqs: dict[tuple[int, torch.device], tuple[Frequencies, torch.Tensor]] = {}
        self.register_buffer("inv_freq", None, persistent=False)
        self._set_inv_freq(original.inv_freq)
        self._caches: dict[str, TableCache] = {}
        self._caches_lock = CopyableLock()
        self._plans = PlanCache()  # rotary.RoPE's plans by call signature (rotary.plans)
        self.learnable_frequencies = check_bool(learnable_frequencies, "learnable_frequencies")
        self.log_frequency_scale: nn.Parameter | None = None
        if learnable_frequencies:
            if self.schedule.length_dependent:
                raise InputError(
                    f"learnable_frequencies=True cannot be combined with rope_type {original.rope_type!r}: its "
                    "frequencies are recomputed for each sequence length, so a learned factor per pair would "
                    "multiply different frequencies from call to call. Use a static type (default, linear, yarn, "
                    "llama3, ntk, proportional) or learnable_frequencies=False"
                )
            # α of θ_i · exp(α_i); fp32 whatever the model's dtype (see _apply)
            self.log_frequency_scale = nn.Parameter(
                torch.zeros(original.rotary_dim // 2)
            )  # meta under torch.device("meta")
            self.reset_parameters()

    def __setstate__(self, state: dict) -> None:  # a RoPE pickled before plans existed gets an empty cache
        super().__setstate__(state)
        if "_plans" not in self.__dict__:
            self._plans = PlanCache()

    def reset_parameters(self) -> None:
        """Learnable frequencies back to the configured ones (``α = 0``), e.g. after ``to_empty()`` on the meta
        device.
        """
        if self.log_frequency_scale is not None:
            with torch.no_grad():
                self.log_frequency_scale.zero_()

    @property
    def learned_inv_freq(self) -> torch.Tensor:
        """The frequencies in use, fp32 ``[rotary_dim // 2]``, detached: ``θ_i · exp(α_i)`` if learnable, else
        ``inv_freq``.

        Example:
            >>> rope = RoPE(8, learnable_frequencies=True)
            >>> torch.equal(rope.learned_inv_freq, rope.inv_freq)  # α starts at 0
            True
        """
        if self.log_frequency_scale is None:
            return self.inv_freq
        with torch.no_grad():
            return (
                self.freqs.inv_freq.to(self.inv_freq.device).double() * self.log_frequency_scale.double().exp()
            ).float()

    @property
    def head_dim(self) -> int:
        return self.original_freqs.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.original_freqs.rotary_dim

    @property
    def attention_scaling(self) -> float:
        return self.freqs.attention_scaling

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # nn.Module.to(dtype) casts every floating buffer; frequencies must stay fp32 (a bf16
        # inv_freq is off by up to 0.4% and every angle with it). Restore the exact values, also
        # after to_empty() (models built on the meta device); learned ones keep their learned values.
        learned = [] if self.log_frequency_scale is None else [self.log_frequency_scale]
        keep_float32(learned, lambda: super(TableSource, self)._apply(fn, recurse))
        self._set_inv_freq(self.freqs.inv_freq)
        self._plans.clear()
        return self

    # inv_freq, read-only -------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name == "inv_freq" and "inv_freq" in self.__dict__.get("_buffers", ()):
            self._set_inv_freq(self.freqs.inv_freq)  # `rope.inv_freq /= 4` has already divided it in place
            raise AttributeError(
                f"rope.inv_freq is read-only: this RoPE computes with the frequencies it was made with (rope.freqs), "
                f"so a new value would be ignored; {_OTHER_FREQUENCIES}"
            )
        super().__setattr__(name, value)

    def _set_inv_freq(self, inv_freq: torch.Tensor) -> None:
        """Make the buffer a copy of ``inv_freq`` on its device, its version counter noted for
        :meth:`_check_inv_freq`.
        """
        old = self._buffers.get("inv_freq")
        copy_ = inv_freq.detach().to(old.device if old is not None else inv_freq.device, copy=True)
        copy_._rotary_version = copy_._version  # in-place ops bump it, also through views and detach()
        self._buffers["inv_freq"] = copy_
        # the per-device copy on the module's device exists before any torch.compile trace: one made
        # while tracing would change the dict the trace guards on, and the next call would trace again
        self._inv_freq_on(self.original_freqs, copy_.device)
        self._row_frequencies_on(self.original_freqs, copy_.device)

    def _check_inv_freq(self, eager: bool = False) -> None:
        """Raise if ``inv_freq`` was edited in place (not under ``torch.compile``; ``eager=True``: known not
        compiling).
        """
        if not eager and torch.compiler.is_compiling():
            return
        buffer = self._buffers.get("inv_freq")
        if buffer is not None and getattr(buffer, "_rotary_version", None) == buffer._version:
            return
        want = self.freqs.inv_freq
        if isinstance(buffer, torch.Tensor) and buffer.shape == want.shape:
            # another tensor with the same values (a deep copy, torch.func.functional_call's buffers): mark it
            if buffer.is_meta or torch.equal(buffer.detach().to("cpu", torch.float32), want):
                buffer._rotary_version = buffer._version
                return
        self._set_inv_freq(want)
        raise RuntimeError(
            "rope.inv_freq was modified in place (e.g. rope.inv_freq.mul_(0.5)), but this RoPE computes with the "
            f"frequencies it was made with (rope.freqs), so the edit would be ignored; inv_freq is read-only and has "
            f"been restored. {_OTHER_FREQUENCIES[0].upper()}{_OTHER_FREQUENCIES[1:]}"
        )

    def extra_repr(self) -> str:
        f = self.original_freqs
        return (
            f"head_dim={f.head_dim}, rotary_dim={f.rotary_dim}, base={f.base:g}, rope_type={f.rope_type!r}, "
            f"interleaved={self.interleaved}, attention_scaling={f.attention_scaling:g}"
            + (", learnable_frequencies=True" if self.learnable_frequencies else "")
        )

    # length-dependent frequencies ----------------------------------------------------------------
    def update_length(self, seq_len: int | torch.Tensor) -> Frequencies:
        """Adapt length-dependent frequencies to positions ``0 .. seq_len - 1``
        (:class:`rotary.schedule.FrequencySchedule`).

        Returns:
            The frequencies of that call (also left in ``rope.freqs`` / ``rope.inv_freq``); static types: unchanged.

        Example:
            >>> rope = RoPE(64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8})
            >>> _ = rope.update_length(32)
            >>> bool(rope.inv_freq[-1] < rope.original_freqs.inv_freq[-1])
            True
            >>> rope.reset_length()
            >>> torch.equal(rope.inv_freq, rope.original_freqs.inv_freq)
            True
        """
        return self._freqs_for(seq_len)[0]

    def _freqs_for(self, seq_len: int | torch.Tensor) -> tuple[Frequencies, str | None]:
        freqs, key = self.schedule.freqs_for(seq_len)
        if freqs is not self.freqs:
            self.freqs = freqs
            self._set_inv_freq(freqs.inv_freq)
        return freqs, key

    def reset_length(self) -> None:
        """Forget the lengths seen (dynamic state) and return to the trained frequencies."""
        self.schedule.reset()
        self._freqs_for(0)

    def _cache(self, key: str, freqs: Frequencies) -> TableCache:
        cache = self._caches.get(key)
        if cache is None:
            with self._caches_lock:
                cache = self._caches.get(key)
                if cache is None:
                    cache = TableCache(
                        freqs.inv_freq,
                        freqs.attention_scaling,
                        self.interleaved,
                        self.max_position,
                        limit=max(CACHE_ROWS, self.max_position),
                    )
                    self._caches[key] = cache
        return cache

    # tables ----------------------------------------------------------------------------------
    def tables(self, positions: torch.Tensor | Positions, *, dtype: torch.dtype = torch.float32) -> RotaryTables:
        """The tables that rotate tokens at ``positions``.

        Args:
            positions: integer ``position_ids`` ``[S]`` or ``[B, S]`` (validated here; any int64), or a
                :class:`rotary.positions.Positions` (trusted).
            dtype: fp32, or float64 for float64 inputs (see :func:`rotary.tables.table_dtype`).

        Returns:
            :class:`~rotary.tables.RotaryTables` on the positions' device: a slice of the cache, the cache with
            per-token rows, or rows computed for these positions.

        Example:
            >>> rope = RoPE(8)
            >>> rope.tables(torch.tensor([[0, 0, 1, 2]])).addressing  # left padding: rows into the cache
            'indexed'
        """
        if not isinstance(positions, Positions):  # any int64 is a rotation (a negative one by its negative angle)
            positions = P.from_ids(positions, kernel_checked=True)
        if positions.axes != 1:
            raise InputError(
                f"positions have {positions.axes} coordinate axes but this RoPE is 1-D; use rotary.AxialRoPE "
                "(or the M-RoPE variant) for N-D positions"
            )
        if dtype not in (torch.float32, torch.float64):
            raise InputTypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        self._check_inv_freq()
        compiling = torch.compiler.is_compiling()
        freqs, key = self.original_freqs, "original"
        if self.schedule.length_dependent and positions.ids.numel():
            # transformers passes max(position_ids) + 1, exact; an upper bound (padding) is not enough
            length = positions.bound if positions.bound is not None and positions.exact else positions.ids.max() + 1
            freqs, key = self._freqs_for(length)
        ids = positions.ids
        learned = self.log_frequency_scale
        bound = positions.bound
        if bound is None and not devices.host_checks(ids.device) and not compiling:
            # ids on an accelerator, not read: the cached table as it is (at least max_position rows,
            # or what prepare() sized); the kernel computes the row of a position the table does not hold
            bound = -1
        uncached = compiling or key is None or bound is None or learned is not None
        cache = None if uncached else self._cache(key, freqs)  # type: ignore[arg-type]
        needed = cache.length if cache is not None and bound == -1 else bound
        cached = None if cache is None else cache.get(ids.device, needed, dtype)  # type: ignore[arg-type]
        if cached is None:  # rows for exactly these tokens (after the cache, which names a growth in a capture)
            inv_freq = self._inv_freq_on(freqs, ids.device)
            if learned is not None:  # θ_i · exp(α_i), differentiable in α: computed per call, never cached
                inv_freq = inv_freq.double() * learned.double().exp()
            cos, sin = cos_sin_table(
                ids, inv_freq, attention_scaling=freqs.attention_scaling, interleaved=self.interleaved, dtype=dtype
            )
            if positions.packed:  # packed x addresses rows; here row t is token t
                return _made(cos, sin, self.interleaved, torch.arange(ids.shape[0], device=ids.device))
            return _made(cos, sin, self.interleaved)
        cos, sin = cached
        if positions.start is not None:  # consecutive positions: a slice of the cache, nothing gathered
            end = positions.start + ids.shape[0]
            return _made(cos[positions.start : end], sin[positions.start : end], self.interleaved)
        if bound != -1:  # the host knows the ids: the cache covers them
            return _made(cos, sin, self.interleaved, ids)
        # ids not read: a row the cache does not hold (past it, or negative) is computed by the kernel
        frequencies = self._row_frequencies_on(freqs, ids.device)  # type: ignore[arg-type]
        return _made(cos, sin, self.interleaved, ids, frequencies)

    def _row_frequencies_on(self, freqs: Frequencies, device: torch.device) -> torch.Tensor:
        """:func:`rotary.tables.row_frequencies` of ``freqs`` on ``device``, made once per device."""
        device = indexed_device(device)
        key = (id(freqs), device)
        found = self._device_row_freqs.get(key)
        if found is None or found[0] is not freqs:
            found = (freqs, row_frequencies(freqs.inv_freq, freqs.attention_scaling, device))
            self._device_row_freqs[key] = found
        return found[1]

    def _inv_freq_on(self, freqs: Frequencies, device: torch.device) -> torch.Tensor:
        """``freqs.inv_freq`` on ``device``, a copy made once per device (not the buffer, which users may change)."""
        device = indexed_device(device)
        key = (id(freqs), device)
        found = self._device_inv_freq.get(key)
        if found is None or found[0] is not freqs:
            found = (freqs, freqs.inv_freq.to(device))
            self._device_inv_freq[key] = found
        return found[1]

    def prepare(
        self, max_position: int, *, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
    ) -> TableSource:
        """Build the cached tables for positions ``0 .. max_position - 1`` on ``device`` now; returns ``self``.

        An optimisation, never needed for correctness: do it before capturing a CUDA graph (growing the cache allocates
        and copies), for the longest position a run usually sees.

        Args:
            max_position: rows to cache.
            device, dtype: where the tables live (default: the module's device); fp32 (default) or float64.

        Example:
            >>> rope = RoPE(64).prepare(8192)
            >>> rope.tables(torch.arange(8192)).cos.shape
            torch.Size([8192, 64])
        """
        check_positive_int(max_position, "max_position")
        if dtype not in (torch.float32, torch.float64):
            raise InputTypeError(f"table dtype must be torch.float32 or torch.float64, got {dtype}")
        device = indexed_device(self.inv_freq.device if device is None else device)
        if self.schedule.length_dependent or self.log_frequency_scale is not None:
            return self  # tables of these are computed per call, never cached
        cache = self._cache("original", self.original_freqs)
        if max_position > cache.limit:
            raise InputError(
                f"prepare(max_position={max_position}) asks for more rows than the cache holds ({cache.limit}); "
                f"build the RoPE with max_position >= {max_position}"
            )
        cache.get(device, max_position, dtype)
        self._inv_freq_on(self.original_freqs, device)
        self._row_frequencies_on(self.original_freqs, device)
        return self

    def cos_sin(
        self, position_ids: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables for ``position_ids``, laid out for this module's pairing, times ``attention_scaling``.

        Args:
            position_ids: integer ``[S]`` or ``[B, S]``, >= 0.
            dtype: fp32, or float64 for float64 inputs.

        Returns:
            ``(cos, sin)`` in ``dtype``, ``[S, rotary_dim]`` or ``[B, S, rotary_dim]``, on ``position_ids.device``.

        Example:
            >>> cos, sin = RoPE(8).cos_sin(torch.arange(3))
            >>> cos.shape, cos.dtype
            (torch.Size([3, 8]), torch.float32)
        """
        return self.tables(position_ids, dtype=dtype).gather()
