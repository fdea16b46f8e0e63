"""A small LLaMA-style causal language model, readable top to bottom.

    token ids -> embedding (+ absolute position embedding, if any)
              -> num_layers x [ RMSNorm -> RotaryAttention (GQA, KV cache) -> residual
                               RMSNorm -> SwiGLU MLP                       -> residual ]
              -> RMSNorm -> lm_head (optionally tied to the embedding) -> logits

The position encoding is one switch, ``DecoderConfig.position_encoding``, a key of :data:`POSITION_ENCODINGS`
whose builder says where it acts (:class:`PositionEncoding`); a new variant is one registration
(docs/attention.md). Decoding is :class:`GenerationMixin` (:mod:`rotary.models.generation`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import positions as P
from .._checks import check_bool, check_positive_float, check_positive_int, check_probability, is_number
from .._registry import Registry
from ..errors import InputError, InputTypeError
from ..nn.attention import RotaryAttention
from ..nn.cache import KVCache, StaticKVCache, StaticStep
from ..nn.position import ALiBi, LearnedPositionEmbedding, RelativePositionBias, SinusoidalPositionEmbedding
from ..positions import Positions, check_attention_mask
from ..rope import RoPE
from ..tables import RotaryTables, table_dtype
from ..variants.nope import NoPETemperature, default_no_rope_layers, rope_layer_flags
from ..variants.xpos import XPos
from ._inputs import embedding_ids
from .generation import CapturedDecoding, GenerationMixin, next_token

_Captured = CapturedDecoding  # the name in pickles of models made before generation.py split off

__all__ = [
    "POSITION_ENCODINGS",
    "Decoder",
    "DecoderConfig",
    "PositionEncoding",
    "RMSNorm",
    "SwiGLU",
    "next_token",
    "register_position_encoding",
]


# ------------------------------------------------------------------------------------------------
# configuration


@dataclass
class DecoderConfig:
    """Hyper-parameters of :class:`Decoder`.

    Attributes:
        vocab_size, hidden_size, num_layers: ``V``, the width ``E``, transformer blocks.
        num_heads, num_kv_heads: query heads ``H``; key/value heads (GQA; 1 = MQA), default ``num_heads``.
        intermediate_size: SwiGLU width; default ``8/3 * E`` rounded up to a multiple of 8.
        max_position: initial RoPE table length, and the size of a learned position table.
        position_encoding: a key of :data:`POSITION_ENCODINGS` (``rope``, ``p_rope``, ``xpos``, ``none``, ``learned``,
            ``sinusoidal``, ``alibi``, ...).
        rope_base, rope_scaling, rope_interleaved: RoPE's base ``theta``, Hugging Face-style scaling block, pairing.
        p_rope_fraction, xpos_scale_base: p-RoPE's ``p`` (the fraction of pairs, the fastest, that rotate); xPos's
            ``γ``.
        no_rope_layers: NoPE layers (Llama 4's convention): one flag per layer, 0 = no position encoding; ``True``:
            every ``no_rope_layer_interval``-th layer; ``None``/``False``: every layer rotates.
        attn_temperature_tuning, floor_scale, attn_scale: Llama 4's query temperature in NoPE layers
            (:func:`rotary.variants.nope.nope_temperature`).
        rms_norm_eps, tie_word_embeddings, dropout: RMSNorm epsilon; share the embedding with the head; dropout on
            attention probabilities and residual branches (training only).
    """

    vocab_size: int = 256
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    intermediate_size: int | None = None
    max_position: int = 2048
    position_encoding: str = "rope"
    rope_base: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None)
    rope_interleaved: bool = False
    p_rope_fraction: float = 0.25
    xpos_scale_base: float = 512.0
    no_rope_layers: list[int] | bool | None = None
    no_rope_layer_interval: int = 4
    attn_temperature_tuning: bool = True
    floor_scale: int = 8192
    attn_scale: float = 0.1
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position"):
            value = getattr(self, name)
            check_positive_int(value, name)
        if self.hidden_size % self.num_heads:
            raise InputError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        check_positive_int(self.num_kv_heads, "num_kv_heads")
        if self.intermediate_size is None:
            self.intermediate_size = 8 * math.ceil(8 * self.hidden_size / 3 / 8)
        check_positive_int(self.intermediate_size, "intermediate_size")
        # values from YAML/JSON configs arrive as strings more often than as wrong numbers
        check_positive_float(self.rope_base, "rope_base")
        check_positive_float(self.rms_norm_eps, "rms_norm_eps")
        check_probability(self.dropout, "dropout")
        for name in ("rope_interleaved", "tie_word_embeddings"):
            check_bool(getattr(self, name), name)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, dict):
            raise InputError(
                f"rope_scaling must be a dict such as {{'rope_type': 'linear', 'factor': "
                f"2.0}}, got {self.rope_scaling!r}"
            )
        if not isinstance(self.position_encoding, str) or self.position_encoding not in POSITION_ENCODINGS:
            raise InputError(
                f"unknown position_encoding {self.position_encoding!r}; "
                f"registered: {', '.join(sorted(POSITION_ENCODINGS))}"
            )
        if not is_number(self.p_rope_fraction) or not 0 < self.p_rope_fraction <= 1:
            raise InputError(f"p_rope_fraction must be in (0, 1], got {self.p_rope_fraction!r}")
        check_positive_float(self.xpos_scale_base, "xpos_scale_base")
        check_bool(self.attn_temperature_tuning, "attn_temperature_tuning")
        check_positive_int(self.no_rope_layer_interval, "no_rope_layer_interval")
        check_positive_int(self.floor_scale, "floor_scale")
        if not is_number(self.attn_scale) or self.attn_scale < 0:
            raise InputError(f"attn_scale must be a finite number >= 0, got {self.attn_scale!r}")
        if self.no_rope_layers is True:
            self.no_rope_layers = default_no_rope_layers(self.num_layers, self.no_rope_layer_interval)
        elif self.no_rope_layers is False:
            self.no_rope_layers = None
        rope_layer_flags(self.no_rope_layers, self.num_layers)  # checks the list

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# ------------------------------------------------------------------------------------------------
# position encodings: one registry, three places to act


@dataclass
class PositionEncoding:
    """Where a position encoding acts; any field may be None; the modules are shared by all layers.

    ``embedding``: ``position_ids [B, S] -> [B, S, E]``, added to the token embeddings; ``rope``: a producer of tables
    (``rope.tables(positions, dtype=)``), called once per forward, the tables handed to every layer; ``bias``: a score
    bias ``(query_positions [B, S], key_positions [B, T]) -> [B, H, S, T]``.
    """

    embedding: nn.Module | None = None
    rope: nn.Module | None = None
    bias: nn.Module | None = None


#: ``position_encoding`` name -> builder ``(DecoderConfig) -> PositionEncoding``; ``with
#: POSITION_ENCODINGS.scope():`` undoes the registrations made inside the block.
POSITION_ENCODINGS: Registry[Callable[[DecoderConfig], PositionEncoding]] = Registry()


def register_position_encoding(name: str) -> Callable:
    """Decorator adding a builder ``(DecoderConfig) -> PositionEncoding`` to :data:`POSITION_ENCODINGS`."""

    def deco(build: Callable[[DecoderConfig], PositionEncoding]) -> Callable[[DecoderConfig], PositionEncoding]:
        POSITION_ENCODINGS[name] = build
        return build

    return deco


@register_position_encoding("rope")
def _rope(c: DecoderConfig) -> PositionEncoding:
    rope = RoPE(
        c.head_dim,
        base=c.rope_base,
        scaling=c.rope_scaling,
        interleaved=c.rope_interleaved,
        max_position=c.max_position,
    )
    return PositionEncoding(rope=rope)


@register_position_encoding("p_rope")
def _p_rope(c: DecoderConfig) -> PositionEncoding:
    # p-RoPE (Barbero et al., 2025): only the fastest p of the pairs rotate, the rest carry no position;
    # it is transformers' "proportional" rope_type
    scaling = {"rope_type": "proportional", "partial_rotary_factor": c.p_rope_fraction, **(c.rope_scaling or {})}
    if scaling["rope_type"] != "proportional":
        raise InputError(
            "position_encoding='p_rope' is the 'proportional' rope_type; rope_scaling has rope_type "
            f"{scaling['rope_type']!r} (use position_encoding='rope' for other scaling types)"
        )
    rope = RoPE(
        c.head_dim, base=c.rope_base, scaling=scaling, interleaved=c.rope_interleaved, max_position=c.max_position
    )
    return PositionEncoding(rope=rope)


@register_position_encoding("xpos")
def _xpos(c: DecoderConfig) -> PositionEncoding:
    if c.rope_scaling:
        raise InputError(
            f"position_encoding='xpos' takes no rope_scaling (got {c.rope_scaling!r}); set xpos_scale_base"
        )
    xpos = XPos(
        c.head_dim,
        scale_base=c.xpos_scale_base,
        base=c.rope_base,
        interleaved=c.rope_interleaved,
        max_position=c.max_position,
    )
    return PositionEncoding(rope=xpos)


@register_position_encoding("none")
def _nope(c: DecoderConfig) -> PositionEncoding:
    return PositionEncoding()  # NoPE: the causal mask alone tells tokens apart


@register_position_encoding("learned")
def _learned(c: DecoderConfig) -> PositionEncoding:
    return PositionEncoding(embedding=LearnedPositionEmbedding(c.max_position, c.hidden_size))


@register_position_encoding("sinusoidal")
def _sinusoidal(c: DecoderConfig) -> PositionEncoding:
    return PositionEncoding(embedding=SinusoidalPositionEmbedding(c.hidden_size))


@register_position_encoding("alibi")
def _alibi(c: DecoderConfig) -> PositionEncoding:
    return PositionEncoding(bias=ALiBi(c.num_heads))


# hybrids: RoPE on q and k plus a score bias (ALiBi's fixed recency penalty, or a learned b(i - j))
@register_position_encoding("rope_alibi")
def _rope_alibi(c: DecoderConfig) -> PositionEncoding:
    return PositionEncoding(rope=_rope(c).rope, bias=ALiBi(c.num_heads))


@register_position_encoding("rope_relative")
def _rope_relative(c: DecoderConfig) -> PositionEncoding:
    return PositionEncoding(rope=_rope(c).rope, bias=RelativePositionBias(c.num_heads))


# ------------------------------------------------------------------------------------------------
# building blocks


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in fp32 (squares of bf16 activations lose too much)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(check_positive_int(hidden_size, "hidden_size")))
        self.eps = check_positive_float(eps, "eps")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020), as in LLaMA."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        check_positive_int(hidden_size, "hidden_size")
        check_positive_int(intermediate_size, "intermediate_size")
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each added to the residual stream."""

    def __init__(self, c: DecoderConfig, position: PositionEncoding, rope: nn.Module | None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.attn = RotaryAttention(
            c.hidden_size,
            c.num_heads,
            num_kv_heads=c.num_kv_heads,
            causal=True,
            dropout=c.dropout,
            rope=rope if rope is not None else False,
            position_bias=position.bias,
        )
        self.mlp_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)  # type: ignore[arg-type]
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x, *, attention_mask, positions, tables, cache, static_step=None):
        x = x + self.dropout(
            self.attn(
                self.attn_norm(x),
                attention_mask=attention_mask,
                position_ids=positions,
                tables=tables,
                cache=cache,
                static_step=static_step,
            )
        )
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


