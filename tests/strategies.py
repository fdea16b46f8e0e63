"""Hypothesis strategies and settings shared by the property tests (importable as ``strategies``).

Kept apart from helpers.py, which is also imported where hypothesis is not installed (the GPU machine).

- :func:`tensors`: tensors of any rank, size and dtype, as plain, transposed, sliced or expanded views;
- :func:`positions_strategy`: position ids as users pass them, right and wrong (negative, huge, float, lists);
- :data:`odd_values`: numbers, bools, strings and NaN where an argument wants a count;
- :data:`FAST`: the settings of the quick property tests (25 examples).
"""

import torch
from hypothesis import settings
from hypothesis import strategies as st

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool]


@st.composite
def tensors(draw, rank=None, dtype=None, max_size=5, last=None):
    rank = draw(st.integers(0, 5)) if rank is None else rank
    shape = draw(st.lists(st.integers(0, max_size), min_size=rank, max_size=rank))
    if last is not None and rank:
        shape[-1] = last
    dtype = draw(st.sampled_from(DTYPES)) if dtype is None else dtype
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=g).to(dtype) if dtype != torch.bool else torch.zeros(shape, dtype=torch.bool)
    kind = draw(st.sampled_from(["plain", "transposed", "sliced", "expanded"]))
    if kind == "transposed" and x.dim() >= 2:
        x = x.transpose(0, 1)
    elif kind == "sliced" and x.dim() >= 1 and x.shape[0] > 1:
        x = x[::2]
    elif kind == "expanded" and x.dim() >= 2 and x.shape[1] == 1:
        x = x.expand(x.shape[0], 3, *x.shape[2:])
    return x


def positions_strategy():
    return st.one_of(
        st.none(),
        st.integers(-3, 2**41).map(lambda n: torch.tensor([n])),
        st.lists(st.integers(-2, 70), min_size=0, max_size=6).map(torch.tensor),
        st.lists(st.integers(0, 70), min_size=1, max_size=6).map(lambda v: torch.tensor(v, dtype=torch.int32)),
        st.lists(st.integers(0, 9), min_size=1, max_size=6).map(lambda v: torch.tensor(v, dtype=torch.float32)),
        st.lists(st.lists(st.integers(0, 40), min_size=3, max_size=3), min_size=1, max_size=3).map(torch.tensor),
        st.just([0, 1, 2]),
    )


FAST = settings(max_examples=25, deadline=None)


odd_values = st.sampled_from([0, -1, 1, 2, 3, 4, 7, 8, 2**20, 2.0, 1.5, True, None, "4", float("nan"), float("inf")])
