"""Multi-head self-attention with RoPE on q and k, a KV cache, GQA/MQA and optional score biases.

    hidden_states -> q, k, v projections -> rotate(q, k [and v]) by the tables of the tokens' positions
                  -> append k, v to the cache (keys stored rotated; a StaticKVCache rotates as it writes)
                  -> scaled_dot_product_attention(q, all keys, all values, mask + bias) -> o projection

A model computes the positions and tables once per forward and hands them to every layer (``positions=``,
``tables=``); a layer used alone computes them itself. Caching, masks and biases: docs/attention.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import positions as P
from .._checks import check_bool, check_causal_rope, check_positive_int, check_probability
from .._limits import MAX_NUM_HEADS
from ..errors import InputError, InputTypeError
from ..positions import Positions, check_attention_mask
from ..rope import RoPE
from ..rotation import rotate
from ..tables import RotaryTables, table_dtype
from .cache import KVCache, StaticEntries, StaticKVCache, StaticStep
from .position import ALiBi, RelativePositionBias

__all__ = ["KVCache", "RotaryAttention", "StaticKVCache", "padding_position_ids", "repeat_kv"]


def padding_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip padding: ``cumsum(mask) - 1``, clamped at 0 (int64 ``[B, T]``): left padding starts at 0.

    Example:
        >>> from rotary.nn import padding_position_ids
        >>> padding_position_ids(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
        tensor([[0, 0, 0, 1],
                [0, 1, 2, 3]])
    """
    return P.from_attention_mask(attention_mask).ids


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, Hk, T, D]`` -> ``[B, Hk * groups, T, D]``: head ``h`` of the result is KV head ``h // groups`` (GQA).

    Example:
        >>> from rotary.nn import repeat_kv
        >>> x = torch.arange(2.0).reshape(1, 2, 1, 1)
        >>> repeat_kv(x, 3).flatten().tolist()
        [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise InputError(f"x must be a [B, Hk, T, D] tensor, got {getattr(x, 'shape', type(x).__name__)}")
    check_positive_int(groups, "groups")
    if groups * x.shape[1] > MAX_NUM_HEADS:
        raise InputError(
            f"groups={groups} would give {groups * x.shape[1]} heads, more than {MAX_NUM_HEADS}; groups is "
            "num_heads // num_kv_heads (real models use 1 to 16)"
        )
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def check_hidden_states(hidden_states: torch.Tensor, hidden_size: int, projection: nn.Module) -> None:
    """Check an attention layer's input ``[B, S, E]`` against the layer: width, dtype (outside autocast) and device.

    Raises ``rotary.errors.InputError`` for another shape, width or device than the weights; InputTypeError for a
    dtype that is not floating or (outside autocast) not the weights'.
    """
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 3:
        raise InputError(
            f"hidden_states must be [B, S, E], got {getattr(hidden_states, 'shape', type(hidden_states).__name__)}"
        )
    if hidden_states.shape[-1] != hidden_size:
        raise InputError(f"hidden_states has width {hidden_states.shape[-1]}, this layer expects {hidden_size}")
    dtype = hidden_states.dtype
    if not dtype.is_floating_point:
        raise InputTypeError(
            f"hidden_states must be a floating-point tensor, got {dtype}; embed token ids first, or convert "
            "with hidden_states.float()"
        )
    weight = getattr(projection, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.device.type == "meta":
        return
    if weight.device != hidden_states.device:
        raise InputError(
            f"hidden_states is on {hidden_states.device} but this layer's weights are on {weight.device}; move one "
            f"(layer.to('{hidden_states.device}') or hidden_states.to('{weight.device}'))"
        )
    if (
        dtype != weight.dtype
        and weight.dtype.is_floating_point
        and not torch.is_autocast_enabled(hidden_states.device.type)
    ):
        raise InputTypeError(
            f"hidden_states is {dtype} but this layer's weights are {weight.dtype}; cast the module "
            f"(layer.to({dtype})) or the input (hidden_states.to({weight.dtype})), or run under torch.autocast"
        )


class RotaryAttention(nn.Module):
    """Multi-head self-attention with rotary position embeddings and a KV cache.

    Args:
        hidden_size, head_dim: model width ``E``; channels per head ``D`` (default ``E // H``).
        num_heads, num_kv_heads: query heads ``H``; key/value heads ``Hk`` (divides ``H``; default ``H``).
        rope: ``True`` (``RoPE(head_dim)``), ``False`` (NoPE), or a producer of tables (``rope.tables(positions,
            dtype=)``). Producers of N-D positions (AxialRoPE, RoPE-Mixed, MRoPE) read ``position_ids`` through
            ``input_tables(...)``; then ``position_ids`` (or ``tables=``) must be given.
        rotary_value: also rotate v at the key's position (RoFormer's ``rotary_value``).
        position_bias: ``None``, ``"alibi"``, ``"relative"`` (clipped at ``max_relative_distance``), or a module
            ``(query_positions [B, S], key_positions [B, T]) -> [B, H, S, T]`` added to the scores.
        causal, dropout, bias: mask future keys; attention dropout (training only); biases on the projections.
        inplace_rope: rotate q and k (and gradients) in place, bit-identical to out of place (plain ``nn.Linear``
            projections without hooks, not while tracing).

    Raises ``rotary.errors.InputError`` for heads that do not divide, a producer that does not fit the layer or a bad
    bias (InputTypeError: ``rope`` neither a bool nor a producer).

    Example:
        >>> from rotary.nn import RotaryAttention, KVCache
        >>> attn = RotaryAttention(64, 8, num_kv_heads=2, causal=True).eval()
        >>> x = torch.randn(2, 10, 64)
        >>> full, cache = attn(x), KVCache()
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
            raise InputError(
                f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}; "
                "every KV head must serve the same number of query heads"
            )
        if head_dim is None:
            if hidden_size % num_heads:
                raise InputError(
                    f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}; pass head_dim explicitly"
                )
            head_dim = hidden_size // num_heads
        check_positive_int(head_dim, "head_dim")
        self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim = (
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
        )
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
            raise InputTypeError(
                "rope must be True, False or an nn.Module with tables(positions) like "
                f"rotary.RoPE, got {type(rope).__name__}"
            )
        self.rope = rope
        check_causal_rope(rope, self.causal, type(self).__name__)  # a producer valid only under a causal mask (xPos)
        per_head = getattr(rope, "heads", None) if self._nd_positions() else None  # RoPE-Mixed's per-head tables
        if per_head is not None and (num_heads != per_head or num_kv_heads != per_head):
            raise InputError(
                f"{type(rope).__name__} has per-head frequencies for {per_head} heads, but this layer has num_heads="
                f"{num_heads} and num_kv_heads={num_kv_heads}: q and k both need {per_head} heads (build the layer "
                f"with num_heads={per_head} and num_kv_heads={per_head}, or the producer with "
                f"num_heads={num_heads} and no GQA)"
            )
        if self.rotary_value and self.rope is None:
            raise InputError("rotary_value=True needs a rope; pass rope=True or a RoPE module")

        if position_bias == "alibi":
            position_bias = ALiBi(num_heads)
        elif position_bias == "relative":
            position_bias = RelativePositionBias(num_heads, max_relative_distance)
        elif position_bias is not None and not isinstance(position_bias, nn.Module):
            raise InputError(f"position_bias must be None, 'alibi', 'relative' or an nn.Module, got {position_bias!r}")
        self.position_bias = position_bias
        if self.position_bias is not None and self._nd_positions():
            raise InputError(
                f"position_bias={type(self.position_bias).__name__} scores 1-D distances between token positions, but "
                f"{type(rope).__name__}'s positions are N-D; use one or the other"
            )

    def _nd_positions(self) -> bool:
        """Whether the producer reads position_ids itself (N-D positions)."""
        return callable(getattr(self.rope, "input_tables", None))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.causal}, rotary_value={self.rotary_value}"
        )

    def _rotate_in_place(self) -> bool:
        """Whether q and k (and v) may be rotated in place (``inplace_rope``)."""
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
                raise InputError(
                    f"attention_mask must be [B, T] = [{batch}, {total}] (past + new tokens), got {tuple(mask.shape)}"
                )
            keys_ok = mask[:, None, None, :]
            allowed = keys_ok if allowed is None else allowed & keys_ok
        if allowed is not None:
            # a padded query may see no key at all (causal + left padding); let only such a row see
            # itself, so softmax stays finite. Its output is ignored downstream; rows that do see
            # keys are left exactly as specified (Hugging Face's encoders compute them too).
            diagonal = (
                torch.arange(total, device=device)[None, :]
                == torch.arange(past, past + seq_len, device=device)[:, None]
            )
            allowed = allowed | (diagonal[None, None] & ~allowed.any(dim=-1, keepdim=True))
        return self._additive(allowed, query_positions, key_positions, device)

    def _static_mask(self, query_positions: torch.Tensor, entries: StaticEntries, device: torch.device) -> torch.Tensor:
        """:meth:`_mask` over all ``L`` slots of a :class:`StaticKVCache`, by slot index; unfilled slots are blocked."""
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
        self,
        allowed: torch.Tensor | None,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        device: torch.device,
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
        static_step: StaticStep | None = None,
    ) -> torch.Tensor:
        """Attend: ``[B, S, E]`` -> ``[B, S, E]`` in the dtype of ``hidden_states``.

        Args:
            attention_mask: bool or 1 (token) / 0 (padding) ``[B, T]`` over cached and new tokens (``T = cache.length +
                S``); with a :class:`StaticKVCache`, ``[B, S]`` over the new tokens only.
            position_ids: integer ``[S]`` or ``[B, S]``, or Positions; default: continue the cache, else ``0..S-1``
                (left padding: :func:`padding_position_ids`). N-D producers: ``rope.grid(h, w)`` or M-RoPE's ``[3, B,
                S]``.
            cache: a :class:`KVCache` to read and extend, or a :class:`StaticKVCache` to write into.
            tables, static_step: what the model forward computed once for every layer (default
                ``self.rope.tables(positions)``; the :class:`~rotary.nn.cache.StaticStep` sharing the mask).
        """
        check_hidden_states(hidden_states, self.hidden_size, self.q_proj)
        check_causal_rope(self.rope, self.causal, type(self).__name__)  # causal or rope may have been reassigned
        batch, seq_len, _ = hidden_states.shape
        device = hidden_states.device
        static = isinstance(cache, StaticKVCache)
        if cache is not None:
            if not isinstance(cache, (KVCache, StaticKVCache)):
                raise InputTypeError(f"cache must be a rotary.nn.KVCache or StaticKVCache, got {type(cache).__name__}")
            cache.claim(self)
            if static and cache.batch != batch:  # type: ignore[union-attr]
                raise InputError(
                    f"the StaticKVCache is built for a batch of {cache.batch} but "
                    f"hidden_states has batch {batch}; "  # type: ignore[union-attr]
                    "build one for this batch"
                )
            if not static and cache.length and cache.keys.shape[0] != batch:  # type: ignore[union-attr]
                raise InputError(
                    f"the cache holds a batch of {cache.keys.shape[0]} but "
                    f"hidden_states has batch {batch}; "  # type: ignore[union-attr]
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
        inplace = False
        if self.rope is not None:
            if tables is None:
                tables = self.rope.tables(positions, dtype=table_dtype(q.dtype))
            inplace = self._rotate_in_place()
            if static:  # q and k are rotated as k is written into the cache (rotate_and_cache); v before
                if self.rotary_value:
                    (v,) = rotate([v], tables, kinds=("q",), names=("v",), inplace=inplace)
            elif self.rotary_value:
                q, k, v = rotate([q, k, v], tables, kinds=("q", "k", "q"), names=("q", "k", "v"), inplace=inplace)
            else:
                q, k = rotate([q, k], tables, kinds=("q", "k"), names=("q", "k"), inplace=inplace)

        query_positions = positions.ids.expand(batch, seq_len)
        dropout = self.dropout if self.training else 0.0
        past: int | torch.Tensor = 0
        key_positions = query_positions
        entries = None
        if static:
            rotate_with = None if self.rope is None else tables
            q, entries = self._write_static(
                q, k, v, cache, positions, attention_mask, rotate_with, inplace, static_step
            )  # type: ignore[arg-type]
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
            def build_mask() -> torch.Tensor:
                return self._static_mask(query_positions, entries, device).to(q.dtype)  # type: ignore[union-attr]

            if static_step is None:
                mask = build_mask()
            else:  # every layer of the group would build the same mask: its slots, positions and padding are equal
                key = ("mask", q.dtype, self.causal, None if self.position_bias is None else id(self.position_bias))
                mask = static_step.shared(key, build_mask)
            out = F.scaled_dot_product_attention(
                q,
                repeat_kv(entries.keys, groups),
                repeat_kv(entries.values, groups),
                attn_mask=mask,
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
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: StaticKVCache,
        positions: Positions,
        attention_mask: torch.Tensor | None,
        tables: RotaryTables | None,
        inplace: bool,
        step: StaticStep | None = None,
    ) -> tuple[torch.Tensor, StaticEntries]:
        """Write new keys and values into a :class:`StaticKVCache` (with ``tables``: rotating q and k as k goes in)."""
        batch, _, seq_len, _ = k.shape
        valid = None
        if attention_mask is not None:
            valid = check_attention_mask(attention_mask).to(k.device)
            if tuple(valid.shape) != (batch, seq_len):
                raise InputError(
                    f"with a StaticKVCache, attention_mask covers the new tokens only: [B, S] = [{batch}, {seq_len}] "
                    f"(the cache keeps the padding of earlier tokens), got {tuple(valid.shape)}"
                )
        if tables is None:
            return q, cache.update(k, v, positions, valid=valid, step=step)
        return cache.rotate_and_update(q, k, v, tables, positions, valid=valid, inplace=inplace, step=step)
