"""The GPU kernel: the rotation in Triton, taking the same :class:`~.contract.Rotation` as the CPU kernel.

q and k are rotated in one launch (as Liger does): one program rotates ``BLOCK_H`` heads of one token
(b, s) of q or of k; it reads that token's cos/sin row (through ``positions`` when given, so per-batch
ids and packed sequences cost no gathered table; per head for per-head tables) and keeps the
arithmetic in fp32 (fp64 for fp64 inputs). The backward pass is the
same kernel with sin negated; the table gradients are a second kernel, one program per token summing
over heads. Positions are checked in the kernel, never read on the host (see :func:`run_triton`).
Both are tested on CPU under Triton's interpreter (``TRITON_INTERPRET=1``) and on an H100
(docs/benchmarks.md).
"""

from __future__ import annotations

import torch

from . import triton_rows
from .contract import Rotation

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional: without it CUDA tensors take the pure-torch path
    triton = None
    tl = None

__all__ = [
    "TABLE_DTYPES",
    "available",
    "cdiv",
    "next_power_of_2",
    "heads_per_program",
    "rotate_and_cache_triton",
    "run_triton",
    "table_grad_triton",
    "wide_offsets",
]


#: the dtypes the kernels read tables in as they are: each value is widened to the arithmetic dtype as it
#: is loaded (exact), so a model's or a serving engine's bf16/fp16 tables need no fp32 copy
TABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def available() -> bool:
    """Whether Triton can be imported."""
    return triton is not None


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``), without a Triton constexpr call's host cost.

    Example:
        >>> [next_power_of_2(n) for n in (0, 1, 2, 3, 64, 65)]
        [1, 1, 2, 4, 64, 128]
    """
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ``b``, as ``triton.cdiv``, on the host.

    Example:
        >>> cdiv(32, 16), cdiv(33, 16), cdiv(0, 16)
        (2, 3, 0)
    """
    return -(-a // b)


if triton is not None:
    # the per-token parts every kernel shares (norm.py's too): a token's row, its cos and sin
    split_pairs, join_pairs = triton_rows.split_pairs, triton_rows.join_pairs
    token_row, table_pairs, sin_cos_f64 = triton_rows.token_row, triton_rows.table_pairs, triton_rows.sin_cos_f64

    @triton.jit
    def _rotate_heads(
        x,
        o,
        o2,
        COS,
        SIN,
        FREQ,
        t,
        p,
        computed,
        poison,
        heads,
        H,
        H2,
        table_stride,
        head_stride,
        sxh,
        soh,
        so2h,
        HALF: tl.constexpr,
        D: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_REST: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        CONJUGATE: tl.constexpr,
        INPLACE: tl.constexpr,
        FP64: tl.constexpr,
        TWO: tl.constexpr,
        PAIR_TABLES: tl.constexpr,
        COMPUTE: tl.constexpr,
    ):
        """Rotate ``heads`` (a block of head indices, masked by ``< H``) of one token with table row ``t``:
        ``x`` and ``o`` point at the token's row of the input and the output (head strides ``sxh``,
        ``soh``); with ``TWO`` the result is also stored at ``o2`` (head stride ``so2h``, heads ``< H2``,
        pass-through channels always: a cache row). The token's cos and sin come from :func:`table_pairs`
        (row ``t``, or computed at position ``p``); ``poison`` is 0, or NaN for a token outside a table
        that cannot compute its rows.

        Every load is issued before any store: a store may alias a later load, costing a memory round trip.
        """
        compute = tl.float64 if FP64 else tl.float32
        dtype = o.dtype.element_ty
        live = heads < H
        live2 = heads < H2
        if D > 2 * HALF:  # pass-through channels: copied out of place and into o2, never rotated
            rest = 2 * HALF + tl.arange(0, BLOCK_REST)
            in_rest = (rest < D)[None, :]
            rest_mask = (live | live2)[:, None] & in_rest
            kept = tl.load(x + heads[:, None] * sxh + rest[None, :], mask=rest_mask)
        if INTERLEAVED:
            # pairs (2i, 2i + 1): the rotated channels, and their tables (which repeat each pair's entry),
            # are loaded and stored as contiguous rows (16-byte accesses) and split into [.., pair, 2]
            # halves in registers; each result is x * cos + partner * sin, the partner signed -1 for a
            # pair's first channel, as written before the split (the same roundings, FMA included)
            j = tl.arange(0, 2 * BLOCK_P)
            channels = (j < 2 * HALF)[None, :]
            mask = (live | live2)[:, None] & channels
            c, sn = table_pairs(
                COS,
                SIN,
                FREQ,
                t,
                p,
                computed,
                heads,
                live | live2,
                table_stride,
                head_stride,
                HALF,
                BLOCK_P,
                INTERLEAVED,
                PAIR_TABLES,
                COMPUTE,
                FP64,
            )
            even, odd = split_pairs(tl.load(x + heads[:, None] * sxh + j[None, :], mask=mask, other=0.0), BLOCK_P)
            c = c + poison
            if CONJUGATE:
                sn = -sn
            even = even.to(compute)
            odd = odd.to(compute)
            if INPLACE:  # stores may go through other threads than the loads: every load before any store
                tl.debug_barrier()
            out_even = (even * c + (-odd) * sn).to(dtype)
            out_odd = (odd * c + even * sn).to(dtype)
            rows = join_pairs(out_even, out_odd, BLOCK_P)
            tl.store(o + heads[:, None] * soh + j[None, :], rows, mask=live[:, None] & channels)
            if TWO:
                tl.store(o2 + heads[:, None] * so2h + j[None, :], rows, mask=live2[:, None] & channels)
        else:
            pair = tl.arange(0, BLOCK_P)
            channels = (pair < HALF)[None, :]
            mask = (live | live2)[:, None] & channels
            c, sn = table_pairs(
                COS,
                SIN,
                FREQ,
                t,
                p,
                computed,
                heads,
                live | live2,
                table_stride,
                head_stride,
                HALF,
                BLOCK_P,
                INTERLEAVED,
                PAIR_TABLES,
                COMPUTE,
                FP64,
            )
            c = c + poison
            a = tl.load(x + heads[:, None] * sxh + pair[None, :], mask=mask, other=0.0).to(compute)
            z = tl.load(x + heads[:, None] * sxh + (pair + HALF)[None, :], mask=mask, other=0.0).to(compute)
            if CONJUGATE:
                sn = -sn
            first = (a * c - z * sn).to(dtype)
            second = (z * c + a * sn).to(dtype)
            tl.store(o + heads[:, None] * soh + pair[None, :], first, mask=live[:, None] & channels)
            tl.store(o + heads[:, None] * soh + (pair + HALF)[None, :], second, mask=live[:, None] & channels)
            if TWO:
                tl.store(o2 + heads[:, None] * so2h + pair[None, :], first, mask=live2[:, None] & channels)
                tl.store(o2 + heads[:, None] * so2h + (pair + HALF)[None, :], second, mask=live2[:, None] & channels)
        if D > 2 * HALF:
            if not INPLACE:
                tl.store(o + heads[:, None] * soh + rest[None, :], kept, mask=live[:, None] & in_rest)
            if TWO:
                tl.store(o2 + heads[:, None] * so2h + rest[None, :], kept, mask=live2[:, None] & in_rest)

    @triton.jit
    def _rotary_kernel(
        XQ,
        OUTQ,
        COSQ,
        SINQ,
        XK,
        OUTK,
        COSK,
        SINK,
        POS,
        FREQ,
        S,
        HQ,
        HK,
        Q_BLOCKS,
        table_rows,
        batch_rows,
        spb,
        sps,
        tq_stride,
        tq_head,
        sqb,
        sqs,
        sqh,
        soqb,
        soqs,
        soqh,
        tk_stride,
        tk_head,
        skb,
        sks,
        skh,
        sokb,
        soks,
        sokh,
        HALF: tl.constexpr,
        D: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_REST: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        CONJUGATE: tl.constexpr,
        HAS_POSITIONS: tl.constexpr,
        INPLACE: tl.constexpr,
        FP64: tl.constexpr,
        WIDE: tl.constexpr,
        COMPUTE: tl.constexpr,
    ):
        # program (token, head block): blocks 0 .. Q_BLOCKS - 1 rotate q's heads, the rest k's (one
        # launch for both, GQA head counts may differ; k may have its own tables, e.g. xPos)
        row = tl.program_id(0)
        block = tl.program_id(1)
        if WIDE:  # offsets in int64 (wide_offsets): b, s, t and the heads derive from these
            row = row.to(tl.int64)
            block = block.to(tl.int64)
        b, s, t, p, computed, poison = token_row(
            POS, row, S, table_rows, batch_rows, spb, sps, HAS_POSITIONS, COMPUTE, FP64
        )
        if block < Q_BLOCKS:
            heads = block * BLOCK_H + tl.arange(0, BLOCK_H)
            _rotate_heads(
                XQ + b * sqb + s * sqs,
                OUTQ + b * soqb + s * soqs,
                OUTQ,
                COSQ,
                SINQ,
                FREQ,
                t,
                p,
                computed,
                poison,
                heads,
                HQ,
                0,
                tq_stride,
                tq_head,
                sqh,
                soqh,
                0,
                HALF,
                D,
                BLOCK_P,
                BLOCK_REST,
                INTERLEAVED,
                CONJUGATE,
                INPLACE,
                FP64,
                False,
                False,
                COMPUTE,
            )
        else:
            heads = (block - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
            _rotate_heads(
                XK + b * skb + s * sks,
                OUTK + b * sokb + s * soks,
                OUTK,
                COSK,
                SINK,
                FREQ,
                t,
                p,
                computed,
                poison,
                heads,
                HK,
                0,
                tk_stride,
                tk_head,
                skh,
                sokh,
                0,
                HALF,
                D,
                BLOCK_P,
                BLOCK_REST,
                INTERLEAVED,
                CONJUGATE,
                INPLACE,
                FP64,
                False,
                False,
                COMPUTE,
            )

    @triton.jit
    def _rotate_cache_kernel(
        XQ,
        OUTQ,
        XK,
        OUTK,
        V,
        KC,
        VC,
        COS,
        SIN,
        POS,
        FREQ,
        SLOTS,
        S,
        HQ,
        HK,
        DV,
        Q_BLOCKS,
        table_rows,
        batch_rows,
        spb,
        sps,
        slb,
        sls,
        T,
        cache_batch,
        t_stride,
        sqb,
        sqs,
        sqh,
        soqb,
        soqs,
        soqh,
        skb,
        sks,
        skh,
        sokb,
        soks,
        sokh,
        svb,
        svs,
        svh,
        kcb,
        kct,
        kch,
        vcb,
        vct,
        vch,
        HALF: tl.constexpr,
        D: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_P: tl.constexpr,
        BLOCK_REST: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        HAS_POSITIONS: tl.constexpr,
        INPLACE: tl.constexpr,
        FP64: tl.constexpr,
        PAIR_TABLES: tl.constexpr,
        WIDE: tl.constexpr,
        COMPUTE: tl.constexpr,
    ):
        # program (token, head block): q blocks rotate q; k blocks rotate k into k's output and into the
        # cache row of the token's slot, and copy v into the value cache row. A slot outside the cache
        # writes nothing (the caller's contract, as vLLM's padding slots): memory-safe by construction
        row = tl.program_id(0)
        block = tl.program_id(1)
        if WIDE:  # offsets in int64 (wide_offsets)
            row = row.to(tl.int64)
            block = block.to(tl.int64)
        b, s, t, p, computed, poison = token_row(
            POS, row, S, table_rows, batch_rows, spb, sps, HAS_POSITIONS, COMPUTE, FP64
        )
        if block < Q_BLOCKS:
            heads = block * BLOCK_H + tl.arange(0, BLOCK_H)
            _rotate_heads(
                XQ + b * sqb + s * sqs,
                OUTQ + b * soqb + s * soqs,
                OUTQ,
                COS,
                SIN,
                FREQ,
                t,
                p,
                computed,
                poison,
                heads,
                HQ,
                0,
                t_stride,
                0,
                sqh,
                soqh,
                0,
                HALF,
                D,
                BLOCK_P,
                BLOCK_REST,
                INTERLEAVED,
                False,
                INPLACE,
                FP64,
                False,
                PAIR_TABLES,
                COMPUTE,
            )
        else:
            heads = (block - Q_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
            slot = tl.load(SLOTS + b * slb + s * sls)
            bad = (slot < 0) | (slot >= T)
            heads_ok = tl.where(bad, 0, HK)  # no head of a bad slot is written
            # 64-bit offsets into the caches (a batched cache may hold 2^31 elements or more; int32 slots)
            slot = slot.to(tl.int64)
            cb = (b * cache_batch).to(tl.int64)  # the cache's batch row: b, or 0 for one shared slot axis
            # v is loaded first, so that every load of the program comes before its stores
            channels = tl.arange(0, BLOCK_DV)
            vmask = (heads < heads_ok)[:, None] & (channels < DV)[None, :]
            values = tl.load(V + b * svb + s * svs + heads[:, None] * svh + channels[None, :], mask=vmask)
            # k is loaded and rotated once, and stored twice: into k's output (in place: over k itself)
            # and into the cache row of the token's slot
            _rotate_heads(
                XK + b * skb + s * sks,
                OUTK + b * sokb + s * soks,
                KC + cb * kcb + slot * kct,
                COS,
                SIN,
                FREQ,
                t,
                p,
                computed,
                poison,
                heads,
                HK,
                heads_ok,
                t_stride,
                0,
                skh,
                sokh,
                kch,
                HALF,
                D,
                BLOCK_P,
                BLOCK_REST,
                INTERLEAVED,
                False,
                INPLACE,
                FP64,
                True,
                PAIR_TABLES,
                COMPUTE,
            )
            tl.store(VC + cb * vcb + slot * vct + heads[:, None] * vch + channels[None, :], values, mask=vmask)

    @triton.jit
    def _table_grad_kernel(
        X,
        G,
        GC,
        GS,
        S,
        H,
        sxb,
        sxs,
        sxh,
        sgb,
        sgs,
        sgh,
        scb,
        scs,
        sch,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_P: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        CONJUGATE: tl.constexpr,
        PER_HEAD: tl.constexpr,
        FP64: tl.constexpr,
        WIDE: tl.constexpr,
    ):
        """One program per token: the gradient of the token's table row (``PER_HEAD``: of each head's),
        ``g * x`` for cos and ``g * rotate(x)`` for sin, pair by pair, summed over the heads. Heads are read
        in blocks of ``BLOCK_H`` whole rows (interleaved rows split in registers: 16-byte accesses)."""
        row = tl.program_id(0)
        if WIDE:  # offsets in int64 (wide_offsets)
            row = row.to(tl.int64)
        b = row // S
        s = row % S
        compute = tl.float64 if FP64 else tl.float32
        sign = -1.0 if CONJUGATE else 1.0
        pair = tl.arange(0, BLOCK_P)
        j = tl.arange(0, 2 * BLOCK_P)  # interleaved: the row's channels
        acc_c0 = tl.zeros((BLOCK_P,), dtype=compute)
        acc_c1 = tl.zeros((BLOCK_P,), dtype=compute)
        acc_s0 = tl.zeros((BLOCK_P,), dtype=compute)
        acc_s1 = tl.zeros((BLOCK_P,), dtype=compute)
        out = b * scb + s * scs
        for h0 in range(0, H, BLOCK_H):
            heads = h0 + tl.arange(0, BLOCK_H)
            if WIDE:
                heads = heads.to(tl.int64)
            live = heads < H
            x = X + b * sxb + s * sxs + heads[:, None] * sxh
            g = G + b * sgb + s * sgs + heads[:, None] * sgh
            if INTERLEAVED:
                mask = live[:, None] & (j < 2 * HALF)[None, :]
                a, z = split_pairs(tl.load(x + j[None, :], mask=mask, other=0.0), BLOCK_P)
                g0, g1 = split_pairs(tl.load(g + j[None, :], mask=mask, other=0.0), BLOCK_P)
            else:
                mask = live[:, None] & (pair < HALF)[None, :]
                a = tl.load(x + pair[None, :], mask=mask, other=0.0)
                z = tl.load(x + (pair + HALF)[None, :], mask=mask, other=0.0)
                g0 = tl.load(g + pair[None, :], mask=mask, other=0.0)
                g1 = tl.load(g + (pair + HALF)[None, :], mask=mask, other=0.0)
            a = a.to(compute)
            z = z.to(compute)
            g0 = g0.to(compute)
            g1 = g1.to(compute)
            c0 = g0 * a
            c1 = g1 * z
            s0 = -(g0 * z)
            s1 = g1 * a
            if PER_HEAD:
                at = out + heads[:, None] * sch
                s0 = sign * s0
                s1 = sign * s1
                if INTERLEAVED:
                    tl.store(GC + at + j[None, :], join_pairs(c0, c1, BLOCK_P).to(GC.dtype.element_ty), mask=mask)
                    tl.store(GS + at + j[None, :], join_pairs(s0, s1, BLOCK_P).to(GS.dtype.element_ty), mask=mask)
                else:
                    tl.store(GC + at + pair[None, :], c0.to(GC.dtype.element_ty), mask=mask)
                    tl.store(GC + at + (pair + HALF)[None, :], c1.to(GC.dtype.element_ty), mask=mask)
                    tl.store(GS + at + pair[None, :], s0.to(GS.dtype.element_ty), mask=mask)
                    tl.store(GS + at + (pair + HALF)[None, :], s1.to(GS.dtype.element_ty), mask=mask)
            else:
                acc_c0 += tl.sum(c0, axis=0)
                acc_c1 += tl.sum(c1, axis=0)
                acc_s0 += tl.sum(s0, axis=0)
                acc_s1 += tl.sum(s1, axis=0)
        if not PER_HEAD:
            ok = pair < HALF
            if INTERLEAVED:
                row_mask = (j < 2 * HALF)[None, :]
                c = join_pairs(acc_c0[None, :], acc_c1[None, :], BLOCK_P)
                sn = join_pairs((sign * acc_s0)[None, :], (sign * acc_s1)[None, :], BLOCK_P)
                tl.store(GC + out + j[None, :], c.to(GC.dtype.element_ty), mask=row_mask)
                tl.store(GS + out + j[None, :], sn.to(GS.dtype.element_ty), mask=row_mask)
            else:
                tl.store(GC + out + pair, acc_c0.to(GC.dtype.element_ty), mask=ok)
                tl.store(GC + out + pair + HALF, acc_c1.to(GC.dtype.element_ty), mask=ok)
                tl.store(GS + out + pair, (sign * acc_s0).to(GS.dtype.element_ty), mask=ok)
                tl.store(GS + out + pair + HALF, (sign * acc_s1).to(GS.dtype.element_ty), mask=ok)


def run_triton(rotation: Rotation) -> None:
    """Rotate each ``[B, S, H, D]`` x (unit stride over D) into its out: q and k per launch, nothing read on the host.

    A token outside the table gets its row computed when the rotation carries ``frequencies``, else NaN.
    """
    if triton is None:
        raise RuntimeError("rotary: Triton is not installed")
    xs, outs = rotation.xs, rotation.outs
    pairs = [(i, i + 1) if i + 1 < len(xs) else (i, None) for i in range(0, len(xs), 2)]
    for first, second in pairs:
        # tensors rotated in one launch must agree on in place (the kernel takes one INPLACE)
        if second is not None and (outs[first] is xs[first]) != (outs[second] is xs[second]):
            _launch(rotation, first, None)
            _launch(rotation, second, None)
        else:
            _launch(rotation, first, second)


def heads_per_program(x: torch.Tensor, hq: int, hk: int) -> int:
    """Heads one program rotates: about 4 KiB of one token's q or k per program (16 bf16 heads of 128
    channels, 8 in fp32), so that each thread moves 16-byte vectors; never more than the heads there are."""
    per_head = x.shape[-1] * x.element_size()
    return max(1, min(next_power_of_2(max(hq, hk, 1)), next_power_of_2(max(4096 // per_head, 1))))


def wide_offsets(*tensors: torch.Tensor) -> bool:
    """Whether an element offset into one of ``tensors`` may not fit int32: a storage of 2^31 elements or
    more (its size bounds every offset from a view's start). The kernels then compute offsets in int64
    (``WIDE``); int32 would wrap and read or write the wrong memory. About 0.1 µs per tensor."""
    return any(t.untyped_storage().nbytes() >= _INT32_ELEMENTS * t.element_size() for t in tensors)


_INT32_ELEMENTS = 2**31


def _launch(rotation: Rotation, i: int, j: int | None) -> None:
    """One launch rotating ``xs[i]`` (and ``xs[j]``)."""
    r = rotation.rotary_dim
    positions = rotation.positions
    x, out = rotation.xs[i], rotation.outs[i]
    B, S, HQ, D = x.shape
    if j is None:
        xk, outk, HK = x, out, 0
        cos_k, sin_k = rotation.cos_sin(i)
    else:
        xk, outk = rotation.xs[j], rotation.outs[j]
        HK = xk.shape[2]
        cos_k, sin_k = rotation.cos_sin(j)
    if B * S == 0 or HQ + HK == 0:
        return
    cos, sin = rotation.cos_sin(i)
    block_h = heads_per_program(x, HQ, HK)
    q_blocks = cdiv(HQ, block_h)
    pos = positions if positions is not None else cos  # placeholder pointer, unused without positions
    spb, sps = (positions.stride(0), positions.stride(1)) if positions is not None else (0, 0)
    freq = rotation.frequencies
    compute = freq is not None and positions is not None
    grid = (B * S, q_blocks + cdiv(HK, block_h))
    # strides read once per tensor (each call of .stride(i) costs the host as much as the tuple)
    tq, tk, sx, so, skx, sko = cos.stride(), cos_k.stride(), x.stride(), out.stride(), xk.stride(), outk.stride()
    _rotary_kernel[grid](
        x,
        out,
        cos,
        sin,
        xk,
        outk,
        cos_k,
        sin_k,
        pos,
        freq if compute else cos,
        S,
        HQ,
        HK,
        q_blocks,
        cos.shape[0],
        rotation.batch_rows,
        spb,
        sps,
        tq[0],
        tq[1] if len(tq) == 3 else 0,
        sx[0],
        sx[1],
        sx[2],
        so[0],
        so[1],
        so[2],  # per-head tables [N, H, r]
        tk[0],
        tk[1] if len(tk) == 3 else 0,
        skx[0],
        skx[1],
        skx[2],
        sko[0],
        sko[1],
        sko[2],
        HALF=r // 2,
        D=D,
        BLOCK_H=block_h,
        BLOCK_P=next_power_of_2(r // 2),
        BLOCK_REST=next_power_of_2(max(D - r, 1)),
        INTERLEAVED=rotation.interleaved,
        CONJUGATE=rotation.conjugate,
        HAS_POSITIONS=positions is not None,
        INPLACE=out.data_ptr() == x.data_ptr(),
        FP64=x.dtype == torch.float64,
        WIDE=wide_offsets(x, out, xk, outk, cos, cos_k),
        COMPUTE=compute,
    )


def rotate_and_cache_triton(
    rotation: Rotation,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    *,
    pair_tables: bool = False,
) -> None:
    """One launch: rotate q and k and write the rotated k and ``v`` into row ``slots[b, s]`` of the caches.

    Shapes: q ``[B, S, Hq, D]``, k ``[B, S, Hk, D]``, v ``[B, S, Hk, Dv]``, caches ``[B or 1, T, Hk, D or Dv]``,
    ``slots`` int64 ``[B, S]`` (outside ``0 .. T - 1``: nothing written). ``pair_tables``: vLLM's ``cos_sin_cache``
    halves at int64 ``positions``, read in their own dtype.
    """
    if triton is None:
        raise RuntimeError("rotary: Triton is not installed")
    (q, k), (out_q, out_k) = rotation.xs, rotation.outs
    B, S, HQ, D = q.shape
    HK, DV = k.shape[2], v.shape[3]
    if B * S == 0:
        return
    cos, sin = rotation.cos_sin(0)
    r = 2 * cos.shape[-1] if pair_tables else rotation.rotary_dim
    positions = rotation.positions
    block_h = heads_per_program(q, HQ, HK)
    q_blocks = cdiv(HQ, block_h)
    pos = positions if positions is not None else slots  # placeholder pointer, unused without positions
    spb, sps = (positions.stride(0), positions.stride(1)) if positions is not None else (0, 0)
    grid = (B * S, q_blocks + cdiv(HK, block_h))
    freq = rotation.frequencies
    compute = freq is not None and positions is not None and not pair_tables
    _rotate_cache_kernel[grid](
        q,
        out_q,
        k,
        out_k,
        v,
        k_cache,
        v_cache,
        cos,
        sin,
        pos,
        freq if compute else cos,
        slots,
        S,
        HQ,
        HK,
        DV,
        q_blocks,
        cos.shape[0],
        rotation.batch_rows,
        spb,
        sps,
        slots.stride(0),
        slots.stride(1),
        k_cache.shape[1],
        1 if k_cache.shape[0] > 1 else 0,
        cos.stride(0),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        out_q.stride(0),
        out_q.stride(1),
        out_q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        out_k.stride(0),
        out_k.stride(1),
        out_k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        HALF=r // 2,
        D=D,
        BLOCK_H=block_h,
        BLOCK_P=next_power_of_2(r // 2),
        BLOCK_REST=next_power_of_2(max(D - r, 1)),
        BLOCK_DV=next_power_of_2(DV),
        INTERLEAVED=rotation.interleaved,
        HAS_POSITIONS=positions is not None,
        INPLACE=out_q.data_ptr() == q.data_ptr(),
        FP64=q.dtype == torch.float64,
        PAIR_TABLES=pair_tables,
        WIDE=wide_offsets(q, out_q, k, out_k, v, cos),
        COMPUTE=compute,
    )


def table_grad_triton(
    rotation: Rotation, grads: tuple[torch.Tensor, ...], buffers: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """Per-token table gradients of each x into ``buffers[i]`` (``[B, S, r]`` or ``[B, S, H, r]``): the
    cos and sin buffers of one x must be laid out alike with a unit last stride (contiguous, as rotary
    allocates them): the kernel takes the cos buffer's strides for both."""
    if triton is None:
        raise RuntimeError("rotary: Triton is not installed")
    r = rotation.rotary_dim
    for x, g, (gc, gs) in zip(rotation.xs, grads, buffers):
        B, S, H, _ = x.shape
        if B * S == 0:
            continue
        per_head = gc.dim() == 4
        _table_grad_kernel[(B * S,)](
            x,
            g,
            gc,
            gs,
            S,
            H,
            x.stride(0),
            x.stride(1),
            x.stride(2),
            g.stride(0),
            g.stride(1),
            g.stride(2),
            gc.stride(0),
            gc.stride(1),
            gc.stride(2) if per_head else 0,
            HALF=r // 2,
            BLOCK_H=heads_per_program(x, H, 0),
            BLOCK_P=next_power_of_2(r // 2),
            INTERLEAVED=rotation.interleaved,
            CONJUGATE=rotation.conjugate,
            PER_HEAD=per_head,
            FP64=x.dtype == torch.float64,
            WIDE=wide_offsets(x, g, gc),
        )
