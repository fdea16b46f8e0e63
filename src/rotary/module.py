"""``RoPE``: frequencies + cached tables + application, as one ``nn.Module``."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from ._checks import check_positive_int
from .apply import Layout, _check_x, _packed_positions, _rotate_tensors, check_layout
from .config import read_hf_config
from .frequencies import Frequencies, frequencies
from .rope_types import ROPE_TYPES
from .tables import TableCache, cos_sin_table

__all__ = ["RoPE", "check_position_ids"]



def check_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Validate ``position_ids`` (integer, ``[S]`` or ``[B, S]``, non-negative) and return it."""
    if not isinstance(position_ids, torch.Tensor):
        raise TypeError(f"position_ids must be an integer tensor, got {type(position_ids).__name__}")
    if position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool:
        raise TypeError(
            f"position_ids must have an integer dtype (int64 or int32), got {position_ids.dtype}; "
            "float positions round (bf16 turns 257 into 256)"
        )
    if position_ids.dtype == torch.uint8:
        raise TypeError("position_ids must be int64 or int32, got torch.uint8 (torch indexes with uint8 as a boolean mask)")
    if position_ids.dim() not in (1, 2):
        raise ValueError(f"position_ids must be [S] or [B, S], got shape {tuple(position_ids.shape)}")
    if not torch.compiler.is_compiling() and position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got a minimum of {int(position_ids.min())}")
    return position_ids


