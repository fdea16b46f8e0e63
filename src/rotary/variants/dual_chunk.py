"""Dual-chunk RoPE: the rotations of dual chunk attention (Qwen2.5-1M, 1M-context Qwen3 in vLLM and SGLang).

*Training-Free Long-Context Scaling of Large Language Models* (An et al., ICML 2024) rotates keys at ``j mod L``
(``L = chunk_size - local_size``) and each query three ways by the chunk of the key it meets, plus vLLM's two
``*_critical`` tables: each an ordinary :class:`~rotary.tables.RotaryTables` (positions and vLLM's query scale:
docs/variants.md, "Dual-chunk RoPE"). :func:`dual_chunk_attention` is a dense ``O(S^2)`` reference.
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
    """The rotations of one call, each ``[S, r]`` or ``[B, S, r]``, at :meth:`DualChunkRoPE.positions`.

    ``intra``, ``successor``, ``inter``: a query's rotations for keys of its own chunk, the previous one, older ones;
    ``successor_critical``, ``inter_critical``: vLLM's sparse attention's; ``key``: keys at ``j mod L``.
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
        head_dim, base, rotary_dim: ``D`` (even); RoPE base ``theta``; channels rotated (default ``head_dim``).
        chunk_size, local_size: of the config's ``dual_chunk_attention_config`` (Qwen2.5-1M: 262144, 8192).
        interleaved: the pairing (``False``: pairs (i, i + r/2), as Qwen's models).
        original_max_position_embeddings: the trained length of :meth:`query_scale` (``None`` or 0: no scaling).

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
        """Build it from a config with ``dual_chunk_attention_config`` (Qwen2.5-1M, Qwen3 1M-context), as vLLM does.

        ``config``: a transformers config, a config.json path or a dict. Like vLLM it uses the plain frequencies of
        ``rope_theta``; a scaling block beside it raises ``ConfigError`` (``strict=False``: a warning), as does an
        invalid config.

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
        """The six tables (:class:`DualChunkTables`) for int ``[S]`` or ``[B, S]`` ids (or 1-D Positions)."""
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
        """Rotate queries the five ways and keys once: ``{name: tensor}`` for the five query tables and ``"key"``.

        ``q`` ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]``, ``k`` the same with ``Hk`` heads;
        ``position_ids`` int ``[S]`` or ``[B, S]``, default ``arange(S)``. Outputs are shaped as their input.
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
        """vLLM's query factor for ``seq_len`` tokens: ``max(1, 0.1 ln(seq_len / original) + 1)`` (1.0 without one).

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
    """Causal dual chunk attention, dense (a reference; ``O(S^2)`` scores), one softmax over all keys.

    A query meets a key with its ``intra``, ``successor`` or ``inter`` rotation by chunk; queries are multiplied by
    :meth:`DualChunkRoPE.query_scale` of the length. ``q``, ``k``, ``v``: ``[B, Hq, S, D]``, ``[B, Hk, S, D]`` (``Hq`` a
    multiple of ``Hk``), ``[B, Hk, S, Dv]``; ``position_ids`` int ``[S]`` (default ``arange(S)``); ``scale`` default
    ``1 / sqrt(D)``. Returns ``[B, Hq, S, Dv]``.

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
