"""Whether strided tensors share memory: the guards of in-place rotation.

In place, every element must be written once: a tensor whose elements overlap (keys expanded over
heads) or two tensors sharing elements would be rotated twice. Views of one buffer that interleave
without sharing elements (q and k sliced from a fused qkv projection) are fine. Exact tests from
shapes and strides only (no value is read).
"""

from __future__ import annotations

import torch

__all__ = ["overlaps_itself", "shares_elements"]


def shares_elements(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two strided tensors have at least one element in common (exact; interleaved views do not count)."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    if a.device.type == "meta":  # no memory: every meta storage has address 0, so the storages themselves
        if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
            return False
    elif a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    size = a.element_size()
    if size != b.element_size():
        return True  # views of one buffer in two dtypes: assume the worst
    a_lo, b_lo = a.storage_offset(), b.storage_offset()
    a_hi = a_lo + sum((n - 1) * abs(s) for n, s in zip(a.shape, a.stride()))
    b_hi = b_lo + sum((n - 1) * abs(s) for n, s in zip(b.shape, b.stride()))
    if a_hi < b_lo or b_hi < a_lo:
        return False
    if a.stride() == b.stride() and all(
        s > 0 or n == 1 for n, s in zip((*a.shape, *b.shape), (*a.stride(), *b.stride()))
    ):
        found = _same_stride_overlap(a.shape, b.shape, a.stride(), b_lo - a_lo)
        if found is not None:
            return found
    return _element_overlap(a, b)


def _same_stride_overlap(sa, sb, strides, delta) -> bool | None:
    """Exact answer for views with equal positive strides when each stride exceeds what the smaller
    strides can reach (as for views of one contiguous buffer); ``None`` when that does not hold."""
    dims = sorted(range(len(strides)), key=lambda d: -strides[d])
    reach = 0  # the largest |sum of k_e s_e| over the dims with smaller strides, |k_e| < max(sa_e, sb_e)
    for d in reversed(dims):
        if strides[d] <= reach:
            return None
        reach += (max(sa[d], sb[d]) - 1) * strides[d]

    def search(i: int, rest: int) -> bool:
        if i == len(dims):
            return rest == 0
        d = dims[i]
        low = rest // strides[d]
        for k in (low, low + 1):  # a's index minus b's index along d
            if -sb[d] < k < sa[d] and search(i + 1, rest - k * strides[d]):
                return True
        return False

    return search(0, delta)


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """The storage offset of every element of ``t``, int64 ``[numel]``."""
    out = torch.full((), t.storage_offset(), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        out = (out.unsqueeze(-1) + torch.arange(n) * s).reshape(-1)
    return out


def _element_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exact, by listing element offsets (the general case; rare)."""
    return bool(torch.isin(_element_offsets(a), _element_offsets(b)).any())


def overlaps_itself(x: torch.Tensor) -> bool:
    """Whether two elements of ``x`` are one element of memory (an expanded or ``as_strided`` view), exactly.

    Example:
        >>> overlaps_itself(torch.zeros(4, 8)), overlaps_itself(torch.zeros(8)[None].expand(4, 8))
        (False, True)
        >>> overlaps_itself(torch.zeros(64).as_strided((4, 16), (8, 1)))  # rows 16 long, 8 apart
        True
    """
    status = torch._debug_has_internal_overlap(x)  # 0: no, 1: yes, 2: too hard for it
    if status != 2:
        return status == 1
    reach = 0  # how far the dims with smaller strides reach: a larger stride cannot land inside it
    for stride, size in sorted((abs(s), n) for n, s in zip(x.shape, x.stride()) if n > 1):
        if stride <= reach:
            offsets = _element_offsets(x)
            return offsets.unique().numel() != offsets.numel()
        reach += (size - 1) * stride
    return False