class RoPE(nn.Module):
    """Rotary position embedding for the q and k of attention.

    Tables are fp32 and built from float64 angles; they are cached per device for positions below
    ``max_position`` and grown (never an error) when a longer position arrives. ``.to(bfloat16)``
    on a model leaves ``inv_freq`` and the tables in fp32.

    Args:
        head_dim: channels per head ``D`` (even).
        base: RoPE base ``theta`` (> 0).
        rotary_dim: channels rotated ``r`` (even, ``<= D``); the other ``D - r`` pass through.
        scaling: Hugging Face-style scaling block, e.g. ``{"rope_type": "default"}``.
        interleaved: ``False``: pairs (i, i + r/2) (Hugging Face, GPT-NeoX); ``True``: pairs
            (2i, 2i + 1) (the paper, RoFormer, GPT-J, Meta LLaMA).
        max_position: initial cache length.
        dynamic: how length-dependent types (``dynamic``, ``longrope``) follow the sequence length.
            ``"hf"`` (default) replays transformers' state machine call for call: dynamic NTK
            recomputes when ``max(position_ids) + 1`` exceeds the longest length seen so far and resets
            to the trained frequencies when a call is shorter than ``max_position_embeddings``;
            LongRoPE uses the long factors while the length exceeds
            ``original_max_position_embeddings``. ``"stateless"`` computes the frequencies from the
            current call's length only (see docs/scaling.md on huggingface/transformers#25104).
        strict: ``False`` turns value errors in ``scaling`` into warnings.

    Example:
        >>> rope = RoPE(64)
        >>> q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)  # GQA: 8 q heads, 2 kv heads
        >>> q_rot, k_rot = rope(q, k)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 8, 16, 64]), torch.Size([2, 2, 16, 64]))
    """

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
    ) -> None:
        super().__init__()
        check_positive_int(max_position, "max_position")
        if dynamic not in ("hf", "stateless"):
            raise ValueError(f"dynamic must be 'hf' (transformers' state machine) or 'stateless', got {dynamic!r}")
        # kept to recompute length-dependent frequencies exactly as they were first computed
        self._frequency_args: dict[str, Any] = dict(
            head_dim=head_dim, base=base, rotary_dim=rotary_dim, scaling=copy.deepcopy(scaling), strict=strict
        )
        self.freqs: Frequencies = frequencies(**self._frequency_args)
        self.interleaved = bool(interleaved)
        self.max_position = max_position
        self.dynamic = dynamic
        self.register_buffer("inv_freq", self.freqs.inv_freq.clone(), persistent=False)
        # one cache per fixed frequency set (trained; LongRoPE's long set); None while dynamic NTK has
        # grown the base, which changes with every longer call, so tables are computed per call then
        self._cache: TableCache | None = TableCache(
            self.freqs.inv_freq, self.freqs.attention_scaling, self.interleaved, max_position
        )
        self._fixed_caches: dict[str, TableCache] = {"original": self._cache}
        # the frequencies at the trained length, and the state of transformers' dynamic NTK update
        self.original_freqs: Frequencies = self.freqs
        if self.freqs.rope_type == "dynamic":
            self.original_max_seq_len: int = self.freqs.scaling["max_position_embeddings"]
            self.max_seq_len_cached: int = self.original_max_seq_len
        self._long_freqs: Frequencies | None = None
        self._stateless_len: int | None = None

    @classmethod
    def from_hf_config(
        cls,
        config: Any,
        *,
        layer_type: str | None = None,
        strict: bool = True,
        dynamic: Literal["hf", "stateless"] = "hf",
        max_position: int = 2048,
        interleaved: bool | None = None,
    ) -> RoPE:
        """Build the RoPE a Hugging Face model uses, from its config (the config is never modified).

        Reads ``head_dim`` (or ``hidden_size // num_attention_heads``; DeepSeek's ``qk_rope_head_dim``),
        ``rope_theta`` (GPT-NeoX: ``rotary_emb_base``), ``partial_rotary_factor`` (GPT-NeoX:
        ``rotary_pct``; GPT-J: ``rotary_dim``), ``max_position_embeddings`` and the scaling block
        (5.x ``rope_parameters`` or 4.x ``rope_scaling``); values the file omits are filled as
        transformers fills them. The pairing comes from ``rotary.config.PAIRING`` (checked against
        transformers for every architecture it lists); any other ``model_type`` needs ``interleaved=``.

        Args:
            config: a transformers ``PretrainedConfig`` (4.x or 5.x), a path to a config.json (or its
                folder), or a dict of one.
            layer_type: for configs with one block per layer type (Gemma-3: ``"sliding_attention"``,
                ``"full_attention"``), which layer's RoPE to build.
            strict: ``False`` turns configuration mistakes into warnings (odd real checkpoints).
            dynamic: see :class:`RoPE`.
            max_position: initial cache length.
            interleaved: the pairing of a ``model_type`` the table does not list (a custom
                architecture): ``True`` for pairs (2i, 2i+1), ``False`` for (i, i + r/2).

        Returns:
            :class:`RoPE`.

        Raises:
            ConfigError: (a ``ValueError``) for an invalid, ambiguous or unsupported config; the message says what
                to change.

        Example:
            >>> cfg = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
            ...        "max_position_embeddings": 131072, "rope_theta": 500000.0,
            ...        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            ...                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
            >>> rope = RoPE.from_hf_config(cfg)
            >>> rope.freqs.rope_type, rope.head_dim, rope.interleaved
            ('llama3', 128, False)
        """
        settings = read_hf_config(config, layer_type=layer_type, strict=strict, interleaved=interleaved)
        return cls(
            settings.head_dim,
            base=settings.base,
            rotary_dim=settings.rotary_dim,
            scaling=settings.scaling,
            interleaved=settings.interleaved,
            max_position=max_position,
            dynamic=dynamic,
            strict=strict,
        )

    @property
    def head_dim(self) -> int:
        return self.freqs.head_dim

    @property
    def rotary_dim(self) -> int:
        return self.freqs.rotary_dim

    @property
    def attention_scaling(self) -> float:
        return self.freqs.attention_scaling

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # nn.Module.to(dtype) casts every floating buffer; frequencies must stay fp32 (a bf16
        # inv_freq is off by up to 0.4% and every angle with it). Restore the exact values.
        super()._apply(fn, recurse)
        self.inv_freq = self.freqs.inv_freq.to(self.inv_freq.device)
        return self

    # length-dependent frequencies ----------------------------------------------------------------
    def _set_freqs(self, freqs: Frequencies, fixed: str | None = None) -> None:
        """Switch frequencies: the buffer and the table cache follow (stale tables are never used).

        ``fixed`` names a frequency set that recurs ("original", "long") and keeps its own cache.
        """
        if freqs is self.freqs:
            return
        self.freqs = freqs
        self.inv_freq = freqs.inv_freq.to(self.inv_freq.device)
        if fixed is None:
            self._cache = None
        else:
            if fixed not in self._fixed_caches:
                self._fixed_caches[fixed] = TableCache(
                    freqs.inv_freq, freqs.attention_scaling, self.interleaved, self.max_position
                )
            self._cache = self._fixed_caches[fixed]

    def _recompute(self, seq_len: int | torch.Tensor) -> Frequencies:
        with warnings.catch_warnings():  # the lenient-mode warnings were given once, at construction
            warnings.simplefilter("ignore")
            return frequencies(**self._frequency_args, seq_len=seq_len)

    def update_length(self, seq_len: int | torch.Tensor) -> None:
        """Adapt length-dependent frequencies to a call covering positions ``0 .. seq_len - 1``.

        A no-op for static types. Called by :meth:`cos_sin`, :meth:`forward` and :meth:`rotate`; with
        ``dynamic="hf"`` it is transformers' ``dynamic_rope_update``, step for step.

        Args:
            seq_len: ``max(position_ids) + 1`` of the call (an int or a 0-dim integer tensor).

        Example:
            >>> rope = RoPE(64, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 8})
            >>> rope.update_length(32)
            >>> bool(rope.inv_freq[-1] < rope.original_freqs.inv_freq[-1])
            True
            >>> rope.reset_length()
            >>> torch.equal(rope.inv_freq, rope.original_freqs.inv_freq)
            True
        """
        rope_type = self.original_freqs.rope_type
        if not ROPE_TYPES[rope_type].length_dependent:
            return
        # transformers passes max(position_ids) + 1 as a 0-dim int64 tensor; dynamic NTK's base is then
        # computed in fp32, so the tensor is kept to stay bit-identical
        length = torch.as_tensor(seq_len, dtype=torch.int64).cpu()
        if rope_type == "longrope":
            trained = self.original_freqs.scaling["original_max_position_embeddings"]
            if int(length) > trained:
                if self._long_freqs is None:
                    self._long_freqs = self._recompute(trained + 1)
                self._set_freqs(self._long_freqs, "long")
            else:
                self._set_freqs(self.original_freqs, "original")
            return
        if self.dynamic == "stateless":
            if int(length) <= self.original_max_seq_len:
                self._set_freqs(self.original_freqs, "original")
            elif int(length) != self._stateless_len:
                self._set_freqs(self._recompute(length))
            self._stateless_len = int(length) if int(length) > self.original_max_seq_len else None
            return
        cached = self.max_seq_len_cached
        if int(length) > cached:  # growth: a longer sequence than any before
            self._set_freqs(self._recompute(length))
            self.max_seq_len_cached = int(length)
        if int(length) < self.original_max_seq_len and cached > self.original_max_seq_len:  # back to short
            self._set_freqs(self.original_freqs, "original")
            self.max_seq_len_cached = self.original_max_seq_len

    def reset_length(self) -> None:
        """Forget the lengths seen (dynamic state) and return to the trained frequencies."""
        self._set_freqs(self.original_freqs, "original")
        if self.original_freqs.rope_type == "dynamic":
            self.max_seq_len_cached = self.original_max_seq_len
        self._stateless_len = None

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        # the frozen fp32 frequencies, not the buffer: every path (cached, per-call, compiled) computes
        # from the same values, and an edit to ``rope.inv_freq`` cannot make them disagree
        return self.freqs.inv_freq.to(device)

    def extra_repr(self) -> str:
        f = self.freqs
        return (
            f"head_dim={f.head_dim}, rotary_dim={f.rotary_dim}, base={f.base:g}, rope_type={f.rope_type!r}, "
            f"interleaved={self.interleaved}, attention_scaling={f.attention_scaling:g}"
        )

    # tables ----------------------------------------------------------------------------------
    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin tables for ``position_ids``, laid out for this module's pairing.

        Args:
            position_ids: integer ``[S]`` or ``[B, S]``, >= 0.

        Returns:
            ``(cos, sin)``, fp32, ``[S, rotary_dim]`` or ``[B, S, rotary_dim]``, multiplied by
            ``attention_scaling``, on ``position_ids.device``.

        Example:
            >>> cos, sin = RoPE(8).cos_sin(torch.arange(3))
            >>> cos.shape, cos.dtype
            (torch.Size([3, 8]), torch.float32)
        """
        position_ids = check_position_ids(position_ids)
        if ROPE_TYPES[self.original_freqs.rope_type].length_dependent and position_ids.numel():
            self.update_length(position_ids.max() + 1)
        if torch.compiler.is_compiling() or self._cache is None:
            return cos_sin_table(
                position_ids, self._inv_freq_on(position_ids.device), attention_scaling=self.attention_scaling,
                interleaved=self.interleaved,
            )
        needed = int(position_ids.max()) + 1 if position_ids.numel() else 0
        cos, sin = self._cache.get(position_ids.device, needed)
        return cos[position_ids], sin[position_ids]

    def _tables(
        self, position_ids: torch.Tensor | None, offset: int, seq_len: int, batch: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids is not None:
            if position_ids.shape[-1] != seq_len:
                raise ValueError(
                    f"position_ids cover S={position_ids.shape[-1]} positions but the input has S={seq_len}"
                )
            if position_ids.dim() == 2 and position_ids.shape[0] not in (1, batch):
                raise ValueError(
                    f"position_ids have batch {position_ids.shape[0]} but the input has batch {batch}; "
                    "pass [S], [1, S] or [B, S]"
                )
            return self.cos_sin(position_ids.to(device))
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if torch.compiler.is_compiling():
            return self.cos_sin(torch.arange(offset, offset + seq_len, device=device))
        cos, sin = self._table_rows(device, offset + seq_len if seq_len else 0)
        return cos[offset : offset + seq_len], sin[offset : offset + seq_len]

    def _table_rows(self, device: torch.device, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables ``[>= needed, r]`` indexed by position, after adapting length-dependent frequencies."""
        if needed:
            self.update_length(needed)
        if self._cache is None:  # dynamic NTK past the trained length: the base changes with the length
            return cos_sin_table(
                torch.arange(needed, device=device), self._inv_freq_on(device),
                attention_scaling=self.attention_scaling, interleaved=self.interleaved,
            )  # fmt: skip
        return self._cache.get(device, needed)

    def _packed_tables(
        self, x: torch.Tensor, position_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None, max_seqlen: int | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cached tables covering every position of packed ``x`` ``[total_tokens, H, D]``, and those positions."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"packed inputs (cu_seqlens) must be [total_tokens, H, D], got {shape}")
        if cu_seqlens is not None:
            if position_ids is not None:
                raise ValueError("pass either cu_seqlens (positions restart per sequence) or position_ids, not both")
            position_ids, longest = _packed_positions(cu_seqlens.to(x.device), x.shape[0], max_seqlen)
            if longest is not None:  # known without reading positions back from the device
                cos, sin = self._table_rows(x.device, longest)
                return cos, sin, position_ids
        if position_ids is None:
            raise ValueError("packed [total_tokens, H, D] inputs need cu_seqlens or per-token position_ids [total_tokens]")
        position_ids = check_position_ids(position_ids).to(x.device)
        cos, sin = self._table_rows(x.device, int(position_ids.max()) + 1 if position_ids.numel() else 0)
        return cos, sin, position_ids

    # application -----------------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor, name: str, *, packed: bool = False) -> None:
        """4-D inputs are checked whole here; packed ones by ``_rotate_tensors``, the head_dim here."""
        if not packed:
            _check_x(x, name)
        if isinstance(x, torch.Tensor) and x.shape[-1] != self.head_dim:
            raise ValueError(f"{name} has head_dim {x.shape[-1]} but this RoPE was built for head_dim={self.head_dim}")

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        offset: int = 0,
        layout: Layout = "bhsd",
        inplace: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys, both in one fused kernel call.

        Packed variable-length batches (as in flash-attn's varlen API): q ``[total_tokens, Hq, D]``
        and k ``[total_tokens, Hk, D]`` with ``cu_seqlens`` (int ``[N + 1]`` sequence boundaries;
        positions restart at 0 in each sequence) or per-token ``position_ids`` ``[total_tokens]``.

        Args:
            q: ``[B, Hq, S, D]`` (``layout="bhsd"``) or ``[B, S, Hq, D]`` (``"bshd"``).
            k: same layout, ``Hk`` heads (``Hk`` may be smaller than ``Hq``: GQA/MQA), same S and D.
            position_ids: integer ``[S]`` or ``[B, S]`` (e.g. left padding); default ``offset + arange(S)``.
            offset: first position when ``position_ids`` is None (decoding with a KV cache).
            layout: ``"bhsd"`` or ``"bshd"``.
            inplace: rotate q and k in place and return them.
            cu_seqlens: boundaries of packed sequences (see above).
            max_seqlen: the longest packed sequence (optional, spares reading ``cu_seqlens``).

        Returns:
            ``(q_rotated, k_rotated)`` with the shapes and dtypes of ``q`` and ``k``.
        """
        if cu_seqlens is not None or (isinstance(q, torch.Tensor) and q.dim() == 3):
            cos, sin, position_ids = self._packed_tables(q, position_ids, cu_seqlens, max_seqlen)
            self._check_input(q, "q", packed=True)
            self._check_input(k, "k", packed=True)
            q, k = _rotate_tensors(
                [q, k], ["q", "k"], cos, sin, interleaved=self.interleaved, layout=layout, inplace=inplace,
                validate=False, position_ids=position_ids,
            )  # fmt: skip
            return q, k
        self._check_input(q, "q")
        self._check_input(k, "k")
        batch_dim, seq_dim = check_layout(layout)
        if q.shape[seq_dim] != k.shape[seq_dim]:
            raise ValueError(
                f"q and k must share S: got S={q.shape[seq_dim]} for q and S={k.shape[seq_dim]} for k (layout {layout!r})"
            )
        if q.shape[batch_dim] != k.shape[batch_dim]:
            raise ValueError(f"q and k must share the batch size, got {q.shape[batch_dim]} and {k.shape[batch_dim]}")
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must share a dtype, got {q.dtype} for q and {k.dtype} for k; cast one of them")
        cos, sin = self._tables(position_ids, offset, q.shape[seq_dim], q.shape[batch_dim], q.device)
        q, k = _rotate_tensors(
            [q, k], ["q", "k"], cos, sin, interleaved=self.interleaved, layout=layout, inplace=inplace, validate=False,
            checked=True,
        )  # fmt: skip
        return q, k

    def rotate(
        self,
        x: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        offset: int = 0,
        layout: Layout = "bhsd",
        inplace: bool = False,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int | None = None,
    ) -> torch.Tensor:
        """Rotate one tensor ``x`` (``[B, H, S, D]``, ``[B, S, H, D]`` or packed ``[total_tokens, H, D]``);
        arguments as in :meth:`forward`."""
        if cu_seqlens is not None or (isinstance(x, torch.Tensor) and x.dim() == 3):
            cos, sin, position_ids = self._packed_tables(x, position_ids, cu_seqlens, max_seqlen)
            self._check_input(x, "x", packed=True)
            return _rotate_tensors(
                [x], ["x"], cos, sin, interleaved=self.interleaved, layout=layout, inplace=inplace, validate=False,
                position_ids=position_ids,
            )[0]  # fmt: skip
        self._check_input(x, "x")
        batch_dim, seq_dim = check_layout(layout)
        cos, sin = self._tables(position_ids, offset, x.shape[seq_dim], x.shape[batch_dim], x.device)
        return _rotate_tensors(
            [x], ["x"], cos, sin, interleaved=self.interleaved, layout=layout, inplace=inplace, validate=False,
            checked=True,
        )[0]  # fmt: skip
