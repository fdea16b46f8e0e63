"""Multi-head self-attention with RoPE on q and k, a KV cache, GQA/MQA and optional score biases.

Data flow of one call::

    hidden_states -> q, k, v projections -> rotate(q, k [and v]) by the tables of the tokens' positions
                  -> append k, v to the cache (keys stored already rotated)
                  -> scaled_dot_product_attention(q, all keys, all values, mask + bias) -> o projection

Keys are rotated once, when they enter the cache, at their own position: a cached key never needs
re-rotation because RoPE scores depend only on the positions of the two tokens. A model computes
the positions and tables once per forward and hands them to every layer (``positions=``,
``tables=``); a layer used alone computes them itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import deferred
from .. import positions as P
from .._checks import check_bool, check_causal_rope, check_int, check_positive_int, check_probability
from .._limits import MAX_NUM_HEADS
from ..errors import InputError
from ..positions import Positions, check_attention_mask
from ..rope import RoPE
from ..rotation import rotate
from ..tables import RotaryTables, table_dtype
from .position import ALiBi, RelativePositionBias

__all__ = ["KVCache", "RotaryAttention", "StaticKVCache", "padding_position_ids", "repeat_kv"]


@dataclass
class KVCache:
    """Keys (rotated), values and key positions of one attention layer, grown by :meth:`update`.

    A cache belongs to the first layer that fills it: handing the same cache to a second layer
    (``[KVCache()] * n_layers``) is an error, not a silently mixed history.

    Attributes:
        keys: ``[B, Hk, T, D]`` rotated keys, or None before the first call.
        values: ``[B, Hk, T, Dv]``.
        positions: int64 ``[B, T]`` position of every cached key (needed by ALiBi / relative biases
            and to continue positions after a left-padded prompt).
        bound: every cached position is ``< bound`` (a host int; spares reading positions back).
        exact: ``bound`` is exactly the largest position + 1.
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
            raise ValueError(
                "this KVCache has some of keys / values / positions but not all; start from KVCache() "
                "(or Decoder.new_cache()) and let the attention layer fill it"
            )
        if self.keys is not None:  # filled by hand: the three must describe the same tokens
            try:
                _check_entries(self.keys, self.values, self.positions, "cached ")  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"this KVCache is inconsistent: {exc}; start from KVCache() and let the attention layer fill it") from None

    def claim(self, owner: object) -> None:
        """Mark the cache as ``owner``'s; raise if another layer filled it."""
        if self.owner is None:
            self.owner = id(owner)
        elif self.owner != id(owner):
            raise ValueError(
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
        elif positions.axes != 1 or positions.packed or positions.seq_len != seq_len or positions.batch not in (None, 1, batch):
            raise ValueError(
                f"positions must be 1-D positions [S] or [B, S] of the {seq_len} new keys (batch {batch}), got ids of "
                f"shape {tuple(positions.ids.shape)}"
            )
        bound, exact = positions.bound, positions.exact
        positions = positions.ids.to(keys.device).expand(batch, seq_len)
        if self.keys is None:
            self.keys, self.values, self.positions, self.bound, self.exact = keys, values, positions, bound, exact
        else:
            assert self.values is not None and self.positions is not None  # _check_state
            if keys.shape[0] != self.keys.shape[0] or keys.shape[1] != self.keys.shape[1] or keys.shape[3] != self.keys.shape[3]:
                raise ValueError(
                    f"new keys {tuple(keys.shape)} do not match the cache {tuple(self.keys.shape)} in batch, heads or "
                    "head_dim; use a fresh KVCache for another batch or layer"
                )
            if keys.dtype != self.keys.dtype or keys.device != self.keys.device or values.shape[-1] != self.values.shape[-1]:
                raise ValueError(
                    f"new keys/values ({keys.dtype}, {keys.device}, value dim {values.shape[-1]}) do not match the cache "
                    f"({self.keys.dtype}, {self.keys.device}, value dim {self.values.shape[-1]}); use a fresh KVCache"
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
            raise ValueError("the KVCache is empty: there is no position to continue from; pass position_ids")
        return P.continuation(Positions.unchecked(self.positions, self.bound, exact=self.exact), seq_len)


class StaticEntries(NamedTuple):
    """What :meth:`StaticKVCache.update` hands the attention layer: every slot, and where the new tokens went.

    Attributes:
        keys: ``[B, Hk, L, D]`` rotated keys of all ``L`` slots (the slots at or past ``filled`` hold stale
            data: the mask hides them).
        values: ``[B, Hk, L, Dv]``.
        positions: int64 ``[B, L]``, the position of every slot's key.
        valid: bool ``[B, L]``: the slot holds a token (not padding, not unfilled).
        start: int64 0-dim tensor, the slot of the first new token (the number filled before this write).
        overflow: bool ``[S]``, the new tokens that did not fit (accelerators and ``torch.compile``: their
            outputs must be NaN); ``None`` on the CPU, where a write past the end is an error at once.
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    valid: torch.Tensor
    start: torch.Tensor
    overflow: torch.Tensor | None


class StaticKVCache:
    """A preallocated KV cache of one attention layer: the same shapes at every decoding step, so that a
    step can be captured in a CUDA graph or by ``torch.compile(mode="reduce-overhead")``.

    :class:`KVCache` grows by ``torch.cat`` (new shapes and new memory at every step). This cache holds
    ``max_len`` slots from the start and writes new tokens into them with ``index_copy_`` at a write index
    that lives on the device (:attr:`filled`), so nothing is read back on the host. Attention reads all
    ``max_len`` slots through a mask that hides the unfilled slots and the padding (:attr:`valid`).

    Args:
        batch: ``B``.
        num_kv_heads: ``Hk``.
        max_len: slots ``L``: the most tokens the cache holds (prompt and new tokens, padding included).
        head_dim: channels ``D`` of a key.
        value_dim: channels ``Dv`` of a value (default ``D``).
        dtype: of keys and values: the layer's activations (``torch.bfloat16`` for a bf16 model).
        device: where the buffers live (default: the CPU).

    Attributes:
        keys: ``[B, Hk, L, D]`` rotated keys (a view of the buffer).
        values: ``[B, Hk, L, Dv]``.
        positions: int64 ``[B, L]``, the position of every slot's key.
        valid: bool ``[B, L]``: the slot holds a token (``False``: padding, or not written yet).
        filled: int64 0-dim tensor on ``device``: the slots written so far, the next write index.
        max_len: ``L``, a host int.

    Writing more than ``max_len`` tokens is an :class:`rotary.errors.InputError` at once on the CPU. On other
    devices nothing is read to find out: the extra tokens go to a spill slot that attention never reads,
    their outputs are NaN, and :func:`rotary.check_device_errors` raises :class:`rotary.DeviceInputError`.

    The cache is for inference: its buffers are written in place, so it carries no gradient (keys or
    values that require one are refused while grad mode is on; use :class:`KVCache` to backpropagate
    through decoding). :meth:`reset` empties it for the next batch without reallocating (a captured
    graph keeps working, its buffers stay where they are).

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
        for name, value in (("batch", batch), ("num_kv_heads", num_kv_heads), ("max_len", max_len), ("head_dim", head_dim)):
            check_positive_int(value, name)
        value_dim = head_dim if value_dim is None else check_positive_int(value_dim, "value_dim")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating torch.dtype (the layer's activations), got {dtype!r}")
        if num_kv_heads > MAX_NUM_HEADS:
            raise ValueError(f"num_kv_heads={num_kv_heads} is more than {MAX_NUM_HEADS}; pass the number of key/value heads")
        device = torch.device("cpu") if device is None else torch.device(device)
        self.batch, self.num_kv_heads, self.max_len = int(batch), int(num_kv_heads), int(max_len)
        self.head_dim, self.value_dim, self.dtype = int(head_dim), int(value_dim), dtype
        self.owner: int | None = None
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
            raise ValueError(
                "this StaticKVCache already holds another layer's keys: every attention layer needs its own cache "
                "(use Decoder.new_cache(batch=..., max_len=...) or one StaticKVCache per layer)"
            )

    def reset(self) -> None:
        """Empty the cache (``filled = 0``, no valid slot) without reallocating: the buffers keep their
        addresses, so a captured decoding step goes on working with the next batch."""
        with torch.no_grad():
            self.filled.zero_()
            self._valid.zero_()

    def _host_mode(self) -> bool:
        """Whether values may be read on the host here (the CPU, not under ``torch.compile``)."""
        return not torch.compiler.is_compiling() and deferred.host_checks(self.device)

    def _positions_of(self, ids: torch.Tensor) -> Positions:
        """:class:`Positions` of ids made here from validated ones: on the CPU with their exact bound (a
        free read), elsewhere without one (the rotation checks every token against its table)."""
        if self._host_mode() and ids.numel():
            return Positions.unchecked(ids, int(ids.max()) + 1)
        return Positions.unchecked(ids, 0 if not ids.numel() else None)

    def next_positions(self, seq_len: int, attention_mask: torch.Tensor | None = None) -> Positions:
        """Positions ``[B, S]`` of ``seq_len`` new tokens, computed on the device.

        Without ``attention_mask``: each row continues after its last cached position (``0 .. S - 1`` for an
        empty cache; on the CPU, which sees that it is empty, the shared ``[S]`` of :func:`rotary.positions.arange`).
        With the new tokens' 0/1 mask ``[B, S]``: padding-skipping positions, the number of valid cached
        tokens plus ``cumsum(mask) - 1`` (clamped at 0), as :func:`padding_position_ids` gives over the
        whole sequence.

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
            raise ValueError(
                f"with a StaticKVCache, attention_mask covers the new tokens only: [B, S] = [{self.batch}, {seq_len}] "
                f"(the cache keeps the padding of earlier tokens), got {tuple(mask.shape)}"
            )
        before = self.valid.sum(dim=-1, keepdim=True)
        return self._positions_of((before + mask.long().cumsum(-1) - 1).clamp(min=0))

    def token_indices(self, seq_len: int) -> Positions:
        """The slot indices ``filled .. filled + S - 1`` ``[S]`` of ``seq_len`` new tokens (the positions
        of a layer whose rotation reads its own N-D positions)."""
        return self._positions_of(self.filled + torch.arange(seq_len, device=self.device))

    def update(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        positions: torch.Tensor | Positions,
        *,
        valid: torch.Tensor | None = None,
    ) -> StaticEntries:
        """Write ``S`` new tokens into slots ``filled .. filled + S - 1`` and return every slot.

        Args:
            keys: rotated keys ``[B, Hk, S, D]`` in the cache's dtype, on its device.
            values: ``[B, Hk, S, Dv]``.
            positions: the new keys' positions ``[S]`` or ``[B, S]`` (ids or :class:`Positions`).
            valid: bool ``[B, S]``, ``False`` for padding (default: all tokens).

        Returns:
            :class:`StaticEntries`: all ``L`` slots (keys, values, positions, valid), the first new slot,
            and which new tokens did not fit (``None`` on the CPU).

        Raises:
            InputError: (on the CPU) more tokens than free slots.
            ValueError, TypeError: keys or values that do not fit the cache (shape, dtype, device).
        """
        _check_entries(keys, values, None, "new ")
        want = (self.batch, self.num_kv_heads, keys.shape[2], self.head_dim)
        if tuple(keys.shape) != want or values.shape[-1] != self.value_dim:
            raise ValueError(
                f"new keys {tuple(keys.shape)} / values {tuple(values.shape)} do not fit this StaticKVCache (batch "
                f"{self.batch}, {self.num_kv_heads} KV heads, head_dim {self.head_dim}, value_dim {self.value_dim}); "
                "build the cache for this layer and batch (Decoder.new_cache(batch=..., max_len=...))"
            )
        if keys.dtype != self.dtype or keys.device != self.device:
            raise ValueError(
                f"new keys are {keys.dtype} on {keys.device} but this StaticKVCache holds {self.dtype} on {self.device}; "
                f"build it with dtype={keys.dtype} and device='{keys.device}'"
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
            raise ValueError(f"valid must be a bool [B, S] = [{self.batch}, {seq_len}] tensor, got {valid.dtype} {tuple(valid.shape)}")
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
        else:  # nothing read: tokens past the end go to the spill slot, and are flagged
            overflow = slots >= self.max_len
            if not torch.compiler.is_compiling():
                deferred.record(deferred.CACHE_SLOT, overflow)
            slots = slots.clamp(max=self.max_len)
        with torch.no_grad():
            self._keys.index_copy_(2, slots, keys)
            self._values.index_copy_(2, slots, values)
            self._positions.index_copy_(1, slots, ids)
            self._valid.index_copy_(1, slots, valid.to(self.device))
            self.filled.add_(seq_len)
        return StaticEntries(self.keys, self.values, self.positions, self.valid, start, overflow)


def _check_entries(keys: object, values: object, positions: object, which: str) -> None:
    """keys ``[B, Hk, T, D]``, values ``[B, Hk, T, Dv]`` (floating, same dtype and device) and, when
    given, positions ``[B, T]`` of an integer dtype."""
    for name, t in (("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.is_floating_point():
            raise ValueError(f"{which}{name} must be a floating [B, Hk, T, D] tensor, got {getattr(t, 'shape', type(t).__name__)}")
    if values.shape[:3] != keys.shape[:3]:
        raise ValueError(
            f"{which}values {tuple(values.shape)} must match {which}keys {tuple(keys.shape)} in batch, heads and length"
        )
    if values.dtype != keys.dtype or values.device != keys.device:
        raise ValueError(
            f"{which}keys and values must share dtype and device, got {keys.dtype} on {keys.device} and "
            f"{values.dtype} on {values.device}"
        )
    if positions is not None:
        want = (keys.shape[0], keys.shape[2])
        if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 or tuple(positions.shape) != want:
            raise ValueError(
                f"{which}positions must be an int64 tensor [B, T] = {list(want)}, got "
                f"{getattr(positions, 'dtype', type(positions).__name__)} {tuple(getattr(positions, 'shape', ()))}"
            )


def padding_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip padding: ``cumsum(mask) - 1``, clamped at 0 (int64 ``[B, T]``).

    With left padding, the first real token of every row gets position 0, as if unpadded.

    Example:
        >>> from rotary.nn import padding_position_ids
        >>> padding_position_ids(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
        tensor([[0, 0, 0, 1],
                [0, 1, 2, 3]])
    """
    return P.from_attention_mask(attention_mask).ids


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, Hk, T, D]`` -> ``[B, Hk * groups, T, D]``: each KV head serves ``groups`` query heads.

    Head ``h`` of the result is KV head ``h // groups`` (the layout of grouped-query attention, as
    in transformers' ``repeat_kv``).

    Args:
        x: keys or values ``[B, Hk, T, D]``.
        groups: query heads per KV head (``num_heads // num_kv_heads``), a positive int.

    Example:
        >>> from rotary.nn import repeat_kv
        >>> x = torch.arange(2.0).reshape(1, 2, 1, 1)
        >>> repeat_kv(x, 3).flatten().tolist()
        [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a [B, Hk, T, D] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    check_positive_int(groups, "groups")
    if groups * x.shape[1] > MAX_NUM_HEADS:
        raise ValueError(
            f"groups={groups} would give {groups * x.shape[1]} heads, more than {MAX_NUM_HEADS}; groups is "
            "num_heads // num_kv_heads (real models use 1 to 16)"
        )
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def check_hidden_states(hidden_states: torch.Tensor, hidden_size: int, projection: nn.Module) -> None:
    """Check an attention layer's input ``[B, S, E]`` against the layer: width, dtype and device.

    A dtype that differs from the projection's weights (bf16 activations into an fp32 layer, token ids
    where embeddings belong) would otherwise fail inside the matrix multiply with a message naming
    none of this; under ``torch.autocast`` mixed dtypes are the point, and are let through.

    Raises:
        ValueError: not a 3-D tensor, another width, another device than the weights.
        TypeError: not floating point, or another dtype than the weights (outside autocast).
    """
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        raise ValueError(f"hidden_states must be [B, S, E], got {getattr(hidden_states, 'shape', type(hidden_states).__name__)}")
    if hidden_states.shape[-1] != hidden_size:
        raise ValueError(f"hidden_states has width {hidden_states.shape[-1]}, this layer expects {hidden_size}")
    dtype = hidden_states.dtype
    if not dtype.is_floating_point:
        raise TypeError(
            f"hidden_states must be a floating-point tensor, got {dtype}; embed token ids first, or convert "
            "with hidden_states.float()"
        )
    weight = getattr(projection, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.device.type == "meta":
        return
    if weight.device != hidden_states.device:
        raise ValueError(
            f"hidden_states is on {hidden_states.device} but this layer's weights are on {weight.device}; move one "
            f"(layer.to('{hidden_states.device}') or hidden_states.to('{weight.device}'))"
        )
    if dtype != weight.dtype and weight.dtype.is_floating_point and not torch.is_autocast_enabled(hidden_states.device.type):
        raise TypeError(
            f"hidden_states is {dtype} but this layer's weights are {weight.dtype}; cast the module "
            f"(layer.to({dtype})) or the input (hidden_states.to({weight.dtype})), or run under torch.autocast"
        )


class RotaryAttention(nn.Module):
    """Multi-head self-attention with rotary position embeddings and a KV cache.

    Args:
        hidden_size: model width ``E``.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads ``Hk`` (divides ``H``; 1 = MQA, ``H`` = MHA). Default ``H``.
        head_dim: channels per head ``D``; default ``E // H``.
        rope: the position encoding of q and k: ``True`` (a default ``RoPE(head_dim)``), ``False``
            (none: NoPE), or a module producing tables, ``rope.tables(positions, dtype=) ->
            RotaryTables`` — a :class:`rotary.RoPE` with any scaling and pairing (e.g. one shared by
            every layer) or a variant such as xPos. A producer whose positions are not 1-D token
            positions (:class:`rotary.AxialRoPE` and :class:`rotary.RoPEMixed`: coordinates
            ``[S, A]`` / ``[B, S, A]``; :class:`rotary.MRoPE`: ids ``[3, B, S]``) has
            ``input_tables(position_ids, batch=, seq_len=, device=, dtype=)``; ``position_ids`` are
            then its positions, handed to it unread, and must be given (or ``tables=``).
        rotary_value: also rotate v at the key's position (RoFormer's ``rotary_value``).
        position_bias: score bias added to the RoPE scores: ``None``, ``"alibi"``,
            ``"relative"`` (learned ``b(i-j)``), or a module ``(query_positions [B,S], key_positions [B,T])
            -> [B, H, S, T]``.
        max_relative_distance: clipping distance of ``"relative"``.
        causal: mask future keys.
        dropout: attention-probability dropout (training only).
        bias: biases on the q/k/v/o projections.
        inplace_rope: rotate the projection outputs in place (forward) and their gradients in place
            (backward, when autograd holds them nowhere else): no q/k-sized allocation for RoPE in
            a training step, results bit-identical to rotating out of place. Used only when it is
            safe: the projections are plain ``nn.Linear`` modules without forward hooks (a hook, or
            a projection that keeps its output, would see q or k rotated afterwards: set it
            ``False`` when q or k is needed unrotated elsewhere), and not while ``torch.compile``
            traces (the compiled graph rotates out of place and lets the compiler reuse memory).

    Example:
        >>> from rotary.nn import RotaryAttention, KVCache
        >>> attn = RotaryAttention(64, 8, num_kv_heads=2, causal=True).eval()
        >>> x = torch.randn(2, 10, 64)
        >>> full = attn(x)
        >>> cache = KVCache()
        >>> steps = torch.cat([attn(x[:, i : i + 1], cache=cache) for i in range(10)], dim=1)
        >>> torch.allclose(full, steps, atol=1e-5)
        True
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        rope: bool | nn.Module = True,
        rotary_value: bool = False,
        position_bias: str | nn.Module | None = None,
        max_relative_distance: int = 128,
        causal: bool = False,
        dropout: float = 0.0,
        bias: bool = False,
        inplace_rope: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads)):
            check_positive_int(value, name)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        check_positive_int(num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}; "
                "every KV head must serve the same number of query heads"
            )
        if head_dim is None:
            if hidden_size % num_heads:
                raise ValueError(
                    f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}; pass head_dim explicitly"
                )
            head_dim = hidden_size // num_heads
        check_positive_int(head_dim, "head_dim")
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = hidden_size, num_heads, num_kv_heads, head_dim
        self.causal = check_bool(causal, "causal")
        self.dropout = check_probability(dropout, "dropout")
        self.rotary_value = check_bool(rotary_value, "rotary_value")
        self.inplace_rope = check_bool(inplace_rope, "inplace_rope")

        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=check_bool(bias, "bias"))
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)

        if rope is True:
            rope = RoPE(head_dim)
        elif rope is False or rope is None:
            rope = None
        elif not (isinstance(rope, nn.Module) and callable(getattr(rope, "tables", None))):
            raise TypeError(
                f"rope must be True, False or an nn.Module with tables(positions) like rotary.RoPE, got {type(rope).__name__}"
            )
        self.rope = rope
        check_causal_rope(rope, self.causal, type(self).__name__)  # a producer valid only under a causal mask (xPos)
        per_head = getattr(rope, "heads", None) if self._nd_positions() else None  # RoPE-Mixed's per-head tables
        if per_head is not None and (num_heads != per_head or num_kv_heads != per_head):
            raise ValueError(
                f"{type(rope).__name__} has per-head frequencies for {per_head} heads, but this layer has num_heads="
                f"{num_heads} and num_kv_heads={num_kv_heads}: q and k both need {per_head} heads (build the layer with "
                f"num_heads={per_head} and num_kv_heads={per_head}, or the producer with num_heads={num_heads} and no GQA)"
            )
        if self.rotary_value and self.rope is None:
            raise ValueError("rotary_value=True needs a rope; pass rope=True or a RoPE module")

        if position_bias == "alibi":
            position_bias = ALiBi(num_heads)
        elif position_bias == "relative":
            position_bias = RelativePositionBias(num_heads, max_relative_distance)
        elif position_bias is not None and not isinstance(position_bias, nn.Module):
            raise ValueError(
                f"position_bias must be None, 'alibi', 'relative' or an nn.Module, got {position_bias!r}"
            )
        self.position_bias = position_bias
        if self.position_bias is not None and self._nd_positions():
            raise ValueError(
                f"position_bias={type(self.position_bias).__name__} scores 1-D distances between token positions, but "
                f"{type(rope).__name__}'s positions are N-D; use one or the other"
            )

    def _nd_positions(self) -> bool:
        """Whether the producer reads position_ids itself (N-D positions: axial RoPE, RoPE-Mixed, M-RoPE)."""
        return callable(getattr(self.rope, "input_tables", None))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}, rotary_value={self.rotary_value}"
        )

    def _rotate_in_place(self) -> bool:
        """Whether q and k (and v) may be rotated in place: see ``inplace_rope``."""
        if not self.inplace_rope or torch.compiler.is_compiling():
            return False
        projections = (self.q_proj, self.k_proj, self.v_proj) if self.rotary_value else (self.q_proj, self.k_proj)
        return all(type(p) is nn.Linear and not p._forward_hooks for p in projections)

    def positions(
        self,
        position_ids: torch.Tensor | Positions | None,
        cache: KVCache | StaticKVCache | None,
        batch: int,
        seq_len: int,
        device: torch.device,
    ) -> Positions:
        """Positions of the new tokens: given, continuing the cache, or ``0..S-1``."""
        if position_ids is not None:
            return P.from_ids(position_ids, batch=batch, seq_len=seq_len, device=device)
        if isinstance(cache, StaticKVCache):
            return cache.next_positions(seq_len)  # on the device: empty or not is not read
        if cache is not None and cache.length:
            return cache.next_positions(seq_len)
        return P.arange(seq_len, device=device)

    def _mask(
        self,
        attention_mask: torch.Tensor | None,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        past: int,
        device: torch.device,
    ) -> torch.Tensor | None:
        """Additive fp32 mask ``[B, H or 1, S, T]`` combining causality, padding and the score bias."""
        batch, seq_len = query_positions.shape
        total = key_positions.shape[1]
        allowed = None
        if self.causal:
            # by index, not by position: with left padding positions repeat, indices do not
            query_index = torch.arange(past, past + seq_len, device=device)
            allowed = (torch.arange(total, device=device)[None, :] <= query_index[:, None])[None, None]
        if attention_mask is not None:
            mask = check_attention_mask(attention_mask).to(device)
            if mask.shape != (batch, total):
                raise ValueError(
                    f"attention_mask must be [B, T] = [{batch}, {total}] (past + new tokens), got {tuple(mask.shape)}"
                )
            keys_ok = mask[:, None, None, :]
            allowed = keys_ok if allowed is None else allowed & keys_ok
        if allowed is not None:
            # a padded query may see no key at all (causal + left padding); let only such a row see
            # itself, so softmax stays finite. Its output is ignored downstream; rows that do see
            # keys are left exactly as specified (Hugging Face's encoders compute them too).
            diagonal = torch.arange(total, device=device)[None, :] == torch.arange(past, past + seq_len, device=device)[:, None]
            allowed = allowed | (diagonal[None, None] & ~allowed.any(dim=-1, keepdim=True))
        return self._additive(allowed, query_positions, key_positions, device)

    def _static_mask(
        self, query_positions: torch.Tensor, entries: StaticEntries, device: torch.device
    ) -> torch.Tensor:
        """:meth:`_mask` over all ``L`` slots of a :class:`StaticKVCache` (``[B, H or 1, S, L]``): the same
        rules, by slot index, with the write index on the device; unfilled slots and padding are blocked."""
        seq_len = query_positions.shape[1]
        slots = torch.arange(entries.valid.shape[1], device=device)
        query_slots = entries.start + torch.arange(seq_len, device=device)
        if self.causal:
            allowed = slots[None, :] <= query_slots[:, None]  # [S, L]
        else:
            allowed = (slots < entries.start + seq_len)[None, :].expand(seq_len, -1)
        allowed = allowed[None, None] & entries.valid[:, None, None, :]
        diagonal = slots[None, :] == query_slots[:, None]  # see :meth:`_mask`: a query that sees no key sees itself
        allowed = allowed | (diagonal[None, None] & ~allowed.any(dim=-1, keepdim=True))
        return self._additive(allowed, query_positions, entries.positions, device)  # type: ignore[return-value]

    def _additive(
        self, allowed: torch.Tensor | None, query_positions: torch.Tensor, key_positions: torch.Tensor, device: torch.device
    ) -> torch.Tensor | None:
        """``allowed`` (bool ``[B, 1, S, T]``) as an additive fp32 mask, plus the score bias."""
        bias = None if self.position_bias is None else self.position_bias(query_positions, key_positions)
        if allowed is None:
            return bias
        blocked = torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))
        return blocked if bias is None else bias + blocked

    def forward(
        self,
        hidden_states: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | Positions | None = None,
        cache: KVCache | None = None,
        tables: RotaryTables | None = None,
    ) -> torch.Tensor:
        """Attend.

        Args:
            hidden_states: ``[B, S, E]``.
            attention_mask: ``[B, T]`` of 1 (token) / 0 (padding) over the cached and new tokens
                (``T = cache.length + S``), as in Hugging Face. With a :class:`StaticKVCache`: ``[B, S]``,
                the new tokens only (the cache keeps the padding of earlier ones).
            position_ids: integer ``[S]`` or ``[B, S]``, or :class:`~rotary.positions.Positions`;
                default: continue the cache, else ``0..S-1``. With left padding pass
                :func:`padding_position_ids` so real tokens start at 0. For a producer with N-D
                positions (see ``rope``), its positions (required unless ``tables`` is given): the
                coordinates of :class:`rotary.AxialRoPE` / :class:`rotary.RoPEMixed` (e.g.
                ``rope.grid(h, w, prefix=1)``), the ``[3, B, S]`` ids of :class:`rotary.MRoPE`.
            cache: a :class:`KVCache` to read and extend (incremental decoding), or a
                :class:`StaticKVCache` to write into (static shapes: attention reads all its slots, and
                nothing is read back on the host, so the call can be captured in a CUDA graph).
            tables: the rotary tables of these positions, computed once per model forward (see
                :class:`rotary.models.Decoder`); default: ``self.rope.tables(positions)``.

        Returns:
            ``[B, S, E]`` in the dtype of ``hidden_states``.
        """
        check_hidden_states(hidden_states, self.hidden_size, self.q_proj)
        check_causal_rope(self.rope, self.causal, type(self).__name__)  # causal or rope may have been reassigned
        batch, seq_len, _ = hidden_states.shape
        device = hidden_states.device
        static = isinstance(cache, StaticKVCache)
        if cache is not None:
            if not isinstance(cache, (KVCache, StaticKVCache)):
                raise TypeError(f"cache must be a rotary.nn.KVCache or StaticKVCache, got {type(cache).__name__}")
            cache.claim(self)
            if static and cache.batch != batch:  # type: ignore[union-attr]
                raise ValueError(
                    f"the StaticKVCache is built for a batch of {cache.batch} but hidden_states has batch {batch}; "  # type: ignore[union-attr]
                    "build one for this batch"
                )
            if not static and cache.length and cache.keys.shape[0] != batch:  # type: ignore[union-attr]
                raise ValueError(
                    f"the cache holds a batch of {cache.keys.shape[0]} but hidden_states has batch {batch}; "  # type: ignore[union-attr]
                    "use a fresh KVCache for a new batch"
                )
        q = self.q_proj(hidden_states).view(batch, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(batch, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(batch, seq_len, self.num_kv_heads, self.head_dim).transpose(1, 2)

        if self._nd_positions():
            # position_ids are the producer's own (coordinates, [3, B, S] ids): it reads and checks them; the
            # cache and the mask use token indices, continuing the cache
            if static:
                positions = cache.token_indices(seq_len)  # type: ignore[union-attr]
            else:
                positions = P.arange(seq_len, offset=0 if cache is None else cache.length, device=device)  # type: ignore[union-attr]
            if tables is None:
                tables = self.rope.input_tables(  # type: ignore[union-attr]
                    position_ids, batch=batch, seq_len=seq_len, device=device, dtype=table_dtype(q.dtype)
                )
        else:
            positions = self.positions(position_ids, cache, batch, seq_len, device)
        if self.rope is not None:
            if tables is None:
                tables = self.rope.tables(positions, dtype=table_dtype(q.dtype))
            inplace = self._rotate_in_place()
            if self.rotary_value:
                q, k, v = rotate([q, k, v], tables, kinds=("q", "k", "q"), names=("q", "k", "v"), inplace=inplace)
            else:
                q, k = rotate([q, k], tables, kinds=("q", "k"), names=("q", "k"), inplace=inplace)

        query_positions = positions.ids.expand(batch, seq_len)
        dropout = self.dropout if self.training else 0.0
        past: int | torch.Tensor = 0
        key_positions = query_positions
        entries = None
        if static:
            entries = self._write_static(k, v, cache, positions, attention_mask)  # type: ignore[arg-type]
            if entries.overflow is None:
                # the CPU, eager: the filled length is known for free, so attention reads the filled slots
                # only, through the same code as KVCache (bit-identical to it, no work on empty slots)
                past = int(entries.start)
                filled = past + seq_len
                k, v = entries.keys[:, :, :filled], entries.values[:, :, :filled]
                key_positions, valid = entries.positions[:, :filled], entries.valid[:, :filled]
                attention_mask = None if attention_mask is None and bool(valid.all()) else valid
                entries = None
        elif cache is not None:
            past = cache.length  # type: ignore[union-attr]
            k, v, key_positions = cache.update(k, v, positions)  # type: ignore[union-attr]

        groups = self.num_heads // self.num_kv_heads
        if entries is not None:
            # static shapes (accelerators, torch.compile): every slot, under the mask of the filled valid ones
            mask = self._static_mask(query_positions, entries, device)
            out = F.scaled_dot_product_attention(
                q, repeat_kv(entries.keys, groups), repeat_kv(entries.values, groups), attn_mask=mask.to(q.dtype),
                dropout_p=dropout,
            )
            if entries.overflow is not None:  # tokens that found no slot: NaN, never another token's result
                out = torch.where(entries.overflow[:, None], float("nan"), out)
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, self.num_heads * self.head_dim))
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        if self.causal and past == 0 and attention_mask is None and self.position_bias is None:
            # plain causal attention: SDPA's own causal path, no [S, T] mask built
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            mask = self._mask(attention_mask, query_positions, key_positions, past, device)  # type: ignore[arg-type]
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if mask is None else mask.to(q.dtype), dropout_p=dropout
            )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq_len, self.num_heads * self.head_dim))

    @staticmethod
    def _write_static(
        k: torch.Tensor,
        v: torch.Tensor,
        cache: StaticKVCache,
        positions: Positions,
        attention_mask: torch.Tensor | None,
    ) -> StaticEntries:
        """Write the new keys and values into a :class:`StaticKVCache`, with the new tokens' padding."""
        batch, _, seq_len, _ = k.shape
        valid = None
        if attention_mask is not None:
            valid = check_attention_mask(attention_mask).to(k.device)
            if tuple(valid.shape) != (batch, seq_len):
                raise ValueError(
                    f"with a StaticKVCache, attention_mask covers the new tokens only: [B, S] = [{batch}, {seq_len}] "
                    f"(the cache keeps the padding of earlier tokens), got {tuple(valid.shape)}"
                )
        return cache.update(k, v, positions, valid=valid)
