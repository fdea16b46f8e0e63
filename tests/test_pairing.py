"""to_half, to_interleaved and permute_qk_weight (pairing.py): the converters between the two pairings."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from helpers import NAMED
from strategies import tensors


@settings(max_examples=60, deadline=None)
@given(w=tensors(max_size=8), head_dim=st.sampled_from([0, 1, 2, 4, -2, 2.0, None]), to=st.sampled_from(["half", "interleaved", "x"]))
def test_pairing_converters(w, head_dim, to):
    try:
        out = rotary.permute_qk_weight(w, head_dim, to)
    except NAMED as exc:
        assert str(exc)
        return
    back = rotary.permute_qk_weight(out, head_dim, "interleaved" if to == "half" else "half")
    assert torch.equal(back, w)


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_converters_name_a_tensor_without_channels(rank):
    x = torch.zeros((4,) * rank)
    if rank == 0:
        with pytest.raises(ValueError, match="channel axis"):
            rotary.to_half(x)
    else:
        assert torch.equal(rotary.to_interleaved(rotary.to_half(x)), x)
