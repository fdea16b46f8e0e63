"""``rotary.kernels.overlap.shares_elements``: the exact overlap test that guards in-place rotation of views.

A false "overlap" refuses a legitimate call (q and k sliced from one fused qkv projection); a missed
overlap rotates shared elements twice. Both are checked against listing every element's offset.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rotary.kernels.overlap import shares_elements


def brute_force(a: torch.Tensor, b: torch.Tensor) -> bool:
    def offsets(t: torch.Tensor) -> set[int]:
        out = {t.storage_offset()}
        for n, s in zip(t.shape, t.stride()):
            out = {o + i * s for o in out for i in range(n)}
        return out

    return bool(offsets(a) & offsets(b))


def test_q_and_k_heads_of_one_qkv_projection_do_not_overlap():
    for S in (1, 5, 2048):
        qkv = torch.empty(1, S, 48, 16)
        q, k, v = qkv[:, :, :32], qkv[:, :, 32:40], qkv[:, :, 40:]
        assert not shares_elements(q, k) and not shares_elements(k, q)
        assert not shares_elements(q.transpose(1, 2), k.transpose(1, 2))
        assert not shares_elements(k, v)
        assert shares_elements(q, qkv[:, :, 31:33])


@st.composite
def two_views(draw):
    """Two slices (with steps) of one [B, S, H, D] buffer, each optionally transposed."""
    shape = [draw(st.integers(1, 4)) for _ in range(4)]
    base = torch.empty(shape)

    def view():
        index = []
        for n in shape:
            lo = draw(st.integers(0, n - 1))
            hi = draw(st.integers(lo + 1, n))
            index.append(slice(lo, hi, draw(st.integers(1, 2))))
        v = base[tuple(index)]
        return v.transpose(1, 2) if draw(st.booleans()) else v

    return view(), view()


@given(two_views())
def test_equals_listing_every_offset(views):
    a, b = views
    assert shares_elements(a, b) == brute_force(a, b)
    assert shares_elements(b, a) == brute_force(a, b)
