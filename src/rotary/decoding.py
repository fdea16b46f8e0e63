"""The decoding fast paths: q and k straight to a kernel, without the general path's Positions, tables
or plan, for the host time of a decoding step (:meth:`rotary.RoPE.forward`, :func:`rotary.rotate` with
tables made upstream, and ``rotary.hf.patch`` on CUDA).

Each returns ``None`` when any check the general path makes would not pass, and the general path
(:func:`rotary.rotation.rotate`) then runs, with its messages. On the CPU the checks are the C++
kernel's (``rope_decode``); on CUDA a few host-side comparisons of shapes, rows being handled in the
Triton kernel as on the general path.
"""

from __future__ import annotations

import torch

from .kernels import triton as triton_kernel
from .kernels.contract import Rotation
from .kernels.extension import load_cpu_extension
from .kernels.ops import mark_written
from .kernels.overlap import shares_elements
from .tables import RotaryTables

__all__ = ["decode_fast", "decode_seq_axis", "fast_pair", "kernel_tables", "model_tables_fast"]


def decode_seq_axis(q: torch.Tensor, k: torch.Tensor, layout: str) -> int | None:
    """The sequence axis of 4-D ``q``/``k`` when the decoding fast path may take them, else ``None``.

    The path is for plain CPU or CUDA tensors (no subclass) without autograd or ``torch.compile``, in
    ``"bhsd"`` or ``"bshd"``; :func:`decode_fast` checks everything else.

    Example:
        >>> decode_seq_axis(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), "bhsd")
        2
    """
    if (
        type(q) is not torch.Tensor
        or type(k) is not torch.Tensor
        or not (q.is_cpu or q.is_cuda)
        or q.dim() != 4
        or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        or torch.compiler.is_compiling()
    ):
        return None
    return 2 if layout == "bhsd" else 1 if layout == "bshd" else None