# ------------------------------------------------------------------------------------------------
# the model


class Decoder(GenerationMixin, nn.Module):
    """A LLaMA-style causal language model with a pluggable position encoding.

    Layers rotate q and k (and their gradients) in place (:class:`~rotary.nn.RotaryAttention`'s ``inplace_rope``);
    set ``layer.attn.inplace_rope = False`` to keep q and k unrotated for other uses.

    Example:
        >>> from rotary.models import Decoder, DecoderConfig
        >>> model = Decoder(DecoderConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2))
        >>> ids = torch.randint(100, (2, 5))
        >>> model(ids).shape
        torch.Size([2, 5, 100])
        >>> model.generate(ids, max_new_tokens=3).shape
        torch.Size([2, 8])
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        position = POSITION_ENCODINGS[config.position_encoding](config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = position.embedding
        #: the rotary producer shared by every layer (None without one); tables once per forward
        self.rope = position.rope
        #: which layers rotate; the others are NoPE layers (config.no_rope_layers)
        self.rope_layers = rope_layer_flags(config.no_rope_layers, config.num_layers)
        if self.rope is None and not all(self.rope_layers):
            raise InputError(
                f"no_rope_layers turns the rotation off in some layers, but position_encoding="
                f"{config.position_encoding!r} rotates none; use it with a rotary encoding (rope, p_rope, xpos)"
            )
        #: the NoPE layers' producer: Llama 4's query temperature, or None (no rotation, no scaling)
        self.nope = None
        if not all(self.rope_layers) and config.attn_temperature_tuning:
            self.nope = NoPETemperature(config.head_dim, floor_scale=config.floor_scale, attn_scale=config.attn_scale)
        self.layers = nn.ModuleList(
            Block(config, position, self.rope if uses_rope else self.nope) for uses_rope in self.rope_layers
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._captured = CapturedDecoding()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def set_rope_scaling(self, scaling: dict[str, Any] | None) -> None:
        """Change the RoPE scaling of this (trained) model, e.g. for evaluation past the trained length.

        Every layer gets the RoPE ``DecoderConfig(rope_scaling=scaling)`` would build (``scaling``: a Hugging Face-style
        block or ``None``); weights and learned factors carry over. Raises ``rotary.errors.InputError`` if the position
        encoding has no RoPE, or the block is invalid for it (a ``rope_theta`` that contradicts ``rope_base`` too).

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4))
            >>> model.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
            >>> model.layers[0].attn.rope.freqs.rope_type
            'linear'
        """
        if not isinstance(self.rope, RoPE):
            raise InputError(
                f"position_encoding={self.config.position_encoding!r} has no rotary.RoPE to rescale; "
                "set_rope_scaling needs a RoPE-based encoding (e.g. 'rope')"
            )
        if scaling is not None and not isinstance(scaling, Mapping):
            raise InputTypeError(f"scaling must be a dict (a rope_scaling block) or None, got {type(scaling).__name__}")
        self._capture_state().clear()  # a captured step holds the old tables
        config = dataclasses.replace(self.config, rope_scaling=None if scaling is None else dict(scaling))
        rope = POSITION_ENCODINGS[config.position_encoding](config).rope
        if not isinstance(rope, RoPE):  # a registered encoding whose builder drops RoPE for this block
            raise InputError(
                f"position_encoding={config.position_encoding!r} builds no rotary.RoPE for rope_scaling={scaling!r}"
            )
        if self.rope.log_frequency_scale is not None:
            if rope.log_frequency_scale is None:
                raise InputError(
                    "this model's RoPE learns its frequencies but its config builds fixed ones: rescale the RoPE "
                    "itself (model.rope.with_scaling(block)) and hand it to the layers"
                )
            with torch.no_grad():  # the learned factors carry over to the rescaled frequencies
                rope.log_frequency_scale.copy_(self.rope.log_frequency_scale)
        rope = rope.to(self.rope.inv_freq.device)
        self.rope = rope
        for layer, uses_rope in zip(self.layers, self.rope_layers):
            if uses_rope:
                layer.attn.rope = rope
        self.config = config

    def _positions(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | Positions | None,
        cache: list[KVCache] | list[StaticKVCache] | None,
    ) -> Positions:
        batch, seq_len = input_ids.shape
        if position_ids is not None:
            return P.from_ids(position_ids, batch=batch, seq_len=seq_len, device=input_ids.device)
        if cache is not None and isinstance(cache[0], StaticKVCache):
            return cache[0].next_positions(seq_len, attention_mask)  # on the device, mask of the new tokens
        if attention_mask is not None:
            found = P.from_attention_mask(attention_mask.to(input_ids.device))
            if found.ids.shape[-1] < seq_len:
                raise InputError(
                    f"attention_mask covers {found.ids.shape[-1]} tokens but input_ids has S={seq_len}; "
                    "it must cover the cached and the new tokens"
                )
            return Positions.unchecked(found.ids[:, -seq_len:], found.bound, exact=False)
        if cache is not None and cache[0].length:  # type: ignore[union-attr]
            return cache[0].next_positions(seq_len)
        return P.arange(seq_len, device=input_ids.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | Positions | None = None,
        cache: list[KVCache] | list[StaticKVCache] | None = None,
    ) -> torch.Tensor:
        """Next-token logits ``[B, S, V]`` (fp32 or the model's dtype); positions and tables computed once.

        Args:
            input_ids: int64 ``[B, S]`` (off the CPU an id outside the vocabulary is the caller's contract).
            attention_mask: ``[B, T]`` 1 = token / 0 = padding over cached + new tokens (``T = past + S``); with static
                caches, ``[B, S]`` over the new tokens only.
            position_ids: ``[B, S]``; default ``cumsum(attention_mask) - 1``, else after the cache, else ``0..S-1``.
            cache: from :meth:`new_cache`, extended (or written) in place.

        Raises ``rotary.errors.InputError`` (CPU) for an id outside the vocabulary, a cache that is not one per layer or
        a bad mask.
        """
        input_ids, unknown = embedding_ids(input_ids, self.config.vocab_size)
        return self._logits(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, unknown=unknown
        )

    def _logits(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | Positions | None,
        cache: list[KVCache] | list[StaticKVCache] | None,
        unknown: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` for checked ids; ``unknown`` ``[B, S]`` marks clamped out-of-range ids, embedded as zeros."""
        if cache is not None:
            if not isinstance(cache, (list, tuple)):
                raise InputTypeError(
                    f"cache must be a list of KVCache, one per layer, got {type(cache).__name__}; use new_cache()"
                )
            if len(cache) != len(self.layers):
                raise InputError(
                    f"cache has {len(cache)} entries but the model has {len(self.layers)} layers; use new_cache()"
                )
            if len({id(c) for c in cache}) != len(cache):
                raise InputError(
                    "the same KVCache object appears for several layers ([KVCache()] * n); every layer needs its own: "
                    "use model.new_cache()"
                )
            if len({isinstance(c, StaticKVCache) for c in cache}) > 1:
                raise InputTypeError(
                    "cache mixes KVCache and StaticKVCache; use one kind for every layer (model.new_cache(...))"
                )
        if attention_mask is not None:  # checked once here, handed to the layers as bool
            attention_mask = check_attention_mask(attention_mask).to(input_ids.device)
        positions = self._positions(input_ids, attention_mask, position_ids, cache)
        x = self.embed_tokens(input_ids)
        if unknown is not None:  # ids outside the vocabulary (clamped): embedded as 0
            x = x.masked_fill(unknown[..., None], 0.0)
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions.ids.expand(input_ids.shape)).to(x.dtype)
        tables: RotaryTables | None = None
        if self.rope is not None:
            tables = self.rope.tables(positions, dtype=table_dtype(x.dtype))
        nope_tables = None if self.nope is None else self.nope.tables(positions, dtype=table_dtype(x.dtype))
        step = None if cache is None else StaticStep.of(cache)  # static caches of one group: one mask for all layers
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                attention_mask=attention_mask,
                positions=positions,
                tables=tables if self.rope_layers[i] else nope_tables,
                cache=None if cache is None else cache[i],
                static_step=step,
            )
        return self.lm_head(self.norm(x))

    def loss(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy of ``input_ids`` ``[B, S]`` (padding targets ignored)."""
        logits = self(input_ids, attention_mask=attention_mask)[:, :-1]
        targets = input_ids[:, 1:]
        if attention_mask is not None:
            targets = targets.masked_fill(attention_mask[:, 1:] == 0, -100)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)
