"""A small LLaMA-style causal language model, readable top to bottom.

    token ids -> embedding (+ absolute position embedding, if any)
              -> num_layers x [ RMSNorm -> RotaryAttention (GQA, KV cache) -> residual
                               RMSNorm -> SwiGLU MLP                       -> residual ]
              -> RMSNorm -> lm_head (optionally tied to the embedding) -> logits

The position encoding is one switch, ``DecoderConfig.position_encoding``, looked up in
:data:`POSITION_ENCODINGS`. Each entry builds a :class:`PositionEncoding` saying where it acts: on the
token embeddings (learned, sinusoidal), on q and k in every layer (RoPE, p-RoPE, xPos), or on the
attention scores (ALiBi). A new variant is one registration, e.g.::

    POSITION_ENCODINGS["scaled"] = lambda c: PositionEncoding(rope=RoPE(c.head_dim, scaling={...}))

``DecoderConfig.no_rope_layers`` turns the rotation off in some layers (NoPE layers, as in Llama 4),
whose queries Llama 4 scales by a temperature at long range (:mod:`rotary.variants.nope`).
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

from .. import deferred
from .. import positions as P
from .._checks import check_bool, check_int, check_positive_float, check_positive_int, check_probability, is_number
from ..nn.attention import KVCache, RotaryAttention, StaticKVCache
from ..nn.position import ALiBi, LearnedPositionEmbedding, RelativePositionBias, SinusoidalPositionEmbedding
from ..positions import Positions, check_attention_mask
from ..rope import RoPE
from ..tables import RotaryTables, table_dtype
from ..variants.nope import NoPETemperature, default_no_rope_layers, rope_layer_flags
from ..variants.xpos import XPos
from ._inputs import embedding_ids

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
        vocab_size: number of token ids ``V``.
        hidden_size: model width ``E``.
        num_layers: transformer blocks.
        num_heads: query heads ``H``.
        num_kv_heads: key/value heads (GQA; 1 = MQA); default ``num_heads``.
        intermediate_size: SwiGLU width; default ``8/3 * E`` rounded up to a multiple of 8.
        max_position: initial RoPE table length, and the size of a learned position table.
        position_encoding: a key of :data:`POSITION_ENCODINGS` (``rope``, ``p_rope``, ``xpos``, ``none``,
            ``learned``, ``sinusoidal``, ``alibi``, ...).
        rope_base: RoPE base ``theta``.
        rope_scaling: Hugging Face-style scaling block for RoPE (any ``rope_type`` of
            :data:`rotary.ROPE_INIT_FUNCTIONS`).
        rope_interleaved: RoPE pairing (``False``: Hugging Face halves).
        p_rope_fraction: p-RoPE's ``p`` (``position_encoding="p_rope"``): the fraction of pairs, the
            fastest, that rotate; the others carry no position.
        xpos_scale_base: xPos's ``γ`` (``position_encoding="xpos"``).
        no_rope_layers: NoPE layers, Llama 4's convention: one flag per layer, 1 = the layer rotates,
            0 = it uses no position encoding; ``True`` for Llama 4's default (every
            ``no_rope_layer_interval``-th layer is NoPE: layers 3, 7, ... for 4); ``None``/``False``:
            every layer rotates. Stored as the list.
        no_rope_layer_interval: see ``no_rope_layers=True``.
        attn_temperature_tuning: Llama 4's query temperature in NoPE layers,
            ``1 + attn_scale · log1p(floor((n + 1) / floor_scale))``.
        floor_scale: its step length in tokens.
        attn_scale: its strength.
        rms_norm_eps: RMSNorm epsilon.
        tie_word_embeddings: share the embedding matrix with the output head.
        dropout: dropout on attention probabilities and residual branches (training only).
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
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
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
            raise ValueError(f"rope_scaling must be a dict such as {{'rope_type': 'linear', 'factor': 2.0}}, got {self.rope_scaling!r}")
        if not isinstance(self.position_encoding, str) or self.position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"unknown position_encoding {self.position_encoding!r}; "
                f"registered: {', '.join(sorted(POSITION_ENCODINGS))}"
            )
        if not is_number(self.p_rope_fraction) or not 0 < self.p_rope_fraction <= 1:
            raise ValueError(f"p_rope_fraction must be in (0, 1], got {self.p_rope_fraction!r}")
        check_positive_float(self.xpos_scale_base, "xpos_scale_base")
        check_bool(self.attn_temperature_tuning, "attn_temperature_tuning")
        check_positive_int(self.no_rope_layer_interval, "no_rope_layer_interval")
        check_positive_int(self.floor_scale, "floor_scale")
        if not is_number(self.attn_scale) or self.attn_scale < 0:
            raise ValueError(f"attn_scale must be a finite number >= 0, got {self.attn_scale!r}")
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
    """Where a position encoding acts. Any field may be None; the modules are shared by all layers.

    Attributes:
        embedding: ``position_ids [B, S] -> [B, S, E]``, added to the token embeddings.
        rope: rotates q and k in every layer: a producer of tables, ``rope.tables(positions, dtype=)
            -> RotaryTables`` (:class:`rotary.RoPE`, or a variant such as xPos); the model calls it
            once per forward and hands the tables to every layer.
        bias: attention-score bias ``(query_positions [B, S], key_positions [B, T]) -> [B, H, S, T]``.
    """

    embedding: nn.Module | None = None
    rope: nn.Module | None = None
    bias: nn.Module | None = None


#: ``position_encoding`` name -> builder ``(DecoderConfig) -> PositionEncoding``
POSITION_ENCODINGS: dict[str, Callable[[DecoderConfig], PositionEncoding]] = {}


def register_position_encoding(name: str) -> Callable:
    """Decorator adding a builder ``(DecoderConfig) -> PositionEncoding`` to :data:`POSITION_ENCODINGS`."""

    def deco(build: Callable[[DecoderConfig], PositionEncoding]) -> Callable[[DecoderConfig], PositionEncoding]:
        POSITION_ENCODINGS[name] = build
        return build

    return deco


@register_position_encoding("rope")
def _rope(c: DecoderConfig) -> PositionEncoding:
    rope = RoPE(
        c.head_dim, base=c.rope_base, scaling=c.rope_scaling, interleaved=c.rope_interleaved, max_position=c.max_position
    )
    return PositionEncoding(rope=rope)


@register_position_encoding("p_rope")
def _p_rope(c: DecoderConfig) -> PositionEncoding:
    # p-RoPE (Barbero et al., 2025): only the fastest p of the pairs rotate, the rest carry no position;
    # it is transformers' "proportional" rope_type
    scaling = {"rope_type": "proportional", "partial_rotary_factor": c.p_rope_fraction, **(c.rope_scaling or {})}
    if scaling["rope_type"] != "proportional":
        raise ValueError(
            f"position_encoding='p_rope' is the 'proportional' rope_type; rope_scaling has rope_type {scaling['rope_type']!r} "
            "(use position_encoding='rope' for other scaling types)"
        )
    rope = RoPE(c.head_dim, base=c.rope_base, scaling=scaling, interleaved=c.rope_interleaved, max_position=c.max_position)
    return PositionEncoding(rope=rope)


@register_position_encoding("xpos")
def _xpos(c: DecoderConfig) -> PositionEncoding:
    if c.rope_scaling:
        raise ValueError(f"position_encoding='xpos' takes no rope_scaling (got {c.rope_scaling!r}); set xpos_scale_base")
    xpos = XPos(
        c.head_dim, scale_base=c.xpos_scale_base, base=c.rope_base, interleaved=c.rope_interleaved, max_position=c.max_position
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
            c.hidden_size, c.num_heads, num_kv_heads=c.num_kv_heads, causal=True, dropout=c.dropout,
            rope=rope if rope is not None else False, position_bias=position.bias,
        )
        self.mlp_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size)  # type: ignore[arg-type]
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, x, *, attention_mask, positions, tables, cache):
        x = x + self.dropout(
            self.attn(self.attn_norm(x), attention_mask=attention_mask, position_ids=positions, tables=tables, cache=cache)
        )
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


# ------------------------------------------------------------------------------------------------
# generation helpers

#: what ``Decoder.generate(capture=...)`` accepts
CAPTURE_MODES = ("compile", "cuda_graph")
#: static caches of captured generation are this many slots long, rounded up: prompts of about the same
#: length reuse one cache and one captured step (capturing or compiling again costs seconds)
CAPTURE_LENGTH_STEP = 64


class _Captured:
    """The static caches and the captured decoding step that ``generate(capture=...)`` keeps for its next
    call (one set: a new shape replaces it). Copies and pickles of the model start without them."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.caches: list[StaticKVCache] = []
        self.step: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.keep: list[Any] = []  # tensors a CUDA graph reads and nothing else would keep alive

    def clear(self) -> None:
        self.key, self.caches, self.step, self.keep = None, [], None, []

    def __deepcopy__(self, memo: dict) -> _Captured:
        return _Captured()

    def __reduce__(self) -> tuple[type, tuple]:
        return (_Captured, ())