def kernel_tables(
    pair: tuple[torch.Tensor, torch.Tensor], tables: RotaryTables, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's ``[N, r]`` (``[N, H, r]``) form of a pair of tables in ``tables``' addressing."""
    cos, sin = pair
    if tables.addressing == "per_token":
        if cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]
        else:
            cos, sin = cos.flatten(0, 1), sin.flatten(0, 1)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def decode_fast(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    seq_axis: int,
    *,
    interleaved: bool,
    inplace: bool,
    head_dim: int | None = None,
    offset: int = 0,
    rows: torch.Tensor | None = None,
    batch_rows: int = 0,
    frequencies: torch.Tensor | None = None,
) -> list[torch.Tensor] | None:
    """The decoding fast path, for :meth:`rotary.RoPE.forward` and :func:`rotate` alike: q and k straight
    to the CPU kernel's ``rope_decode``, or ``None``.

    Taken for plain CPU or CUDA tensors without autograd or ``torch.compile`` (``seq_axis`` from
    :func:`decode_seq_axis`, which says whether the path may be taken) and fp32 tables ``[N, r]``: token (b, s) reads row ``offset + s``, ``rows[b, s]`` when ``rows`` is
    given, or ``b * batch_rows + s``. On the CPU, ``rope_decode`` checks everything else in C++ (4-D
    tensors of one dtype, unit channel stride, matching B/S/D, rows inside the table, no overlap in
    place); on CUDA a few host-side comparisons of shapes do (rows are checked in the Triton kernel, as
    on the general path). When a check fails: ``None``, and the general path runs with its messages.
    The point is the host time of a decoding step: no Positions, tables or plan are made.
    """
    if inplace and not torch.is_inference_mode_enabled() and (q.is_inference() or k.is_inference()):
        return None  # the general path names it (check_writable)
    if q.is_cuda:
        return decode_triton(
            q, k, cos, sin, seq_axis, interleaved, inplace, head_dim, offset, rows, batch_rows, frequencies
        )
    ext = load_cpu_extension()
    if ext is None:
        return None
    width = q.shape[-1] if head_dim is None else head_dim
    out = ext.rope_decode(q, k, cos, sin, offset, rows, seq_axis, width, interleaved, inplace, batch_rows)
    if out and inplace:
        mark_written(q, k)
    return list(out) if out else None


_FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def model_tables_fast(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str, interleaved: bool
) -> list[torch.Tensor] | None:
    """q and k rotated by a model's own per-token tables on the CUDA path, or ``None``.

    For :mod:`rotary.hf` on CUDA: ``cos``/``sin`` ``[B or 1, S, r]`` or ``[S, r]`` (what a Hugging Face
    rotary embedding hands every layer), fp32, or bf16/fp16 in a 16-bit model, go to the Triton kernel as
    they are: it widens each table value as it loads it, which is exact, so the result is that of fp32
    copies of the tables, without making those copies (two more launches per layer). ``None`` (the
    general path runs, with its messages) for anything else: autograd, ``torch.compile``, other shapes.
    The caller sends CUDA tensors only (the tests send CPU tensors under Triton's interpreter).

    Example:
        >>> q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
        >>> cos, sin = torch.ones(1, 5, 8), torch.zeros(1, 5, 8)  # 5 tokens' tables for 3 tokens
        >>> model_tables_fast(q, k, cos, sin, layout="bhsd", interleaved=False) is None
        True
    """
    seq_axis = decode_seq_axis(q, k, layout)
    if seq_axis is None or not triton_kernel.available() or cos.dim() != sin.dim() or cos.dim() not in (2, 3):
        return None
    seq_len = q.shape[seq_axis]
    batch_rows = 0
    if cos.dim() == 3:  # [B or 1, S, r]: row b * S + s of [B * S, r], or row s of the one sequence's
        if cos.shape[1] != seq_len or cos.shape[0] not in (1, q.shape[0]) or sin.shape != cos.shape:
            return None
        if cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]
        else:
            cos, sin, batch_rows = cos.flatten(0, 1), sin.flatten(0, 1), seq_len
    elif cos.shape[0] != seq_len:
        return None
    return decode_triton(q, k, cos, sin, seq_axis, interleaved, False, None, 0, None, batch_rows, None)


def decode_triton(
    q, k, cos, sin, seq_axis, interleaved, inplace, head_dim, offset, rows, batch_rows, frequencies=None
) -> list[torch.Tensor] | None:
    """:func:`decode_fast` on CUDA: the checks ``rope_decode`` makes in C++, then one Triton launch."""
    if not triton_kernel.available() or k.dim() != 4 or cos.dim() != 2:
        return None
    batch, seq_len, width = q.shape[0], q.shape[seq_axis], q.shape[-1]
    r = cos.shape[-1]
    if (
        q.dtype not in _FAST_DTYPES
        or k.dtype != q.dtype
        or k.device != q.device
        or cos.device != q.device
        or cos.dtype not in triton_kernel.TABLE_DTYPES
        or sin.dtype is not cos.dtype
        or sin.shape != cos.shape
        or sin.stride() != cos.stride()
        or cos.stride(-1) != 1
        or q.stride(-1) != 1
        or k.stride(-1) != 1
        or k.shape[0] != batch
        or k.shape[seq_axis] != seq_len
        or k.shape[-1] != width
        or (head_dim is not None and width != head_dim)
        or r % 2
        or r > width
        or (cos.requires_grad or sin.requires_grad)
        and torch.is_grad_enabled()
    ):
        return None
    if rows is None:
        if batch_rows == 0 and offset + seq_len > cos.shape[0]:
            return None  # the general path grows the tables (or names the error)
        positions = None
        if offset:
            cos, sin = cos[offset:], sin[offset:]
    else:
        if offset or rows.dtype is not torch.int64 or rows.device != q.device or rows.shape[-1] != seq_len:
            return None
        if rows.dim() == 2 and rows.shape[0] not in (1, batch) or rows.dim() not in (1, 2):
            return None
        positions = rows.expand(batch, seq_len)
    if inplace and (
        torch._debug_has_internal_overlap(q) != 0 or torch._debug_has_internal_overlap(k) != 0 or shares_elements(q, k)
    ):
        return None
    qv, kv = (q.transpose(1, 2), k.transpose(1, 2)) if seq_axis == 2 else (q, k)
    outs = (qv, kv) if inplace else (torch.empty_like(qv), torch.empty_like(kv))
    frequencies = frequencies if positions is not None else None
    triton_kernel.run_triton(
        Rotation((qv, kv), outs, (cos, cos), (sin, sin), positions, batch_rows, interleaved, False, frequencies)
    )
    if inplace:
        mark_written(q, k)
        return [q, k]
    return [o.transpose(1, 2) for o in outs] if seq_axis == 2 else list(outs)


def fast_pair(
    q: torch.Tensor, k: torch.Tensor, tables: RotaryTables, layout: str, inplace: bool
) -> list[torch.Tensor] | None:
    """The decoding fast path of :func:`rotate` for q and k with tables computed upstream, or ``None``.

    Taken for plain tensors without autograd or ``torch.compile`` and fp32 tables shared by q and k
    (no key or per-head tables): ``[S, r]`` for these tokens, per-token ``[B, S, r]`` (what Hugging
    Face's rotary embeddings hand to every layer, so ``rotary.hf.patch`` decodes through here), or a
    table with per-token ``rows``. The kernel's ``rope_decode`` checks the rest in C++ (see
    :meth:`rotary.RoPE.forward`'s fast path) and does nothing when a check fails: ``None``, and the
    general path runs with its messages.
    """
    cos, sin, rows = tables.cos, tables.sin, tables.rows
    if (
        tables.k_cos is not None
        or tables.heads is not None
        or cos.dtype is not torch.float32
        or (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))
    ):
        return None
    seq_axis = decode_seq_axis(q, k, layout)
    if seq_axis is None:
        return None
    batch_rows = 0
    if tables.addressing == "per_token":  # [B or 1, S, r]: row b * S + s of [B * S, r]; rope_decode checks B
        if cos.shape[1] != q.shape[seq_axis]:
            return None
        batch_rows = cos.shape[1] if cos.shape[0] > 1 else 0
        cos, sin = kernel_tables((cos, sin), tables, q.shape[0])
    elif rows is None and cos.shape[0] != q.shape[seq_axis]:
        return None
    return decode_fast(
        q, k, cos, sin, seq_axis, interleaved=tables.interleaved, inplace=inplace, rows=rows, batch_rows=batch_rows,
        frequencies=tables.frequencies,
    )  # fmt: skip
