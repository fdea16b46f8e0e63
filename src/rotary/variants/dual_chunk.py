"""Dual-chunk RoPE: the rotations of dual chunk attention (Qwen2.5-1M, 1M-context Qwen3 in vLLM and SGLang).

An, Huang, Zhang, et al., *Training-Free Long-Context Scaling of Large Language Models* (ICML 2024)
split a long sequence into chunks of ``L = chunk_size - local_size`` tokens and never let a query meet a
key at a relative distance the model was not trained on. Keys are rotated at their position within
their chunk, ``j mod L``; a query is rotated three ways, one per kind of key it meets:

============================  ==============================================  ===========================
query table                   position it rotates the query at                used against keys of
============================  ==============================================  ===========================
``intra``                     ``p mod L``                                     the query's own chunk
``successor``                 ``min(p mod L + L, chunk_size)``                the chunk just before
``inter``                     ``min(2L - 1, chunk_size)`` (one constant)      every chunk before that
``successor_critical``        ``p mod L + L`` (not clamped)                   vLLM's sparse attention
``inter_critical``            ``p mod L + chunk_size``                        vLLM's sparse attention
============================  ==============================================  ===========================

Within a chunk the distances are exact; to the previous chunk they are exact up to ``local_size``
tokens of the query's offset and clamped beyond; to older chunks they lie in ``(chunk_size - L,
chunk_size]``, within the trained range. vLLM's and SGLang's ``DualChunkRotaryEmbedding`` build these
five query caches and the key cache (plain RoPE frequencies, no scaling block); vLLM's attention
backend takes ``query``, ``query_succ`` and ``query_inter``, uses the critical two in its sparse
(vertical-and-slash) prefill, and multiplies the queries by ``max(1, 0.1 ln(n / original) + 1)`` for
a sequence of ``n`` tokens when the config gives ``original_max_position_embeddings``
(:meth:`DualChunkRoPE.query_scale`).

Each rotation is an ordinary :class:`~rotary.tables.RotaryTables` for :func:`rotary.rotate` (the
kernels are unchanged). :func:`dual_chunk_attention` is a dense reference of the attention that
combines them (``O(S^2)`` memory, for checking and small inputs; it is not vLLM's paged kernel).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_bool, is_int
from ..errors import ConfigError, InputError, InputTypeError
from ..frequencies import frequencies
from ..hf.config import read_hf_config
from ..hf.raw import config_as_dict, text_part
from ..positions import Positions
from ..rotation import rotate
from ..tables import RotaryTables, cos_sin_table, table_dtype

__all__ = ["DualChunkRoPE", "DualChunkTables", "dual_chunk_attention"]

#: the query tables, in the order vLLM concatenates them
QUERY_TABLES = ("intra", "successor", "inter", "successor_critical", "inter_critical")


@dataclass(frozen=True, eq=False)
class DualChunkTables:
    """The rotations of one call: five query tables and the key table, each ``[S, r]`` or ``[B, S, r]``.

    Attributes:
        intra: queries at ``p mod L``, for keys of their own chunk.
        successor: queries at ``min(p mod L + L, chunk_size)``, for keys of the previous chunk.
        inter: queries at ``min(2L - 1, chunk_size)``, for keys of older chunks.
        successor_critical: queries at ``p mod L + L`` (vLLM's sparse attention).
        inter_critical: queries at ``p mod L + chunk_size`` (vLLM's sparse attention).
        key: keys at ``j mod L``.
    """

    intra: RotaryTables
    successor: RotaryTables
    inter: RotaryTables
    successor_critical: RotaryTables
    inter_critical: RotaryTables
    key: RotaryTables


class DualChunkRoPE:
    """The query and key rotations of dual chunk attention (see the module docstring).

    Args:
        head_dim: channels per head ``D`` (even).
        chunk_size: ``chunk_size`` of the config's ``dual_chunk_attention_config`` (Qwen2.5-1M: 262144).
        local_size: ``local_size`` (Qwen2.5-1M: 8192); ``chunk_size - local_size`` is the chunk length ``L``.
        base: RoPE base ``theta``.
        rotary_dim: channels rotated (default ``head_dim``).
        interleaved: the pairing (``False``: pairs (i, i + r/2), as Qwen's models).
        original_max_position_embeddings: the trained length the attention scales queries from
            (:meth:`query_scale`); ``None`` or 0: no scaling.

    Example:
        >>> dc = DualChunkRoPE(64, chunk_size=16, local_size=4, base=10000.0)
        >>> t = dc.tables(torch.arange(30))
        >>> t.intra.cos.shape, dc.chunk_len
        (torch.Size([30, 64]), 12)
        >>> q, k = torch.randn(1, 4, 30, 64), torch.randn(1, 2, 30, 64)
        >>> rotated = dc(q, k)
        >>> sorted(rotated), rotated["successor"].shape
        (['inter', 'inter_critical', 'intra', 'key', 'successor', 'successor_critical'], torch.Size([1, 4, 30, 64]))
    """

    def __init__(
        self,
        head_dim: int,
        *,
        chunk_size: int,
        local_size: int,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        interleaved: bool = False,
        original_max_position_embeddings: int | None = None,
    ) -> None:
        for name, value in (("chunk_size", chunk_size), ("local_size", local_size)):
            if not is_int(value) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0 (a length in tokens), got {value!r}")
        if chunk_size - local_size < 1:
            raise ConfigError(
                f"chunk_size={chunk_size} must exceed local_size={local_size}: chunks are chunk_size - local_size "
                "tokens long (Qwen2.5-1M: 262144 and 8192)"
            )
        trained = original_max_position_embeddings
        if trained is not None and not (is_int(trained) and trained >= 0):
            raise ConfigError(f"original_max_position_embeddings must be an int >= 0 or None, got {trained!r}")
        self.freqs = frequencies(head_dim, base=base, rotary_dim=rotary_dim)
        self.head_dim, self.rotary_dim = head_dim, self.freqs.rotary_dim
        self.chunk_size, self.local_size = int(chunk_size), int(local_size)
        #: the chunk length ``L = chunk_size - local_size``
        self.chunk_len = self.chunk_size - self.local_size
        self.interleaved = check_bool(interleaved, "interleaved")
        self.original_max_position_embeddings = int(trained) if trained else None

    @classmethod
    def from_hf_config(cls, config: Any, *, strict: bool = True) -> DualChunkRoPE:
        """Build it from a config with ``dual_chunk_attention_config`` (Qwen2.5-1M, Qwen3 1M-context).

        transformers runs these models with plain RoPE (it does not read ``dual_chunk_attention_config``:
        :meth:`rotary.RoPE.from_hf_config` builds that); vLLM and SGLang serve them with dual chunk
        attention, whose rotations this builds. Like vLLM, it uses the plain frequencies of
        ``rope_theta``: a scaling block next to ``dual_chunk_attention_config`` is an error naming it
        (vLLM ignores it; ``strict=False`` warns and ignores it too).

        Args:
            config: a transformers ``PretrainedConfig``, a path to a config.json (or its folder), or a dict.
            strict: see above.

        Example:
            >>> d = {"model_type": "qwen2", "hidden_size": 512, "num_attention_heads": 4, "rope_theta": 1e7,
            ...      "max_position_embeddings": 1010000, "dual_chunk_attention_config": {"chunk_size": 262144,
            ...      "local_size": 8192, "original_max_position_embeddings": 262144}}
            >>> dc = DualChunkRoPE.from_hf_config(d)
            >>> dc.chunk_len, dc.head_dim, dc.freqs.base
            (253952, 128, 10000000.0)
        """
        data = text_part(config_as_dict(config), "dual_chunk_attention_config")
        dca = data.get("dual_chunk_attention_config")
        if not isinstance(dca, Mapping):
            raise ConfigError(
                f"the config has no dual_chunk_attention_config (got {dca!r}); dual-chunk RoPE is built from one such "
                "as {'chunk_size': 262144, 'local_size': 8192, 'original_max_position_embeddings': 262144}; for plain "
                "RoPE use rotary.RoPE.from_hf_config"
            )
        missing = [k for k in ("chunk_size", "local_size") if dca.get(k) is None]
        if missing:
            raise ConfigError(f"dual_chunk_attention_config needs {missing} (vLLM reads them); add them")
        settings = read_hf_config(data, strict=strict)
        scaling = {k: v for k, v in settings.scaling.items() if k not in ("rope_type", "partial_rotary_factor")}
        if settings.scaling.get("rope_type", "default") != "default" or scaling:
            message = (
                f"the config has dual_chunk_attention_config and a RoPE scaling block {dict(settings.scaling)}; vLLM "
                "and SGLang build dual-chunk RoPE from rope_theta alone and ignore the block: remove it (strict=False "
                "ignores it too)"
            )
            if strict:
                raise ConfigError(message)
            warnings.warn(message + " (ignored because strict=False)", UserWarning, stacklevel=2)
        rotary_dim = settings.rotary_dim
        partial = settings.scaling.get("partial_rotary_factor")
        if rotary_dim is None and partial not in (None, 1, 1.0):
            rotary_dim = int(settings.head_dim * partial)
        return cls(
            settings.head_dim,
            chunk_size=dca["chunk_size"],
            local_size=dca["local_size"],
            base=settings.base,
            rotary_dim=rotary_dim,
            interleaved=settings.interleaved,
            original_max_position_embeddings=dca.get("original_max_position_embeddings"),
        )

    def positions(self, position_ids: torch.Tensor | Positions) -> dict[str, torch.Tensor]:
        """The position each table rotates a token at, int64, shaped as ``position_ids`` (``[S]`` or ``[B, S]``).

        Example:
            >>> dc = DualChunkRoPE(8, chunk_size=10, local_size=4)
            >>> {k: v.tolist() for k, v in dc.positions(torch.tensor([0, 5, 6, 13])).items()}["successor"]
            [6, 10, 6, 7]
        """
        if isinstance(position_ids, Positions) and position_ids.axes == 1 and not position_ids.packed:
            position_ids = position_ids.ids
        if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in (torch.int32, torch.int64):
            raise InputTypeError(f"position_ids must be an int32/int64 tensor [S] or [B, S], got {position_ids!r:.80}")
        if position_ids.dim() not in (1, 2):
            raise InputError(f"position_ids must be [S] or [B, S], got shape {tuple(position_ids.shape)}")
        if position_ids.numel() and int(position_ids.min()) < 0:
            raise InputError(f"position_ids must be >= 0, got {int(position_ids.min())}")
        p = position_ids.long()
        L, C = self.chunk_len, self.chunk_size
        within = p % L
        return {
            "intra": within,
            "successor": (within + L).clamp(max=C),
            "inter": torch.full_like(p, min(2 * L - 1, C)),
            "successor_critical": within + L,
            "inter_critical": within + C,
            "key": within,
        }

    def tables(self, position_ids: torch.Tensor | Positions, *, dtype: torch.dtype = torch.float32) -> DualChunkTables:
        """The six tables of a call.

        Args:
            position_ids: int ``[S]`` or ``[B, S]`` (or 1-D :class:`~rotary.positions.Positions`), the
                tokens' absolute positions.
            dtype: fp32 (default) or float64.

        Returns:
            :class:`DualChunkTables`; each table ``[S, r]`` or ``[B, S, r]``.
        """
        rows = {
            name: RotaryTables.unchecked(
                *cos_sin_table(pos, self.freqs.inv_freq, interleaved=self.interleaved, dtype=table_dtype(dtype)),
                self.interleaved,
            )
            for name, pos in self.positions(position_ids).items()
        }
        return DualChunkTables(**rows)

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, *, position_ids: torch.Tensor | None = None, layout: str = "bhsd"
    ) -> dict[str, torch.Tensor]:
        """Rotate queries the five ways and keys once.

        Args:
            q: ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]``.
            k: same layout, ``Hk`` heads.
            position_ids: int ``[S]`` or ``[B, S]``; default ``arange(S)``.
            layout: ``"bhsd"`` or ``"bshd"``.

        Returns:
            ``{"intra", "successor", "inter", "successor_critical", "inter_critical"}``: the rotated
            queries, shaped as ``q``; ``"key"``: the rotated keys.
        """
        seq = q.shape[2] if layout == "bhsd" else q.shape[1]
        if position_ids is None:
            position_ids = torch.arange(seq, device=q.device)
        t = self.tables(position_ids, dtype=q.dtype)
        out = {"key": rotate([k], t.key, layout=layout)[0]}
        for name in QUERY_TABLES:
            out[name] = rotate([q], getattr(t, name), layout=layout)[0]
        return out

    def query_scale(self, seq_len: int) -> float:
        """vLLM's query factor for a sequence of ``seq_len`` tokens: ``max(1, 0.1 ln(seq_len / original) + 1)``.

        1.0 without ``original_max_position_embeddings``.

        Example:
            >>> dc = DualChunkRoPE(8, chunk_size=16, local_size=4, original_max_position_embeddings=100)
            >>> round(dc.query_scale(1000), 6), dc.query_scale(50)
            (1.230259, 1.0)
        """
        if not is_int(seq_len) or seq_len < 1:
            raise InputError(f"seq_len must be an int >= 1, got {seq_len!r}")
        if not self.original_max_position_embeddings:
            return 1.0
        return max(1.0, 0.1 * math.log(seq_len / self.original_max_position_embeddings) + 1.0)


def dual_chunk_attention(
    dc: DualChunkRoPE,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal dual chunk attention, dense (a reference; ``O(S^2)`` scores).

    A query at ``p`` meets a key at ``j <= p`` with its ``intra`` rotation when both lie in one chunk
    (``p // L == j // L``), its ``successor`` rotation when the key's chunk is the one before, and its
    ``inter`` rotation for older chunks; the key is always rotated at ``j mod L``. One softmax runs over
    all keys (vLLM computes the three parts with flash attention and merges them, which is the same
    softmax). Queries are multiplied by :meth:`DualChunkRoPE.query_scale` of the sequence length.

    Args:
        dc: the rotations.
        q: ``[B, Hq, S, D]``.
        k: ``[B, Hk, S, D]`` (``Hq`` a multiple of ``Hk``).
        v: ``[B, Hk, S, Dv]``.
        position_ids: int ``[S]``; default ``arange(S)``.
        scale: softmax scale; default ``1 / sqrt(D)``.

    Returns:
        ``[B, Hq, S, Dv]``.

    Example:
        >>> dc = DualChunkRoPE(16, chunk_size=6, local_size=2)
        >>> q, k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 1, 20, 16), torch.randn(1, 1, 20, 16)
        >>> dual_chunk_attention(dc, q, k, v).shape
        torch.Size([1, 2, 20, 16])
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or q.shape[1] % k.shape[1]:
        raise InputError(
            f"q [B, Hq, S, D], k and v [B, Hk, S, *] with Hq a multiple of Hk; got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    seq = q.shape[2]
    if position_ids is None:
        position_ids = torch.arange(seq, device=q.device)
    if position_ids.dim() != 1:
        raise InputError(f"dual_chunk_attention takes position_ids [S], got shape {tuple(position_ids.shape)}")
    rotated = dc(q * dc.query_scale(int(position_ids.max()) + 1), k, position_ids=position_ids)
    group = q.shape[1] // k.shape[1]
    key = rotated["key"].repeat_interleave(group, dim=1)
    value = v.repeat_interleave(group, dim=1)
    scores = {name: rotated[name] @ key.transpose(-1, -2) for name in ("intra", "successor", "inter")}
    chunk = position_ids // dc.chunk_len
    behind = chunk[:, None] - chunk[None, :]  # [S, S]: the query's chunk minus the key's
    logits = torch.where(behind == 0, scores["intra"], torch.where(behind == 1, scores["successor"], scores["inter"]))
    causal = position_ids[:, None] >= position_ids[None, :]
    logits = logits * (q.shape[-1] ** -0.5 if scale is None else scale)
    logits = logits.masked_fill(~causal, float("-inf"))
    return torch.softmax(logits.float(), dim=-1).to(v.dtype) @ value
