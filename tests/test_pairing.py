"""to_half, to_interleaved and permute_qk_weight (pairing.py): the converters between the two pairings."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from helpers import NAMED
from strategies import tensors


@st.composite
def projections(draw):
    """A q/k projection's weight ``[n_heads * 4, in]`` (sometimes a transposed view) or bias ``[n_heads * 4]``, of
    any dtype: rows that fit head_dim 2 and 4, so that a good share of the draws is valid."""
    rows, rank = 4 * draw(st.integers(0, 3)), draw(st.sampled_from([1, 2]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if rank == 1:
        w = torch.randn(rows, generator=g)
    elif draw(st.booleans()):
        w = torch.randn(draw(st.integers(1, 5)), rows, generator=g).T  # non-contiguous
    else:
        w = torch.randn(rows, draw(st.integers(1, 5)), generator=g)
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool]))
    return w > 0 if dtype == torch.bool else w.to(dtype)


@settings(max_examples=60, deadline=None)
@given(
    w=st.one_of(projections(), projections(), tensors(max_size=8)),
    head_dim=st.sampled_from([2, 4, 4, 2, 0, 1, -2, 2.0, None]),
    to=st.sampled_from(["half", "interleaved", "half", "interleaved", "x"]),
)
def test_pairing_converters(w, head_dim, to):
    # valid: head_dim an even int > 0, to "half" or "interleaved", w [n_heads * head_dim, in] or [n_heads * head_dim]
    valid = type(head_dim) is int and head_dim > 0 and head_dim % 2 == 0 and to in ("half", "interleaved")
    valid = valid and w.dim() in (1, 2) and w.shape[0] % head_dim == 0
    try:
        out = rotary.permute_qk_weight(w, head_dim, to)
    except NAMED as exc:
        assert not valid, f"a valid call was refused: {exc}"
        assert str(exc)
        return
    assert valid, "an invalid call was accepted"
    # each head's rows in the other pairing: interleaved (2i, 2i+1) <-> half (i, i + d/2)
    d = head_dim
    order = [*range(0, d, 2), *range(1, d, 2)] if to == "half" else [j for i in range(d // 2) for j in (i, i + d // 2)]
    heads = w.reshape(w.shape[0] // d, d, *w.shape[1:])
    assert torch.equal(out, heads[:, order].reshape(w.shape))
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


def test_permute_qk_weight_reproduces_interleaved_attention(gen):
    head_dim, heads, seq, width = 16, 3, 9, 24
    x = torch.randn(2, seq, width, generator=gen, dtype=torch.float64)
    wq, wk = (torch.randn(heads * head_dim, width, generator=gen, dtype=torch.float64) for _ in range(2))
    bq = torch.randn(heads * head_dim, generator=gen, dtype=torch.float64)

    def attention_scores(wq, wk, bq, interleaved):
        rope = rotary.RoPE(head_dim, interleaved=interleaved)
        q = (x @ wq.T + bq).view(2, seq, heads, head_dim)
        k = (x @ wk.T).view(2, seq, heads, head_dim)
        q, k = rope(q, k, layout="bshd")
        return torch.einsum("bmhd,bnhd->bhmn", q, k)

    want = attention_scores(wq, wk, bq, interleaved=True)
    got = attention_scores(*(rotary.permute_qk_weight(w, head_dim, "half") for w in (wq, wk, bq)), interleaved=False)
    assert torch.allclose(got, want, atol=1e-10)
    back = rotary.permute_qk_weight(rotary.permute_qk_weight(wq, head_dim, "half"), head_dim, "interleaved")
    assert torch.equal(back, wq)


def test_permute_qk_weight_matches_hf_llama_conversion_rule(gen):
    # Hugging Face's convert_llama_weights_to_hf: view(h, D/2, 2, in).transpose(1, 2).reshape(...)
    heads, head_dim, width = 4, 8, 5
    w = torch.randn(heads * head_dim, width, generator=gen)
    hf = w.view(heads, head_dim // 2, 2, width).transpose(1, 2).reshape(heads * head_dim, width)
    assert torch.equal(rotary.permute_qk_weight(w, head_dim, "half"), hf)


def test_permute_qk_weight_errors():
    with pytest.raises(ValueError, match="n_heads \\* head_dim.*shape \\(30, 4\\).*head_dim=8"):
        rotary.permute_qk_weight(torch.zeros(30, 4), 8)
    with pytest.raises(ValueError, match="to must be 'half' or 'interleaved', got 'complex'"):
        rotary.permute_qk_weight(torch.zeros(16, 4), 8, "complex")  # type: ignore[arg-type]
