"""apply_rotary and its in-place forms (functional.py). The interfaces users of other kernels already
write, each equal to the 4-D path:
flash-attn's ``seqlen_offsets`` and packed ``qkv`` / ``kv`` in-place calls, and vLLM's flat
``[tokens, H * D]`` layout with per-token positions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary import reference
from strategies import positions_strategy, tensors
from variant_checks import assert_close, call, expect, largest_angle, valid_ids

D = 16


@pytest.fixture
def tables():
    rope = rotary.RoPE(D, rotary_dim=12)
    return rope, *rope.cos_sin(torch.arange(40))


@pytest.mark.parametrize("interleaved", [False, True])
def test_seqlen_offsets_shift_each_sequence(interleaved, gen):
    rope = rotary.RoPE(D, interleaved=interleaved)
    cos, sin = rope.cos_sin(torch.arange(40))
    x = torch.randn(3, 2, 5, D, generator=gen)  # bhsd
    offsets = torch.tensor([0, 7, 30])
    got = rotary.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    for b, o in enumerate(offsets.tolist()):  # flash-attn's meaning: rows o .. o + S - 1 of the tables
        assert torch.equal(
            got[b], rotary.apply_rotary(x[b : b + 1], cos[o : o + 5], sin[o : o + 5], interleaved=interleaved)[0]
        )
    same = rotary.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=7)
    assert torch.equal(same, rope.rotate(x, offset=7))


def test_seqlen_offsets_with_cu_seqlens(tables, gen):
    rope, cos, sin = tables
    packed = torch.randn(4 + 6, 3, D, generator=gen)
    cu = torch.tensor([0, 4, 10])
    got = rotary.apply_rotary(packed, cos, sin, cu_seqlens=cu, seqlen_offsets=torch.tensor([2, 11]))
    assert torch.equal(got[:4], rope.rotate(packed[:4].unsqueeze(0), offset=2, layout="bshd")[0])
    assert torch.equal(got[4:], rope.rotate(packed[4:].unsqueeze(0), offset=11, layout="bshd")[0])


@pytest.mark.parametrize("layout_kind", ["stacked", "gqa"])
def test_qkv_in_place_equals_the_4d_path(layout_kind, tables, gen):
    rope, cos, sin = tables
    B, S, H = 2, 5, 4
    if layout_kind == "stacked":
        qkv = torch.randn(B, S, 3, H, D, generator=gen)
        q, k, v = qkv[:, :, 0].clone(), qkv[:, :, 1].clone(), qkv[:, :, 2].clone()
        kwargs = {}
    else:  # GQA: 4 q heads, 2 k heads, 2 v heads side by side
        qkv = torch.randn(B, S, H + 4, D, generator=gen)
        q, k, v = qkv[:, :, :H].clone(), qkv[:, :, H : H + 2].clone(), qkv[:, :, H + 2 :].clone()
        kwargs = {"num_heads_q": H}
    want_q, want_k = rope(q, k, layout="bshd", offset=3)
    out = rotary.apply_rotary_qkv_(qkv, cos, sin, seqlen_offsets=3, **kwargs)
    assert out is qkv
    got_q = qkv[:, :, 0] if layout_kind == "stacked" else qkv[:, :, :H]
    got_k = qkv[:, :, 1] if layout_kind == "stacked" else qkv[:, :, H : H + 2]
    got_v = qkv[:, :, 2] if layout_kind == "stacked" else qkv[:, :, H + 2 :]
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k) and torch.equal(got_v, v)


def test_qkv_with_key_tables_and_packed_sequences(tables, gen):
    rope, cos, sin = tables
    qkv = torch.randn(7, 3, 2, D, generator=gen)
    before = qkv.clone()
    cu = torch.tensor([0, 3, 7])
    rotary.apply_rotary_qkv_(qkv, cos, sin, cos_k=cos * 0.5, sin_k=sin * 0.5, cu_seqlens=cu, validate=False)
    assert torch.equal(qkv[:, 0], rope.rotate(before[:, 0], cu_seqlens=cu))
    want_k = rotary.apply_rotary(before[:, 1], cos * 0.5, sin * 0.5, cu_seqlens=cu, validate=False)
    assert torch.equal(qkv[:, 1], want_k) and torch.equal(qkv[:, 2], before[:, 2])


def test_kv_rotates_keys_only(tables, gen):
    rope, cos, sin = tables
    kv = torch.randn(2, 4, 2, 3, D, generator=gen)
    before = kv.clone()
    rotary.apply_rotary_kv_(kv, cos, sin, seqlen_offsets=torch.tensor([0, 9]))
    assert torch.equal(kv[1, :, 0], rope.rotate(before[1:, :, 0], offset=9, layout="bshd")[0])
    assert torch.equal(kv[:, :, 1], before[:, :, 1])


def test_vllm_flat_layout(tables, gen):
    rope, cos, sin = tables
    T, Hq, Hk = 6, 4, 2
    positions = torch.tensor([0, 1, 2, 9, 10, 33])
    query, key = torch.randn(T, Hq * D, generator=gen), torch.randn(T, Hk * D, generator=gen)
    q_out, k_out = rope(query, key, position_ids=positions)
    assert q_out.shape == query.shape and k_out.shape == key.shape
    want_q = rope.rotate(query.view(1, T, Hq, D), position_ids=positions, layout="bshd")[0].reshape(T, Hq * D)
    assert torch.equal(q_out, want_q)
    assert torch.equal(rotary.apply_rotary(key, cos, sin, position_ids=positions, head_dim=D), k_out)
    rope(query, key, position_ids=positions, inplace=True)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=torch.tensor([1, 2, 3])),
            r"seqlen_offsets must be .*\[2\]",
        ),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=-1),
            "seqlen_offsets must be an int >= 0",
        ),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=torch.tensor([0, -4])),
            "rows must index the cos/sin table",  # a negative position has no row in a table you made
        ),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=38),
            "reach position 40 but the cos/sin tables have only 40 rows",
        ),
        (
            lambda c, s: rotary.apply_rotary(
                torch.randn(2, 1, 3, D), c, s, seqlen_offsets=1, position_ids=torch.arange(3)
            ),
            "position_ids and seqlen_offsets each give positions; pass one",
        ),
        (lambda c, s: rotary.apply_rotary(torch.randn(5, 3 * D), c, s, position_ids=torch.arange(5)), "pass head_dim"),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(5, 30), c, s, position_ids=torch.arange(5), head_dim=D),
            r"H \* D a multiple of head_dim=16; got shape \(5, 30\)",
        ),
        (lambda c, s: rotary.apply_rotary_qkv_(torch.randn(2, 3, 4, 2, D), c, s), r"\[B, S, 3, H, D\]"),
        (lambda c, s: rotary.apply_rotary_qkv_(torch.randn(2, 3, 5, D), c, s, num_heads_q=2), "Hq \\+ 2 \\* Hk"),
        (lambda c, s: rotary.apply_rotary_qkv_(torch.randn(2, 3, 3, 2, D), c, s, cos_k=c), "both cos_k and sin_k"),
        (lambda c, s: rotary.apply_rotary_kv_(torch.randn(2, 3, 3, 2, D), c, s), r"\[B, S, 2, H, D\]"),
        (
            lambda c, s: rotary.RoPE(D)(torch.randn(5, 30), torch.randn(5, 32), position_ids=torch.arange(5)),
            "multiple of head_dim=16; got shape \\(5, 30\\)",
        ),
    ],
)
def test_interface_errors(call, match, tables):
    _, cos, sin = tables
    with pytest.raises((ValueError, TypeError), match=match):
        call(cos, sin)


@settings(max_examples=120, deadline=None)
@given(
    x=st.one_of(
        tensors(rank=4, max_size=4, dtype=torch.float32), tensors(rank=4, max_size=3, dtype=torch.float32, last=4)
    ),
    cos=tensors(max_size=6),
    made=st.booleans(),
    interleaved=st.booleans(),
    validate=st.sampled_from([True, False, "full", "maybe"]),
    positions=positions_strategy(),
    data=st.data(),
)
def test_apply_rotary_with_arbitrary_tables_never_crashes_inside(x, cos, made, interleaved, validate, positions, data):
    batch, _, seq_len, width = x.shape
    if made:  # positions of x's tokens (or none) for the rotation tables
        ids = st.lists(st.integers(0, 60), min_size=seq_len, max_size=seq_len).map(lambda v: torch.tensor(v).long())
        positions = data.draw(st.one_of(st.none(), ids))
    # positions as apply_rotary documents them (docs/core.md, "Tables you made"): None (cos/sin are the rows of
    # x's tokens), or int64/int32 [S] / [1 or B, S], >= 0, rows of tables [T, r]
    ids_ok = positions is None or (
        valid_ids(positions)
        and positions.shape[-1] == seq_len
        and (positions.dim() == 1 or positions.shape[0] in (1, batch))
    )
    rows = seq_len if positions is None else int(positions.max()) + 1 if ids_ok and positions.numel() else 1
    # half the draws pass rotation tables RoPE makes for x's width and pairing (where x has channels to rotate and
    # the table is small), the others the arbitrary tensor drawn, as both cos and sin
    made = made and width > 0 and width % 2 == 0 and ids_ok and rows <= 4096
    if made:
        rope = rotary.RoPE(width, interleaved=interleaved)
        cos, sin = rope.cos_sin(torch.arange(rows))
        valid = validate in (True, False, "full")
    else:
        sin = cos
        # validate must be True, False, "sync" or "full"; a float32/float64 table of random values is no rotation
        # table (the two channels of a pair differ in every row), refused by validate's checks whenever it has a
        # row and a pair. Other draws are undecided here: validate=False with arbitrary shapes, half-precision or
        # integer values (random halves of a pair may round to one value), empty tables
        not_rotation = cos.dtype in (torch.float32, torch.float64) and cos.dim() >= 1 and cos.shape[-1] >= 2
        valid = False if validate == "maybe" or (validate and not_rotation and cos.numel()) else None
    kwargs = dict(interleaved=interleaved, validate=validate)
    if positions is not None:
        kwargs["position_ids"] = positions
    if valid is None:
        out, err = call(rotary.apply_rotary, x, cos, sin, **kwargs)
        if err is not None:
            return
    else:
        out = expect(valid, rotary.apply_rotary, x, cos, sin, **kwargs)
        if not valid:
            return
    assert out.shape == x.shape
    if validate is not False:  # a checked table of identical cos and sin is a rotation by 45° scaled: finite
        assert torch.isfinite(out).all() or not torch.isfinite(x).all()
    if made:  # the float64 reference rotation at each token's position
        ids = (torch.arange(seq_len) if positions is None else positions.long()).expand(batch, seq_len)
        want = torch.empty(x.shape, dtype=torch.float64)
        for b in range(batch):
            want[b] = reference.rotate_complex(x[b], ids[b], rope.inv_freq, interleaved=interleaved)
        assert_close(out, want, x, largest_angle(ids[..., None].double(), rope.inv_freq[None]))
