"""KV caches of an attention layer: :class:`KVCache`, grown by concatenation, and :class:`StaticKVCache`,
preallocated and written in place.

Both hold keys already rotated: a key is rotated once, when it enters the cache, at its own position.
:class:`StaticKVCache` keeps the same shapes at every step (capturable): ``max_len`` slots, a write index
``filled`` on the device, a mask ``valid`` over the slots; nothing is read on the host, so an overflow is an
error only on the CPU (elsewhere NaN outputs). :class:`StaticStep` shares the slots and mask between the layers
of one model forward. The design: docs/attention.md, "Static KV cache".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import torch

from .. import devices
from .. import positions as P
from .._checks import check_int, check_positive_int
from .._limits import MAX_NUM_HEADS
from ..errors import InputError, InputTypeError
from ..positions import Positions, check_attention_mask
from ..serving import rotate_and_cache
from ..tables import RotaryTables

__all__ = ["KVCache", "StaticEntries", "StaticKVCache", "StaticStep"]

T = TypeVar("T")


@dataclass
class KVCache:
    """Keys (rotated), values and key positions of one attention layer, grown by :meth:`update`.

    A cache belongs to the first layer that fills it. ``keys`` ``[B, Hk, T, D]`` (None before the first call),
    ``values`` ``[B, Hk, T, Dv]``, ``positions`` int64 ``[B, T]``; every position is ``< bound`` (a host int),
    ``exact`` when ``bound`` is the largest + 1.
    """

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    positions: torch.Tensor | None = field(default=None)
    bound: int | None = None
    exact: bool = True
    owner: int | None = field(default=None, repr=False)

    @property
    def length(self) -> int:
        """Number of cached tokens ``T``."""
        return 0 if self.keys is None else self.keys.shape[2]

    def _check_state(self) -> None:
        parts = (self.keys, self.values, self.positions)
        if any(p is None for p in parts) and any(p is not None for p in parts):
            raise InputError(
                "this KVCache has some of keys / values / positions but not all; start from KVCache() "
                "(or Decoder.new_cache()) and let the attention layer fill it"
            )
        if self.keys is not None:  # filled by hand: the three must describe the same tokens
            try:
                _check_entries(self.keys, self.values, self.positions, "cached ")  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise type(exc)(
                    f"this KVCache is inconsistent: {exc}; start from KVCache() and let the attention layer fill it"
                ) from None

    def claim(self, owner: object) -> None:
        """Mark the cache as ``owner``'s; raise if another layer filled it."""
        if self.owner is None:
            self.owner = id(owner)
        elif self.owner != id(owner):
            raise InputError(
                "this KVCache already holds another layer's keys: every attention layer needs its own cache "
                "(use Decoder.new_cache() or [KVCache() for _ in layers], not [KVCache()] * n)"
            )

    def update(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | Positions
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append ``keys`` ``[B, Hk, S, D]``, ``values`` and ``positions`` ``[B, S]``; return all cached."""
        self._check_state()
        _check_entries(keys, values, None, "new ")
        batch, seq_len = keys.shape[0], keys.shape[2]
        if not isinstance(positions, Positions):
            positions = P.from_ids(positions, batch=batch, seq_len=seq_len, device=keys.device)
        elif (
            positions.axes != 1
            or positions.packed
            or positions.seq_len != seq_len
            or positions.batch not in (None, 1, batch)
        ):
            raise InputError(
                f"positions must be 1-D positions [S] or [B, S] of the {seq_len} new keys (batch {batch}), got ids of "
                f"shape {tuple(positions.ids.shape)}"
            )
        bound, exact = positions.bound, positions.exact
        positions = positions.ids.to(keys.device).expand(batch, seq_len)
        if self.keys is None:
            self.keys, self.values, self.positions, self.bound, self.exact = keys, values, positions, bound, exact
        else:
            assert self.values is not None and self.positions is not None  # _check_state
            if (
                keys.shape[0] != self.keys.shape[0]
                or keys.shape[1] != self.keys.shape[1]
                or keys.shape[3] != self.keys.shape[3]
            ):
                raise InputError(
                    f"new keys {tuple(keys.shape)} do not match the cache {tuple(self.keys.shape)} in batch, heads or "
                    "head_dim; use a fresh KVCache for another batch or layer"
                )
            if (
                keys.dtype != self.keys.dtype
                or keys.device != self.keys.device
                or values.shape[-1] != self.values.shape[-1]
            ):
                raise InputError(
                    f"new keys/values ({keys.dtype}, {keys.device}, value dim {values.shape[-1]}) do not match the "
                    f"cache ({self.keys.dtype}, {self.keys.device}, value dim "
                    f"{self.values.shape[-1]}); use a fresh KVCache"
                )
            self.keys = torch.cat((self.keys, keys), dim=2)
            self.values = torch.cat((self.values, values), dim=2)
            self.positions = torch.cat((self.positions, positions), dim=1)
            self.bound = None if self.bound is None or bound is None else max(self.bound, bound)
            self.exact = self.exact and exact
        return self.keys, self.values, self.positions

    def next_positions(self, seq_len: int) -> Positions:
        """Positions ``[B, S]`` that continue each row after its last cached position."""
        self._check_state()
        if self.positions is None or self.positions.shape[-1] == 0:
            raise InputError("the KVCache is empty: there is no position to continue from; pass position_ids")
        return P.continuation(Positions.unchecked(self.positions, self.bound, exact=self.exact), seq_len)


class StaticEntries(NamedTuple):
    """What :meth:`StaticKVCache.update` hands the attention layer: every slot, and where the new tokens went.

    ``keys`` ``[B, Hk, L, D]`` (unfilled slots hold stale data the mask hides), ``values`` ``[B, Hk, L, Dv]``,
    ``positions`` int64 ``[B, L]``, ``valid`` bool ``[B, L]``, ``start`` the first new slot (int64 0-dim), ``overflow``
    bool ``[S]``, the new tokens that did not fit (outputs NaN; ``None`` on the CPU).
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    start: torch.Tensor
    overflow: torch.Tensor | None


class StaticKVCache:
    """A preallocated KV cache of one attention layer, the same shapes at every step (see the module docstring).

    Args:
        batch, num_kv_heads, max_len: ``B``, ``Hk``, slots ``L`` (prompt and new tokens, padding included).
        head_dim, value_dim: ``D`` and ``Dv`` (default ``D``).
        dtype, device: of the buffers (default CPU; on ``"meta"`` every call gives meta tensors).

    ``keys``, ``values``, ``positions`` and ``valid`` are views of every slot; ``filled`` (int64 0-dim, on
    ``device``) is the next write index. Raises ``rotary.errors.InputError`` (CPU) when writing past ``max_len``, or
    for keys or values that require grad in grad mode (use :class:`KVCache` to backpropagate).

    Example:
        >>> from rotary.nn import RotaryAttention, StaticKVCache
        >>> attn = RotaryAttention(64, 8, num_kv_heads=2, causal=True).eval()
        >>> x = torch.randn(2, 10, 64)
        >>> cache = StaticKVCache(2, 2, 16, 8)  # batch 2, 2 KV heads, 16 slots, head_dim 8
        >>> with torch.no_grad():
        ...     full = attn(x)
        ...     steps = [attn(x[:, :4], cache=cache)] + [attn(x[:, i : i + 1], cache=cache) for i in range(4, 10)]
        >>> torch.allclose(full, torch.cat(steps, dim=1), atol=1e-5), int(cache.filled), tuple(cache.keys.shape)
        (True, 10, (2, 2, 16, 8))
    """

    def __init__(
        self,
        batch: int,
        num_kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        value_dim: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        for name, value in (
            ("batch", batch),
            ("num_kv_heads", num_kv_heads),
            ("max_len", max_len),
            ("head_dim", head_dim),
        ):
            check_positive_int(value, name)
        value_dim = head_dim if value_dim is None else check_positive_int(value_dim, "value_dim")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputTypeError(f"dtype must be a floating torch.dtype (the layer's activations), got {dtype!r}")
        if num_kv_heads > MAX_NUM_HEADS:
            raise InputError(
                f"num_kv_heads={num_kv_heads} is more than {MAX_NUM_HEADS}; pass the number of key/value heads"
            )
        device = torch.device("cpu") if device is None else torch.device(device)
        self.batch, self.num_kv_heads, self.max_len = int(batch), int(num_kv_heads), int(max_len)
        self.head_dim, self.value_dim, self.dtype = int(head_dim), int(value_dim), dtype
        self.owner: int | None = None
        #: caches made together for the layers of one model (``Decoder.new_cache``) share this token: the model
        #: writes all of them at every forward, so their filled slots, positions and padding stay equal. A write
        #: without the model's ``step`` (a layer called alone) takes the cache out of its group (see _next_slots)
        self.group: object | None = None
        # one slot more than max_len: on accelerators tokens past the end are written there (never read)
        # instead of being checked on the host; made outside inference mode so that any mode may write them
        with torch.inference_mode(False), torch.no_grad():
            self._keys = torch.zeros(batch, num_kv_heads, max_len + 1, head_dim, dtype=dtype, device=device)
            self._values = torch.zeros(batch, num_kv_heads, max_len + 1, value_dim, dtype=dtype, device=device)
            self._positions = torch.zeros(batch, max_len + 1, dtype=torch.int64, device=device)
            self._valid = torch.zeros(batch, max_len + 1, dtype=torch.bool, device=device)
            self.filled = torch.zeros((), dtype=torch.int64, device=device)
        self.device = self.filled.device
        for buffer in (self._keys, self._values, self._positions, self._valid, self.filled):
            # written in place by a compiled step: fixed addresses let CUDA graphs (reduce-overhead) keep them
            torch._dynamo.mark_static_address(buffer)

    def __repr__(self) -> str:
        return (
            f"StaticKVCache(batch={self.batch}, num_kv_heads={self.num_kv_heads}, max_len={self.max_len}, "
            f"head_dim={self.head_dim}, value_dim={self.value_dim}, dtype={self.dtype}, device={self.device})"
        )

    @property
    def keys(self) -> torch.Tensor:
        """``[B, Hk, L, D]`` rotated keys of every slot."""
        return self._keys[:, :, : self.max_len]

    @property
    def values(self) -> torch.Tensor:
        """``[B, Hk, L, Dv]`` values of every slot."""
        return self._values[:, :, : self.max_len]

    @property
    def positions(self) -> torch.Tensor:
        """int64 ``[B, L]``: the position of every slot's key."""
        return self._positions[:, : self.max_len]

    @property
    def valid(self) -> torch.Tensor:
        """bool ``[B, L]``: the slot holds a token (not padding, written)."""
        return self._valid[:, : self.max_len]

    def claim(self, owner: object) -> None:
        """Mark the cache as ``owner``'s; raise if another layer filled it."""
        if self.owner is None:
            self.owner = id(owner)
        elif self.owner != id(owner):
            raise InputError(
                "this StaticKVCache already holds another layer's keys: every attention layer needs its own cache "
                "(use Decoder.new_cache(batch=..., max_len=...) or one StaticKVCache per layer)"
            )

    def reset(self) -> None:
        """Empty the cache without reallocating (a captured step goes on working with the next batch)."""
        with torch.no_grad():
            self.filled.zero_()
            self._valid.zero_()

    def _host_mode(self) -> bool:
        """Whether values may be read on the host here (the CPU, not under ``torch.compile``)."""
        return not torch.compiler.is_compiling() and devices.host_checks(self.device)

    def _positions_of(self, ids: torch.Tensor) -> Positions:
        """Positions of validated ids: with their exact bound on the CPU (a free read), elsewhere without one."""
        if self._host_mode() and ids.numel():
            return Positions.unchecked(ids, int(ids.max()) + 1)
        return Positions.unchecked(ids, 0 if not ids.numel() else None)

    def next_positions(self, seq_len: int, attention_mask: torch.Tensor | None = None) -> Positions:
        """Positions ``[B, S]`` of ``seq_len`` new tokens, on the device: after each row's last cached position, or with
        the new tokens' 0/1 ``attention_mask`` ``[B, S]``, padding-skipping ones.

        Example:
            >>> cache = StaticKVCache(1, 1, 8, 4)
            >>> kv = torch.zeros(1, 1, 3, 4)
            >>> _ = cache.update(kv, kv, torch.tensor([[5, 6, 7]]))
            >>> cache.next_positions(2).ids.tolist()
            [[8, 9]]
        """
        seq_len = check_int(seq_len, "seq_len", minimum=0)
        steps = torch.arange(seq_len, device=self.device)
        if attention_mask is None:
            if self._host_mode() and int(self.filled) == 0:
                return P.arange(seq_len, device=self.device)  # as KVCache: tables are a slice, nothing gathered
            last = self._positions.index_select(1, (self.filled - 1).clamp(min=0).reshape(1))  # [B, 1]
            first = torch.where(self.filled > 0, last + 1, torch.zeros_like(last))
            return self._positions_of(first + steps)
        mask = check_attention_mask(attention_mask).to(self.device)
        if tuple(mask.shape) != (self.batch, seq_len):
            raise InputError(
                f"with a StaticKVCache, attention_mask covers the new tokens only: [B, S] = [{self.batch}, {seq_len}] "
                f"(the cache keeps the padding of earlier tokens), got {tuple(mask.shape)}"
            )
        before = self.valid.sum(dim=-1, keepdim=True)
        return self._positions_of((before + mask.long().cumsum(-1) - 1).clamp(min=0))

    def token_indices(self, seq_len: int) -> Positions:
        """The slot indices ``[S]`` of ``seq_len`` new tokens (for a layer that reads its own N-D positions)."""
        return self._positions_of(self.filled + torch.arange(seq_len, device=self.device))

    def update(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor | Positions,
        *,
        valid: torch.Tensor | None = None,
        step: StaticStep | None = None,
    ) -> StaticEntries:
        """Write ``S`` new tokens into slots ``filled .. filled + S - 1``; returns every slot (:class:`StaticEntries`).

        Args:
            keys, values: rotated keys ``[B, Hk, S, D]`` and values ``[B, Hk, S, Dv]``, the cache's dtype and device.
            positions: the new keys' positions ``[S]`` or ``[B, S]`` (ids or :class:`Positions`).
            valid: bool ``[B, S]``, ``False`` for padding (default: all tokens).
            step: the model forward's :class:`StaticStep`, shared by the caches of one group.

        Raises InputError on the CPU for more tokens than free slots; ValueError / TypeError for keys or values that do
        not fit the cache.
        """
        ids, valid = self._check_new(keys, values, positions, valid)
        start, slots, overflow = self._next_slots(keys.shape[2], step)
        with torch.no_grad():
            self._keys.index_copy_(2, slots, keys)
            self._values.index_copy_(2, slots, values)
        return self._commit(start, slots, overflow, ids, valid)

    def rotate_and_update(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        tables: RotaryTables,
        positions: torch.Tensor | Positions,
        *,
        valid: torch.Tensor | None = None,
        inplace: bool = False,
        step: StaticStep | None = None,
    ) -> tuple[torch.Tensor, StaticEntries]:
        """Rotate new queries and keys by ``tables`` and write as :meth:`update`, in one launch on CUDA.

        ``queries`` ``[B, H, S, D]``, ``keys`` and ``values`` unrotated; ``inplace`` rotates ``queries`` and ``keys`` in
        place; the rest as :meth:`update`. Returns ``(rotated queries, StaticEntries)``. Raises as :meth:`update`, and
        for positions outside the tables as :func:`rotary.rotate`.

        Example:
            >>> import rotary
            >>> rope, cache = rotary.RoPE(4), StaticKVCache(1, 1, 8, 4)
            >>> q, kv = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)
            >>> tables = rope.tables(torch.arange(3))
            >>> q_rot, entries = cache.rotate_and_update(q, kv, kv, tables, torch.arange(3))
            >>> torch.equal(entries.keys[:, :, :3], rope.rotate(kv)), torch.equal(q_rot, rope.rotate(q))
            (True, True)
        """
        ids, valid = self._check_new(keys, values, positions, valid)
        start, slots, overflow = self._next_slots(keys.shape[2], step)
        # the spill slot (index max_len) is a row of the buffers: rotate_and_cache writes every token
        queries, _ = rotate_and_cache(
            queries,
            keys,
            values,
            self._keys,
            self._values,
            slots.expand(self.batch, -1),
            tables,
            layout="bhsd",
            cache_layout="bhsd",
            inplace=inplace,
        )
        return queries, self._commit(start, slots, overflow, ids, valid)

    def _check_new(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | Positions, valid: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Check new keys and values against the cache; the new tokens' ids and valid flags ``[B, S]``."""
        _check_entries(keys, values, None, "new ")
        want = (self.batch, self.num_kv_heads, keys.shape[2], self.head_dim)
        if tuple(keys.shape) != want or values.shape[-1] != self.value_dim:
            raise InputError(
                f"new keys {tuple(keys.shape)} / values {tuple(values.shape)} do not fit this StaticKVCache (batch "
                f"{self.batch}, {self.num_kv_heads} KV heads, head_dim {self.head_dim}, value_dim {self.value_dim}); "
                "build the cache for this layer and batch (Decoder.new_cache(batch=..., max_len=...))"
            )
        if keys.dtype != self.dtype or keys.device != self.device:
            raise InputError(
                f"new keys are {keys.dtype} on {keys.device} but this StaticKVCache holds {self.dtype} on "
                f"{self.device}; build it with dtype={keys.dtype} and device='{keys.device}'"
            )
        if torch.is_grad_enabled() and (keys.requires_grad or values.requires_grad):
            raise RuntimeError(
                "a StaticKVCache is written in place and carries no gradient, but these keys/values require grad; "
                "decode under torch.no_grad() (or torch.inference_mode()), or use KVCache to backpropagate"
            )
        seq_len = keys.shape[2]
        if not isinstance(positions, Positions):
            positions = P.from_ids(positions, batch=self.batch, seq_len=seq_len, device=self.device)
        ids = positions.ids.to(self.device).expand(self.batch, seq_len)
        if valid is None:
            valid = torch.ones(self.batch, seq_len, dtype=torch.bool, device=self.device)
        elif valid.dtype != torch.bool or tuple(valid.shape) != (self.batch, seq_len):
            raise InputError(
                f"valid must be a bool [B, S] = [{self.batch}, {seq_len}] tensor, got "
                f"{valid.dtype} {tuple(valid.shape)}"
            )
        return ids, valid

    def _next_slots(
        self, seq_len: int, step: StaticStep | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The first new slot, the slots ``[S]`` of ``seq_len`` new tokens, and which do not fit."""
        if step is None:
            self.group = None
        elif not self._host_mode():
            return step.shared(("slots", seq_len), lambda: self._slots_after_filled(seq_len))
        return self._slots_after_filled(seq_len)

    def _slots_after_filled(self, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """:meth:`_next_slots` from this cache's own fill."""
        start = self.filled.clone()
        slots = start + torch.arange(seq_len, device=self.device)
        overflow = None
        if self._host_mode():
            end = int(start) + seq_len  # the CPU: reading is free, and the error comes where the write is
            if end > self.max_len:
                raise InputError(
                    f"this StaticKVCache has {self.max_len} slots and {int(start)} are filled: {seq_len} more token(s) "
                    f"do not fit; build it with max_len >= {end} (Decoder.new_cache(batch=..., max_len=...)), or "
                    "reset() it for a new sequence"
                )
        else:  # nothing read: tokens past the end go to the spill slot (their outputs are NaN: the caller's contract)
            overflow = slots >= self.max_len
            slots = slots.clamp(max=self.max_len)
        return start, slots, overflow

    def _commit(
        self,
        start: torch.Tensor,
        slots: torch.Tensor,
        overflow: torch.Tensor | None,
        ids: torch.Tensor,
        valid: torch.Tensor,
    ) -> StaticEntries:
        """Record the new tokens' positions and padding at ``slots`` and advance :attr:`filled`."""
        with torch.no_grad():
            self._positions.index_copy_(1, slots, ids)
            self._valid.index_copy_(1, slots, valid.to(self.device))
            self.filled.add_(slots.shape[0])
        return StaticEntries(self.keys, self.values, self.positions, self.valid, start, overflow)


class StaticStep:
    """What the layers of one model forward share over one group of :class:`StaticKVCache` s (from one ``new_cache``).

    Example:
        >>> step = StaticStep()
        >>> mask = step.shared(("mask",), lambda: torch.zeros(2))
        >>> step.shared(("mask",), lambda: torch.ones(2)) is mask  # built once per key
        True
    """

    def __init__(self) -> None:
        self._found: dict[Hashable, Any] = {}

    def shared(self, key: Hashable, build: Callable[[], T]) -> T:
        """What is stored under ``key``, built by ``build()`` on first use."""
        if key not in self._found:
            self._found[key] = build()
        return self._found[key]

    @staticmethod
    def of(caches: Sequence[object]) -> StaticStep | None:
        """A new ``StaticStep`` for ``caches`` when they are static caches of one group (else ``None``)."""
        if not caches or not all(isinstance(c, StaticKVCache) for c in caches):
            return None
        group = caches[0].group  # type: ignore[union-attr]
        if group is None or any(c.group is not group for c in caches):  # type: ignore[union-attr]
            return None
        return StaticStep()


def _check_entries(keys: object, values: object, positions: object, which: str) -> None:
    """keys ``[B, Hk, T, D]``, values ``[B, Hk, T, Dv]`` (floating, one dtype and device), int positions ``[B, T]``."""
    for name, t in (("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise InputError(
                f"{which}{name} must be a floating [B, Hk, T, D] tensor, got {getattr(t, 'shape', type(t).__name__)}"
            )
    if values.shape[:3] != keys.shape[:3]:
        raise InputError(
            f"{which}values {tuple(values.shape)} must match {which}keys {tuple(keys.shape)} in batch, heads and length"
        )
    if values.dtype != keys.dtype or values.device != keys.device:
        raise InputError(
            f"{which}keys and values must share dtype and device, got {keys.dtype} on {keys.device} and "
            f"{values.dtype} on {values.device}"
        )
    if positions is not None:
        want = (keys.shape[0], keys.shape[2])
        if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 or tuple(positions.shape) != want:
            raise InputError(
                f"{which}positions must be an int64 tensor [B, T] = {list(want)}, got "
                f"{getattr(positions, 'dtype', type(positions).__name__)} {tuple(getattr(positions, 'shape', ()))}"
            )
