"""Arbitrary input to the public rotation API: the result is right (against the float64 reference
forms) or the error is a named ``ValueError``/``TypeError`` from rotary that shows the offending value —
never a wrong tensor, never a bare internal exception (IndexError, RuntimeError from inside torch,
AssertionError, ZeroDivisionError, ...)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary import reference

NAMED = (ValueError, TypeError)
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool]
TOL = {torch.float32: 2e-5, torch.float64: 1e-9, torch.bfloat16: 8e-2, torch.float16: 8e-3}


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


def _expected(rope, x, pos, layout):
    """The float64 reference rotation of x (4-D) at its positions, or None when not computable."""
    seq_dim = 2 if layout == "bhsd" else 1
    s = x.shape[seq_dim]
    if pos is None:
        ids = torch.arange(s).expand(x.shape[0], s)
    else:
        ids = pos.long().expand(x.shape[0], s)
    xb = x.double() if layout == "bhsd" else x.double().transpose(1, 2)
    out = torch.empty_like(xb)
    for b in range(xb.shape[0]):
        out[b] = reference.rotate_complex(xb[b], ids[b], rope.freqs.inv_freq, interleaved=rope.interleaved)
    return out if layout == "bhsd" else out.transpose(1, 2)


@st.composite
def rope_inputs(draw):
    """Mostly inputs that fit (so the results are checked), the rest anything."""
    head_dim = draw(st.sampled_from([2, 4, 6]))
    fitting = tensors(rank=4, max_size=4, last=head_dim, dtype=draw(st.sampled_from(DTYPES[:4])))
    return head_dim, draw(st.one_of(fitting, fitting, fitting, tensors()))


@settings(max_examples=150, deadline=None)
@given(
    case=rope_inputs(),
    interleaved=st.booleans(),
    layout=st.sampled_from(["bhsd", "bhsd", "bshd", "sbhd", None]),
    inplace=st.sampled_from([False, False, True, "yes"]),
    positions=st.one_of(st.none(), st.none(), positions_strategy()),
    offset=st.sampled_from([0, 0, 5, -1, 2**40, 1.5, True]),
)
def test_rope_rotate_is_right_or_a_named_error(case, interleaved, layout, inplace, positions, offset):
    head_dim, x = case
    rope = rotary.RoPE(head_dim, interleaved=interleaved, max_position=8)
    before = x.clone() if isinstance(x, torch.Tensor) else x
    kwargs = dict(layout=layout, inplace=inplace, offset=offset)
    if positions is not None:
        kwargs["position_ids"] = positions
    try:
        out = rope.rotate(x, **kwargs)
    except NAMED as exc:
        assert str(exc), "an error must say what is wrong"
        return
    # it ran: then every input was valid, and the result must be the rotation
    assert x.is_floating_point() and out.shape == x.shape and out.dtype == x.dtype
    if x.dim() == 4:
        assert layout in ("bhsd", "bshd")
        view, view_layout = before, layout
    else:  # packed [T, H, D] or vLLM's flat [T, H * D]: one sequence of T tokens, per-token positions
        assert x.dim() in (2, 3) and positions is not None and offset in (0, False)
        view, view_layout = before.reshape(1, x.shape[0], -1, head_dim), "bshd"
    if positions is not None:
        assert offset == 0 or offset is False
        ref = _expected(rope, view, positions, view_layout)
    else:
        seq_dim = 2 if view_layout == "bhsd" else 1
        ref = _expected(rope, view, torch.arange(offset, offset + view.shape[seq_dim]), view_layout)
    ref = ref.reshape(x.shape)
    scale = max(1.0, float(before.double().abs().max())) if before.numel() else 1.0
    big = positions is not None and positions.numel() and int(positions.max()) > 2**20 or offset == 2**40
    tol = TOL[x.dtype] * scale * (1e4 if big else 1)  # fp32 of angles ~1e12 rad: the reference differs too
    assert float((out.double() - ref).abs().max()) <= tol if out.numel() else True
    if inplace is True:
        assert out is x


@settings(max_examples=120, deadline=None)
@given(
    x=tensors(rank=4, max_size=4, dtype=torch.float32),
    cos=tensors(max_size=6),
    interleaved=st.booleans(),
    validate=st.sampled_from([True, False, "full", "maybe"]),
    positions=positions_strategy(),
)
def test_apply_rotary_with_arbitrary_tables_never_crashes_inside(x, cos, interleaved, validate, positions):
    kwargs = dict(interleaved=interleaved, validate=validate)
    if positions is not None:
        kwargs["position_ids"] = positions
    try:
        out = rotary.apply_rotary(x, cos, cos, **kwargs)
    except NAMED as exc:
        assert str(exc)
        return
    assert out.shape == x.shape
    if validate is not False:  # a checked table of identical cos and sin is a rotation by 45° scaled: finite
        assert torch.isfinite(out).all() or not torch.isfinite(x).all()


@settings(max_examples=60, deadline=None)
@given(
    hidden=st.sampled_from([8, 16, 12]),
    heads=st.sampled_from([1, 2, 3, 0]),
    kv=st.sampled_from([None, 1, 2, 5]),
    causal=st.sampled_from([True, False, "true"]),
    seq=st.integers(0, 6),
    mask=st.sampled_from(["none", "ones", "float", "twos", "short", "left"]),
    positions=positions_strategy(),
)
def test_attention_is_right_shaped_or_a_named_error(hidden, heads, kv, causal, seq, mask, positions):
    try:
        attn = rotary.nn.RotaryAttention(hidden, heads, num_kv_heads=kv, causal=causal)
    except NAMED as exc:
        assert str(exc)
        return
    x = torch.randn(2, seq, hidden)
    masks = {
        "none": None, "ones": torch.ones(2, seq, dtype=torch.long), "float": torch.zeros(2, seq),
        "twos": torch.full((2, seq), 2), "short": torch.ones(2, max(seq - 1, 0), dtype=torch.long),
        "left": torch.cat((torch.zeros(2, 1, dtype=torch.long), torch.ones(2, max(seq - 1, 0), dtype=torch.long)), 1)[:, :seq],
    }
    try:
        out = attn(x, attention_mask=masks[mask], position_ids=positions)
    except NAMED as exc:
        assert str(exc)
        return
    assert out.shape == x.shape and torch.isfinite(out).all()


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
