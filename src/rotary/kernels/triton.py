"""The GPU kernel: the rotation in Triton, same contract as the CPU kernel (``dispatch.rotate``).

One program rotates ``BLOCK_H`` heads of one token (b, s): it reads that token's cos/sin row once
(through ``positions`` when given, so per-batch ids and packed sequences cost no gathered table) and
keeps the arithmetic in fp32 (fp64 for fp64 inputs). The backward pass is the same kernel with sin
negated. The kernel is tested on CPU under Triton's interpreter (``TRITON_INTERPRET=1``); its speed
on a GPU has not been measured yet.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is optional: without it CUDA tensors take the pure-torch path
    triton = None
    tl = None

__all__ = ["available", "rotate_triton"]


def available() -> bool:
    """Whether Triton can be imported."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _rotary_kernel(
        X, OUT, COS, SIN, POS,
        S, H, table_rows, table_stride, batch_rows,
        sxb, sxs, sxh, sob, sos, soh, spb, sps,
        HALF: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_REST: tl.constexpr,
        INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, HAS_POSITIONS: tl.constexpr, INPLACE: tl.constexpr,
        FP64: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0)
        b = row // S
        s = row % S
        if HAS_POSITIONS:
            t = tl.load(POS + b * spb + s * sps)
        else:
            t = b * batch_rows + s
        tl.device_assert((t >= 0) & (t < table_rows), "rotary: position outside the cos/sin table")
        heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        pair = tl.arange(0, BLOCK_P)
        if INTERLEAVED:
            first = 2 * pair
            second = 2 * pair + 1
        else:
            first = pair
            second = pair + HALF
        pair_ok = pair < HALF
        compute = tl.float64 if FP64 else tl.float32
        c = tl.load(COS + t * table_stride + first, mask=pair_ok, other=0.0).to(compute)
        sn = tl.load(SIN + t * table_stride + first, mask=pair_ok, other=0.0).to(compute)
        if CONJUGATE:
            sn = -sn
        mask = (heads < H)[:, None] & pair_ok[None, :]
        x = X + b * sxb + s * sxs + heads[:, None] * sxh
        o = OUT + b * sob + s * sos + heads[:, None] * soh
        a = tl.load(x + first[None, :], mask=mask, other=0.0).to(compute)
        z = tl.load(x + second[None, :], mask=mask, other=0.0).to(compute)
        tl.store(o + first[None, :], (a * c[None, :] - z * sn[None, :]).to(OUT.dtype.element_ty), mask=mask)
        tl.store(o + second[None, :], (z * c[None, :] + a * sn[None, :]).to(OUT.dtype.element_ty), mask=mask)
        if not INPLACE:
            if D > 2 * HALF:  # pass-through channels are copied only out of place
                rest = 2 * HALF + tl.arange(0, BLOCK_REST)
                rest_mask = (heads < H)[:, None] & (rest < D)[None, :]
                tl.store(o + rest[None, :], tl.load(x + rest[None, :], mask=rest_mask), mask=rest_mask)


def rotate_triton(
    xs: list[torch.Tensor],
    outs: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    batch_rows: int,
    interleaved: bool,
    conjugate: bool,
) -> None:
    """Rotate each ``[B, S, H, D]`` x (unit stride over D) into out (may be x itself); one launch per tensor."""
    if triton is None:
        raise RuntimeError("rotary: Triton is not installed")
    r = cos.shape[-1]
    for x, out in zip(xs, outs):
        B, S, H, D = x.shape
        if B * S == 0 or H == 0:
            continue
        block_h = min(triton.next_power_of_2(H), 4)
        pos = positions if positions is not None else cos  # placeholder pointer, unused without positions
        spb, sps = (positions.stride(0), positions.stride(1)) if positions is not None else (0, 0)
        grid = (B * S, triton.cdiv(H, block_h))
        _rotary_kernel[grid](
            x, out, cos, sin, pos,
            S, H, cos.shape[0], cos.stride(0), batch_rows,
            x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2), spb, sps,
            HALF=r // 2, D=D, BLOCK_H=block_h, BLOCK_P=triton.next_power_of_2(r // 2),
            BLOCK_REST=triton.next_power_of_2(max(D - r, 1)),
            INTERLEAVED=interleaved, CONJUGATE=conjugate, HAS_POSITIONS=positions is not None,
            INPLACE=out.data_ptr() == x.data_ptr(), FP64=x.dtype == torch.float64,
        )  # fmt: skip