def next_token(
    logits: torch.Tensor, *, temperature: float = 0.0, top_k: int | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The next token of every row from its logits, on the device (nothing read on the host).

    Greedy (``temperature=0``): the argmax. Otherwise a sample of ``softmax(logits / temperature)``, over
    the ``top_k`` most likely tokens when given, drawn as ``torch.multinomial(probs, 1, generator=...)``
    draws it (``argmax(probs / q)`` with ``q ~ Exp(1)``, the same numbers from the same generator) but
    without multinomial's host check of the probabilities, a synchronisation on a GPU.

    Args:
        logits: ``[B, V]``.
        temperature: 0 for greedy, else > 0.
        top_k: keep the ``k`` largest logits of each row (``None``: all).
        generator: the random generator of the samples (on the logits' device).

    Returns:
        int64 ``[B, 1]``.

    Example:
        >>> next_token(torch.tensor([[0.1, 2.0, -1.0]])).tolist()
        [[1]]
    """
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    # shifted first, so that a tiny temperature gives -inf and 0, never inf - inf = NaN
    logits = (logits - logits.max(-1, keepdim=True).values) / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / q).argmax(-1, keepdim=True)


# ------------------------------------------------------------------------------------------------
# the model


class Decoder(nn.Module):
    """A LLaMA-style causal language model with a pluggable position encoding.

    Every layer rotates its fresh q/k projections in place, and their gradients in place in the
    backward (:class:`~rotary.nn.RotaryAttention`'s ``inplace_rope``): bit-identical to rotating out
    of place, with no q/k-sized allocation for RoPE. A forward hook on a layer's ``q_proj`` or
    ``k_proj`` turns it off for that layer (the hook would otherwise see its output rotated later);
    so does ``torch.compile``. To keep q and k unrotated for other uses, set
    ``layer.attn.inplace_rope = False``.

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
            raise ValueError(
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
        self._captured = _Captured()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def new_cache(
        self,
        *,
        batch: int | None = None,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> list[KVCache] | list[StaticKVCache]:
        """One cache per layer, for :meth:`forward` ``(cache=...)`` and :meth:`decode_step`.

        Without ``max_len``: empty :class:`rotary.nn.KVCache` s, which grow with every call. With
        ``max_len``: :class:`rotary.nn.StaticKVCache` s of ``max_len`` slots for a batch of ``batch`` (keys
        ``[batch, num_kv_heads, max_len, head_dim]`` per layer): the same shapes at every step, so that a
        decoding step can be captured in a CUDA graph or by ``torch.compile(mode="reduce-overhead")``.

        Args:
            batch: rows ``B`` (static caches only; required with ``max_len``).
            max_len: slots: prompt (padding included) plus new tokens.
            dtype: of keys and values; default: the model's (its embedding's) dtype.
            device: default: the model's device.

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4)).eval()
            >>> ids = torch.randint(50, (2, 5))
            >>> cache = model.new_cache(batch=2, max_len=8)
            >>> with torch.no_grad():
            ...     prefill = model(ids, cache=cache)  # writes slots 0 .. 4
            ...     logits = model.decode_step(prefill[:, -1:].argmax(-1), cache)  # slot 5
            >>> logits.shape, int(cache[0].filled), tuple(cache[0].keys.shape)
            (torch.Size([2, 50]), 6, (2, 4, 8, 8))
        """
        if max_len is None:
            if batch is not None or dtype is not None or device is not None:
                raise ValueError(
                    "batch, dtype and device size a static cache: pass max_len too (new_cache(batch=B, max_len=L)), "
                    "or none of them for growing KVCaches"
                )
            return [KVCache() for _ in self.layers]
        if batch is None:
            raise ValueError(f"a static cache (max_len={max_len!r}) is made for one batch size: pass batch=B as well")
        weight = self.embed_tokens.weight
        c = self.config
        return [
            StaticKVCache(
                batch, c.num_kv_heads, max_len, c.head_dim, dtype=weight.dtype if dtype is None else dtype,  # type: ignore[arg-type]
                device=weight.device if device is None else device,
            )
            for _ in self.layers
        ]

    def release_captured(self) -> None:
        """Free the static caches and the captured decoding step that :meth:`generate` keeps between calls
        with ``capture=...`` (the next such call captures again)."""
        self._capture_state().clear()

    def _capture_state(self) -> _Captured:
        """What :meth:`generate` keeps between captured calls (made here for models unpickled without it)."""
        held = self.__dict__.get("_captured")
        if held is None:
            held = self.__dict__["_captured"] = _Captured()
        return held

    def set_rope_scaling(self, scaling: dict[str, Any] | None) -> None:
        """Change the RoPE scaling of this (trained) model, e.g. for evaluation past the trained length.

        The weights are untouched (RoPE has no parameters); every layer gets the new RoPE, exactly as
        if the model had been built with ``DecoderConfig(rope_scaling=scaling)`` and this state dict.

        Args:
            scaling: a Hugging Face-style block (``{"rope_type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 512}``), or ``None`` for plain RoPE.

        The new RoPE comes from the same builder as at construction (:data:`POSITION_ENCODINGS`), so
        everything the constructor would do or refuse happens here too: ``p_rope`` stays p-RoPE (the
        block is merged into its ``proportional`` one), a ``rope_theta`` that contradicts
        ``rope_base`` is an error, ``xpos`` takes no block. Learned frequency factors carry over.

        Raises:
            ValueError: the model's position encoding has no RoPE, or the block is invalid for it.

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4))
            >>> model.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
            >>> model.layers[0].attn.rope.freqs.rope_type
            'linear'
        """
        if not isinstance(self.rope, RoPE):
            raise ValueError(
                f"position_encoding={self.config.position_encoding!r} has no rotary.RoPE to rescale; "
                "set_rope_scaling needs a RoPE-based encoding (e.g. 'rope')"
            )
        if scaling is not None and not isinstance(scaling, Mapping):
            raise TypeError(f"scaling must be a dict (a rope_scaling block) or None, got {type(scaling).__name__}")
        self._capture_state().clear()  # a captured step holds the old tables
        config = dataclasses.replace(self.config, rope_scaling=None if scaling is None else dict(scaling))
        rope = POSITION_ENCODINGS[config.position_encoding](config).rope
        if not isinstance(rope, RoPE):  # a registered encoding whose builder drops RoPE for this block
            raise ValueError(f"position_encoding={config.position_encoding!r} builds no rotary.RoPE for rope_scaling={scaling!r}")
        if self.rope.log_frequency_scale is not None:
            if rope.log_frequency_scale is None:
                raise ValueError(
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
                raise ValueError(
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
        """Next-token logits.

        Positions are computed (and validated) once, and the rotary tables once, for all layers. Nothing
        is read back on the host on devices other than the CPU: an id outside the vocabulary is flagged
        there (:func:`rotary.check_device_errors` raises it) and embedded as 0, where the CPU raises at once.

        Args:
            input_ids: int64 ``[B, S]``.
            attention_mask: ``[B, T]`` 1 = token / 0 = padding over cached + new tokens (``T = past + S``);
                with static caches, ``[B, S]`` over the new tokens only (the caches keep earlier padding).
            position_ids: ``[B, S]``; default: ``cumsum(attention_mask) - 1`` (left padding starts real
                tokens at 0), else continuing the cache, else ``0..S-1``.
            cache: from :meth:`new_cache`; extended (or, static, written) in place.

        Returns:
            fp32-or-model-dtype logits ``[B, S, V]``.
        """
        input_ids, unknown = embedding_ids(input_ids, self.config.vocab_size)
        return self._logits(input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache, unknown=unknown)

    def decode_step(self, input_ids: torch.Tensor, cache: list[StaticKVCache]) -> torch.Tensor:
        """One decoding step on static caches: the fp32 logits ``[B, V]`` of the token after ``input_ids``.

        ``input_ids`` ``[B, 1]`` (the last sampled tokens) are written to the next slot of every layer's
        cache, at the position after each row's last one. Shapes are the same at every step and nothing is
        read on the host (off the CPU), so the step can be captured in a CUDA graph or compiled with
        ``torch.compile(mode="reduce-overhead")``: :meth:`generate` does either with ``capture=``.

        Args:
            input_ids: int64 ``[B, 1]`` (or ``[B, S]``: S tokens at once, the logits of the last).
            cache: from :meth:`new_cache` ``(batch=B, max_len=...)``, filled by a prefill (:meth:`forward`).

        Returns:
            fp32 ``[B, V]``.

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4)).eval()
            >>> cache = model.new_cache(batch=1, max_len=4)
            >>> with torch.no_grad():
            ...     _ = model(torch.tensor([[1, 2]]), cache=cache)
            ...     model.decode_step(torch.tensor([[3]]), cache).shape
            torch.Size([1, 50])
        """
        if not isinstance(cache, (list, tuple)) or not cache or not all(isinstance(c, StaticKVCache) for c in cache):
            raise TypeError(
                f"decode_step needs static caches (model.new_cache(batch=B, max_len=L)), got {type(cache).__name__}; "
                "with growing KVCaches call the model itself: model(input_ids, cache=cache)"
            )
        return self.forward(input_ids, cache=cache)[:, -1].float()

    def _logits(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | Positions | None,
        cache: list[KVCache] | list[StaticKVCache] | None,
        unknown: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` for ids already checked (``generate``'s own tokens come from the vocabulary);
        ``unknown`` ``[B, S]`` marks ids that were out of range (clamped), whose embeddings are zeroed."""
        if cache is not None:
            if not isinstance(cache, (list, tuple)):
                raise TypeError(f"cache must be a list of KVCache, one per layer, got {type(cache).__name__}; use new_cache()")
            if len(cache) != len(self.layers):
                raise ValueError(f"cache has {len(cache)} entries but the model has {len(self.layers)} layers; use new_cache()")
            if len({id(c) for c in cache}) != len(cache):
                raise ValueError(
                    "the same KVCache object appears for several layers ([KVCache()] * n); every layer needs its own: "
                    "use model.new_cache()"
                )
            if len({isinstance(c, StaticKVCache) for c in cache}) > 1:
                raise TypeError("cache mixes KVCache and StaticKVCache; use one kind for every layer (model.new_cache(...))")
        if attention_mask is not None:  # checked once here, handed to the layers as bool
            attention_mask = check_attention_mask(attention_mask).to(input_ids.device)
        positions = self._positions(input_ids, attention_mask, position_ids, cache)
        x = self.embed_tokens(input_ids)
        if unknown is not None:  # ids outside the vocabulary (flagged, clamped): embedded as 0, as the flag says
            x = x.masked_fill(unknown[..., None], 0.0)
        if self.embed_positions is not None:
            x = x + self.embed_positions(positions.ids.expand(input_ids.shape)).to(x.dtype)
        tables: RotaryTables | None = None
        if self.rope is not None:
            tables = self.rope.tables(positions, dtype=table_dtype(x.dtype))
        nope_tables = None if self.nope is None else self.nope.tables(positions, dtype=table_dtype(x.dtype))
        for i, layer in enumerate(self.layers):
            x = layer(
                x, attention_mask=attention_mask, positions=positions, tables=tables if self.rope_layers[i] else nope_tables,
                cache=None if cache is None else cache[i],
            )  # fmt: skip
        return self.lm_head(self.norm(x))

    def loss(self, input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy of ``input_ids`` ``[B, S]`` (padding targets ignored)."""
        logits = self(input_ids, attention_mask=attention_mask)[:, :-1]
        targets = input_ids[:, 1:]
        if attention_mask is not None:
            targets = targets.masked_fill(attention_mask[:, 1:] == 0, -100)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        cache: str | None = None,
        capture: str | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
    ) -> torch.Tensor:
        """Continue ``input_ids`` ``[B, S]`` by ``max_new_tokens`` tokens; returns int64 ``[B, S + max_new_tokens]``.

        The prompt is run once and every new token is one cached step. ``temperature=0`` is greedy;
        otherwise tokens are sampled from ``softmax(logits / temperature)``, restricted to the ``top_k``
        most likely when given (the same draws as ``torch.multinomial`` with ``generator``, see
        :func:`next_token`). ``attention_mask`` marks left padding in the prompt.

        Sampling and stopping happen on the device: on a GPU nothing is read back per token, and the
        checks of the prompt (ids in the vocabulary, left padding, 0/1 mask) are deferred to one
        :func:`rotary.check_device_errors` at the end (on the CPU they raise at once, before any work).

        Args:
            input_ids: int64/int32 ``[B, S]``, ``S >= 1``.
            max_new_tokens: tokens to add to every row.
            attention_mask: ``[B, S]`` 1 = token / 0 = left padding.
            temperature: 0 = greedy, else the sampling temperature.
            top_k: sample among the ``top_k`` most likely tokens.
            generator: the random generator of the samples (on the model's device).
            use_cache: ``False`` recomputes the whole sequence every step (slow; a check of the cache).
            cache: ``"dynamic"`` (:class:`rotary.nn.KVCache`, grown by concatenation; the default without
                ``capture``) or ``"static"`` (:class:`rotary.nn.StaticKVCache` of ``S + max_new_tokens - 1``
                slots, written in place: the same shapes at every step).
            capture: the switch to capture the decoding step (static cache implied); the prefill runs
                eagerly, sampling stays outside the captured step (the generator's draws are unchanged):

                - ``"compile"``: ``torch.compile(model.decode_step, fullgraph=True)``, with
                  ``mode="reduce-overhead"`` on CUDA (Inductor's kernels replayed as CUDA graphs), plain
                  Inductor elsewhere (the CPU included);
                - ``"cuda_graph"``: the eager step recorded once in a ``torch.cuda.CUDAGraph`` and replayed
                  (no compilation: ready in well under a second; CUDA only, a ``ValueError`` elsewhere).

                The captured step and its caches (sized to a multiple of 64 slots) are kept for the next
                call of the same batch size and length bucket; :meth:`release_captured` frees them. Greedy
                tokens equal the eager ones (fp32; logits may differ in the last bits, attention then
                reads every slot of the cache).
            eos_token_id: a row that emits it is finished: its later tokens are ``pad_token_id``.
                Generation still runs ``max_new_tokens`` steps (stopping early would read a flag on the
                host every step).
            pad_token_id: what finished rows emit (default ``eos_token_id``).

        Example:
            >>> from rotary.models import Decoder, DecoderConfig
            >>> model = Decoder(DecoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4)).eval()
            >>> ids = torch.randint(50, (2, 5))
            >>> model.generate(ids, 4, cache="static").equal(model.generate(ids, 4))
            True
        """
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        if not is_number(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
        if top_k is not None:
            check_positive_int(top_k, "top_k")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {generator!r} ({type(generator).__name__})")
        use_cache = check_bool(use_cache, "use_cache")
        if cache not in (None, "dynamic", "static"):
            raise ValueError(f"cache must be 'dynamic' (KVCache) or 'static' (StaticKVCache), got {cache!r}")
        if capture not in (None, *CAPTURE_MODES):
            raise ValueError(f"capture must be None, 'compile' or 'cuda_graph', got {capture!r}")
        if capture is not None and cache == "dynamic":
            raise ValueError(f"capture={capture!r} needs static shapes: use cache='static' (or leave cache unset)")
        static = cache == "static" or capture is not None
        if static and not use_cache:
            raise ValueError("use_cache=False recomputes every step without a cache; it cannot go with a static cache or capture")
        vocab = self.config.vocab_size
        for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
            if value is not None and (check_int(value, name, minimum=0) >= vocab):
                raise ValueError(f"{name}={value} is not a token id of this model (vocab_size={vocab})")
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(
                f"generate needs a prompt of at least one token, input_ids [B, S] with S >= 1, got "
                f"{getattr(input_ids, 'shape', input_ids)}"
            )
        ids, unknown = embedding_ids(input_ids, vocab)
        device = ids.device
        if capture == "cuda_graph" and device.type != "cuda":
            raise ValueError(
                f"capture='cuda_graph' records the decoding step in a torch.cuda.CUDAGraph, which needs the model and "
                f"input_ids on a CUDA device, got {device}; use capture='compile' (any device) or capture=None"
            )
        mask = self._prompt_mask(attention_mask, ids)
        pad = eos_token_id if pad_token_id is None else pad_token_id
        stop = None if eos_token_id is None else (eos_token_id, pad)
        sample = dict(temperature=temperature, top_k=top_k, generator=generator)
        if max_new_tokens == 0:
            tokens = input_ids
        elif static:
            tokens = self._generate_static(input_ids, ids, unknown, mask, max_new_tokens, sample, capture, stop)
        else:
            tokens = self._generate_dynamic(input_ids, ids, unknown, mask, max_new_tokens, sample, use_cache, stop)
        if not deferred.host_checks(device):
            deferred.check_device_errors(device)  # the one synchronisation of the call
        return tokens

    def _prompt_mask(self, attention_mask: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
        """The prompt's 0/1 mask ``[B, S]`` (int), checked: a token in every row, left padding only."""
        if attention_mask is None:
            return torch.ones_like(ids)
        mask = check_attention_mask(attention_mask).to(ids.device).long()
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask must be [B, S] = {tuple(ids.shape)}, got {tuple(mask.shape)}")
        # a row of padding only is an empty prompt: there is no token to continue
        empty = mask.sum(dim=1) == 0
        # new tokens are appended on the right: padding after a row's tokens would sit between its
        # prompt and its continuation, so the row would continue differently from its unpadded prompt
        right = (mask[:, 1:] < mask[:, :-1]).any(dim=1)
        if not deferred.host_checks(ids.device):
            deferred.record(deferred.PROMPT_SLOT, empty | right)
            return mask
        if bool(empty.any()):
            rows = empty.nonzero().flatten().tolist()
            raise ValueError(
                f"attention_mask row(s) {rows[:8]} mark no token: generate needs a prompt of at least one token in "
                "every row; drop those rows or give each a token"
            )
        if bool(right.any()):
            rows = right.nonzero().flatten().tolist()
            raise ValueError(
                f"generate needs left padding, but row(s) {rows[:8]} have padding after their tokens (right "
                "padding); pad prompts on the left (tokenizer.padding_side = 'left')"
            )
        return mask

    @staticmethod
    def _stop(token: torch.Tensor, finished: torch.Tensor | None, stop: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows already finished emit the pad id; a row that emits eos is finished from now on."""
        if stop is None:
            return token, None
        eos, pad = stop
        if finished is not None:
            token = torch.where(finished, pad, token)
        done = token == eos
        return token, done if finished is None else finished | done

    def _generate_dynamic(
        self,
        input_ids: torch.Tensor,
        ids: torch.Tensor,
        unknown: torch.Tensor | None,
        mask: torch.Tensor,
        max_new_tokens: int,
        sample: dict,
        use_cache: bool,
        stop: tuple[int, int] | None,
    ) -> torch.Tensor:
        """:meth:`generate` on growing :class:`KVCache` s (or none: recomputing every step)."""
        self._prepare_tables(ids.shape[1] + max_new_tokens, ids.device)
        cache = self.new_cache() if use_cache else None
        new: list[torch.Tensor] = []
        step_input, finished = ids, None
        for _ in range(max_new_tokens):
            logits = self._logits(step_input, attention_mask=mask, position_ids=None, cache=cache, unknown=unknown)[:, -1].float()
            token, finished = self._stop(next_token(logits, **sample), finished, stop)
            new.append(token)
            mask = torch.cat((mask, torch.ones_like(token)), dim=1)
            if use_cache:
                step_input, unknown = token, None
            else:
                step_input = torch.cat((step_input, token), dim=1)
                if unknown is not None:
                    unknown = torch.cat((unknown, torch.zeros_like(token, dtype=torch.bool)), dim=1)
        return torch.cat((input_ids, *new), dim=1)

    def _generate_static(
        self,
        input_ids: torch.Tensor,
        ids: torch.Tensor,
        unknown: torch.Tensor | None,
        mask: torch.Tensor,
        max_new_tokens: int,
        sample: dict,
        capture: str | None,
        stop: tuple[int, int] | None,
    ) -> torch.Tensor:
        """:meth:`generate` on :class:`StaticKVCache` s: an eager prefill, then one :meth:`decode_step` per
        token (captured with ``capture``), sampling outside it."""
        batch, prompt = ids.shape
        device, dtype = ids.device, self.embed_tokens.weight.dtype
        length = prompt + max_new_tokens - 1  # the last token is sampled, never fed back
        if capture is None:
            caches = self.new_cache(batch=batch, max_len=length, dtype=dtype, device=device)
            self._prepare_tables(length, device)

            def step(token: torch.Tensor) -> torch.Tensor:
                return self.decode_step(token, caches)  # type: ignore[arg-type]

        else:
            caches, step = self._captured_step(capture, batch, length, dtype, device)
        logits = self._logits(ids, attention_mask=mask, position_ids=None, cache=caches, unknown=unknown)[:, -1].float()
        out = torch.empty(batch, max_new_tokens, dtype=torch.int64, device=device)
        token, finished = self._stop(next_token(logits, **sample), None, stop)
        out[:, :1] = token
        for t in range(1, max_new_tokens):
            token, finished = self._stop(next_token(step(token), **sample), finished, stop)
            out[:, t : t + 1] = token
        return torch.cat((input_ids, out), dim=1)

    def _prepare_tables(self, length: int, device: torch.device) -> None:
        """Size the rotary tables for positions ``0 .. length - 1`` on ``device`` before decoding there: a
        device never reads positions back to grow them (and a capture cannot)."""
        if deferred.host_checks(device):
            return  # the CPU sizes its tables from bounds it reads for free
        for producer in (self.rope, self.nope):
            prepare = getattr(producer, "prepare", None)
            if callable(prepare):
                prepare(length, device=device)
        deferred.flags(device)

    def _captured_step(
        self, capture: str, batch: int, length: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[list[StaticKVCache], Callable[[torch.Tensor], torch.Tensor]]:
        """The static caches (reset) and the captured decoding step for this shape, kept from an earlier
        call when they fit (same batch, dtype, device, length bucket and parameters)."""
        max_len = -(-length // CAPTURE_LENGTH_STEP) * CAPTURE_LENGTH_STEP
        weights = tuple(p.data_ptr() for p in self.parameters())  # new parameter storage: capture again
        key = (capture, batch, max_len, dtype, device, weights)
        held = self._capture_state()
        if held.key != key:
            held.clear()
            self._prepare_tables(max_len, device)
            caches = self.new_cache(batch=batch, max_len=max_len, dtype=dtype, device=device)
            if capture == "compile":
                step, keep = self._compiled_step(caches, device), []
            else:
                step, keep = self._cuda_graph_step(caches, batch, device)
            held.key, held.caches, held.step, held.keep = key, caches, step, keep  # type: ignore[assignment]
        for c in held.caches:
            c.reset()
        return held.caches, held.step  # type: ignore[return-value]

    def _compiled_step(self, caches: list[StaticKVCache], device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
        """:meth:`decode_step` compiled: Inductor, and CUDA graphs on CUDA (``mode="reduce-overhead"``)."""
        cuda = device.type == "cuda"
        compiled = torch.compile(self.decode_step, mode="reduce-overhead" if cuda else None, fullgraph=True, dynamic=False)

        def step(token: torch.Tensor) -> torch.Tensor:
            if cuda:
                torch.compiler.cudagraph_mark_step_begin()  # the previous step's logits are consumed
            return compiled(token, caches)

        return step

    def _cuda_graph_step(
        self, caches: list[StaticKVCache], batch: int, device: torch.device
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[Any]]:
        """:meth:`decode_step` recorded in a ``torch.cuda.CUDAGraph``: warmed up on a side stream (kernel
        compilation, library handles), the caches emptied, then captured; a call copies the token into the
        graph's input and replays it."""
        token = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.decode_step(token, caches)
        torch.cuda.current_stream(device).wait_stream(side)
        for c in caches:
            c.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.decode_step(token, caches)
        # the graph reads the rotary tables it was captured with: keep them alive even if the cache grows
        keep: list[Any] = [graph, token, logits]
        for producer in (self.rope, self.nope):
            if producer is not None and callable(getattr(producer, "tables", None)):
                keep.append(producer.tables(P.arange(1, device=device)))

        def step(new_token: torch.Tensor) -> torch.Tensor:
            token.copy_(new_token)
            graph.replay()
            return logits

        return step, keep
