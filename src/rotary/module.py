"""``RoPE``: frequencies + cached tables + application, as one ``nn.Module``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .apply import Layout, _check_x, _packed_positions, _rotate_tensors, check_layout
from .frequencies import Frequencies, frequencies
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
        base: float = 10000.0,
        rotary_dim: int | None = None,
        scaling: Mapping[str, Any] | None = None,
        interleaved: bool = False,
        max_position: int = 2048,
    ) -> None:
        super().__init__()
        if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position <= 0:
            raise ValueError(f"max_position must be a positive int, got {max_position!r}")
        self.freqs: Frequencies = frequencies(head_dim, base=base, rotary_dim=rotary_dim, scaling=scaling)
        self.interleaved = bool(interleaved)
        self.max_position = max_position
        self.register_buffer("inv_freq", self.freqs.inv_freq.clone(), persistent=False)
        self._cache = TableCache(self.freqs.inv_freq, self.freqs.attention_scaling, self.interleaved, max_position)

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
        if torch.compiler.is_compiling():
            return cos_sin_table(
                position_ids, self.inv_freq, attention_scaling=self.attention_scaling, interleaved=self.interleaved
            )
        needed = int(position_ids.max()) + 1 if position_ids.numel() else 0
        cos, sin = self._cache.get(position_ids.device, needed)
        return cos[position_ids], sin[position_ids]

    def _tables(
        self, position_ids: torch.Tensor | None, offset: int, seq_len: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids is not None:
            if position_ids.shape[-1] != seq_len:
                raise ValueError(
                    f"position_ids cover S={position_ids.shape[-1]} positions but the input has S={seq_len}"
                )
            return self.cos_sin(position_ids.to(device))
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {offset!r}")
        if torch.compiler.is_compiling():
            return self.cos_sin(torch.arange(offset, offset + seq_len, device=device))
        cos, sin = self._cache.get(device, offset + seq_len)
        return cos[offset : offset + seq_len], sin[offset : offset + seq_len]

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
                cos, sin = self._cache.get(x.device, longest)
                return cos, sin, position_ids
        if position_ids is None:
            raise ValueError("packed [total_tokens, H, D] inputs need cu_seqlens or per-token position_ids [total_tokens]")
        position_ids = check_position_ids(position_ids).to(x.device)
        cos, sin = self._cache.get(x.device, int(position_ids.max()) + 1 if position_ids.numel() else 0)
        return cos, sin, position_ids

    # application -----------------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor, name: str) -> None:
        _check_x(x, name)
        if x.shape[-1] != self.head_dim:
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
            for x, name in ((q, "q"), (k, "k")):
                if isinstance(x, torch.Tensor) and x.shape[-1] != self.head_dim:
                    raise ValueError(f"{name} has head_dim {x.shape[-1]} but this RoPE was built for head_dim={self.head_dim}")
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
        cos, sin = self._tables(position_ids, offset, q.shape[seq_dim], q.device)
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
            if x.shape[-1] != self.head_dim:
                raise ValueError(f"x has head_dim {x.shape[-1]} but this RoPE was built for head_dim={self.head_dim}")
            return _rotate_tensors(
                [x], ["x"], cos, sin, interleaved=self.interleaved, layout=layout, inplace=inplace, validate=False,
                position_ids=position_ids,
            )[0]  # fmt: skip
        self._check_input(x, "x")
        _, seq_dim = check_layout(layout)
        cos, sin = self._tables(position_ids, offset, x.shape[seq_dim], x.device)
        return _rotate_tensors(
            [x], ["x"], cos, sin, interleaved=self.interleaved, layout=layout, inplace=inplace, validate=False,
            checked=True,
        )[0]  # fmt: skip
