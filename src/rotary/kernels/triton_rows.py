"""The per-token parts every Triton kernel shares: which table row a token reads, and the row's cos and
sin, read from the table or computed for a position the table does not hold.

A computed row is what the cached rows are (:func:`rotary.tables.cos_sin_table`): the angle
``position * inv_freq`` formed in float64, its cos and sin times the attention scaling, rounded once
to the table dtype. cos and sin are evaluated with multiplications and additions only
(:func:`sin_cos_f64`), so every backend (CUDA, ROCm, the interpreter) runs the same code.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional
    triton = None
    tl = None

__all__ = ["join_pairs", "sin_cos_f64", "split_pairs", "table_pairs", "token_row"]

if triton is not None:

    @triton.jit
    def split_pairs(rows, BLOCK_P: tl.constexpr):
        """``[N, 2 * BLOCK_P]`` rows of interleaved pairs -> their first and second channels, ``[N, BLOCK_P]`` each."""
        return tl.split(tl.reshape(rows, (rows.shape[0], BLOCK_P, 2)))

    @triton.jit
    def join_pairs(first, second, BLOCK_P: tl.constexpr):
        """The inverse of :func:`split_pairs`: ``[N, BLOCK_P]`` twice -> ``[N, 2 * BLOCK_P]`` interleaved."""
        return tl.reshape(tl.join(first, second), (first.shape[0], 2 * BLOCK_P))

    @triton.jit
    def _f64(value: tl.constexpr):
        """A float64 constant (a Python float in arithmetic would be an fp32 one)."""
        return tl.full((), value, tl.float64)

    @triton.jit
    def _nearest(y):
        """``y`` rounded to the nearest integer (halves away from 0), int64; ``|y|`` clamped below 2**62."""
        y = tl.minimum(tl.maximum(y, -4.0e18), 4.0e18)
        return tl.where(y >= 0, y + 0.5, y - 0.5).to(tl.int64)

    @triton.jit
    def _reduce_2pi(theta):
        """``theta - n * 2π`` for the nearest integer n (Cody and Waite's reduction: 2π in three parts,
        the first two of 24 bits, so ``n * part`` is exact for ``|n| < 2**29``)."""
        n = _nearest(theta * _f64(0.15915494309189535)).to(tl.float64)
        return ((theta - n * _f64(6.2831854820251465)) - n * _f64(-1.7484555314695172e-07)) - n * _f64(
            -6.8604979977715316e-15
        )

    @triton.jit
    def sin_cos_f64(theta):
        """``(cos θ, sin θ)`` in float64 with mul/add only (every backend the same): fdlibm's kernels after reduction.

        Accurate to a few float64 ulp for ``|θ| < 2**31`` (far below a table value's fp32 rounding), never NaN for
        finite ``θ``.
        """
        r = _reduce_2pi(_reduce_2pi(theta))
        q = _nearest(r * _f64(0.6366197723675814))  # -2 .. 2
        qf = q.to(tl.float64)
        z = (r - qf * _f64(1.5707963276654482)) - qf * _f64(-8.705515695504166e-10)
        z2 = z * z
        s = z + z * z2 * (
            _f64(-1.66666666666666324348e-01)
            + z2
            * (
                _f64(8.33333333332248946124e-03)
                + z2
                * (
                    _f64(-1.98412698298579493134e-04)
                    + z2
                    * (
                        _f64(2.75573137070700676789e-06)
                        + z2 * (_f64(-2.50507602534068634195e-08) + z2 * _f64(1.58969099521155010221e-10))
                    )
                )
            )
        )
        c = (_f64(1.0) - _f64(0.5) * z2) + z2 * z2 * (
            _f64(4.16666666666666019037e-02)
            + z2
            * (
                _f64(-1.38888888888741095749e-03)
                + z2
                * (
                    _f64(2.48015872894767294178e-05)
                    + z2
                    * (
                        _f64(-2.75573143513906633035e-07)
                        + z2 * (_f64(2.08757232129817482790e-09) + z2 * _f64(-1.13596475577881948265e-11))
                    )
                )
            )
        )
        quadrant = q & 3  # θ = z + quadrant * π/2
        cos = tl.where(quadrant == 0, c, tl.where(quadrant == 1, -s, tl.where(quadrant == 2, -c, s)))
        sin = tl.where(quadrant == 0, s, tl.where(quadrant == 1, c, tl.where(quadrant == 2, -s, -c)))
        return cos, sin

    @triton.jit
    def table_pairs(
        COS,
        SIN,
        FREQ,
        t,
        p,
        computed,
        heads,
        live,
        table_stride,
        head_stride,
        HALF: tl.constexpr,
        BLOCK_P: tl.constexpr,
        INTERLEAVED: tl.constexpr,
        PAIR_TABLES: tl.constexpr,
        COMPUTE: tl.constexpr,
        FP64: tl.constexpr,
    ):
        """The cos and sin of each pair of ``heads`` (masked by ``live``) at table row ``t``, ``[BLOCK_H,
        BLOCK_P]`` in the arithmetic dtype. With ``COMPUTE``, a token whose position ``p`` is not a row of
        the table (``computed``) gets them computed from the frequencies instead: ``FREQ`` is float64
        ``[HALF + 1]`` (the frequencies, then the attention scaling), the angle ``p * f`` is formed in
        float64 and the value rounded to the table dtype, as the table's own rows were made.
        Table rows hold one value per channel (``c[2i] == c[2i + 1]`` interleaved, read as contiguous rows
        and split in registers), or with ``PAIR_TABLES`` one per pair (vLLM's ``cos_sin_cache`` halves)."""
        compute = tl.float64 if FP64 else tl.float32
        pair = tl.arange(0, BLOCK_P)
        if INTERLEAVED and not PAIR_TABLES:
            j = tl.arange(0, 2 * BLOCK_P)
            mask = live[:, None] & (j < 2 * HALF)[None, :]
            table = t * table_stride + heads[:, None] * head_stride + j[None, :]
            c, _ = split_pairs(tl.load(COS + table, mask=mask, other=0.0), BLOCK_P)
            sn, _ = split_pairs(tl.load(SIN + table, mask=mask, other=0.0), BLOCK_P)
        else:
            mask = live[:, None] & (pair < HALF)[None, :]
            table = t * table_stride + heads[:, None] * head_stride + pair[None, :]
            c = tl.load(COS + table, mask=mask, other=0.0)
            sn = tl.load(SIN + table, mask=mask, other=0.0)
        c = c.to(compute)
        sn = sn.to(compute)
        if COMPUTE:
            if computed:
                f = tl.load(FREQ + pair, mask=pair < HALF, other=0.0)
                scale = tl.load(FREQ + HALF)
                row_c, row_s = sin_cos_f64(p.to(tl.float64) * f)
                table_dtype = COS.dtype.element_ty
                row_c = (row_c * scale).to(table_dtype).to(compute)
                row_s = (row_s * scale).to(table_dtype).to(compute)
                c = tl.broadcast_to(row_c[None, :], c.shape)
                sn = tl.broadcast_to(row_s[None, :], sn.shape)
        return c, sn

    @triton.jit
    def token_row(
        POS,
        row,
        S,
        table_rows,
        batch_rows,
        spb,
        sps,
        HAS_POSITIONS: tl.constexpr,
        COMPUTE: tl.constexpr,
        FP64: tl.constexpr,
    ):
        """The per-token prologue of every kernel: program row ``row`` is token (b, s); returns
        ``(b, s, t, p, computed, poison)``: ``t`` the token's table row, ``p`` its position, ``computed``
        whether the position is not a row of the table and its row is computed (``COMPUTE``: the call's
        tables come with their frequencies), and ``poison`` 0, or NaN for a position outside a table that
        cannot compute its rows (a caller's table: the position breaks the caller's contract). A token
        outside the table reads row 0, never memory past the table."""
        b = row // S
        s = row % S
        compute = tl.float64 if FP64 else tl.float32
        if HAS_POSITIONS:
            p = tl.load(POS + b * spb + s * sps)
            outside = (p < 0) | (p >= table_rows)
            t = tl.where(outside, 0, p)
            computed = outside  # read only with COMPUTE
            if COMPUTE:
                poison = tl.zeros((), dtype=compute)
            else:
                poison = tl.where(outside, float("nan"), 0.0).to(compute)
        else:
            t = b * batch_rows + s
            p = t
            computed = t < 0
            poison = tl.zeros((), dtype=compute)
        return b, s, t, p, computed, poison
