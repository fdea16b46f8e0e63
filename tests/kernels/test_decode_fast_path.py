"""RoPE.forward's decoding fast path (straight to the kernel's ``rope_decode``): bit-identical to the
general path for every position form it takes, and the general path (with its messages) for
everything it does not."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary import positions as P
from rotary.kernels import extension


@pytest.fixture(scope="module", autouse=True)
def _extension_built():
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()


def general(rope, monkeypatch, *args, **kwargs):
    """The result of the general path (the fast path switched off)."""
    with monkeypatch.context() as m:
        m.setattr(rotary.RoPE, "_fast", lambda self, *a: None)
        return rope(*args, **kwargs)


def taken(rope, *args, **kwargs) -> bool:
    q, k = args
    kw = {key: kwargs[key] for key in ("position_ids", "offset", "layout", "inplace") if key in kwargs}
    return (
        rope._fast(
            q, k, kw.get("position_ids"), kw.get("offset", 0), kw.get("layout", "bhsd"), kw.get("inplace", False)
        )
        is not None
    )


@settings(max_examples=80, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq_len=st.integers(1, 5),
    kv_heads=st.integers(1, 2),
    groups=st.integers(1, 3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    layout=st.sampled_from(["bhsd", "bshd"]),
    interleaved=st.booleans(),
    partial=st.booleans(),
    form=st.sampled_from(["offset", "ids_1d", "ids_2d", "ids_row", "arange", "validated"]),
    inplace=st.booleans(),
    start=st.integers(0, 5000),
    seed=st.integers(0, 2**16),
)
def test_fast_path_is_bit_identical_to_the_general_path(
    batch, seq_len, kv_heads, groups, dtype, layout, interleaved, partial, form, inplace, start, seed
):
    mp = pytest.MonkeyPatch()
    g = torch.Generator().manual_seed(seed)
    rope = rotary.RoPE(64, rotary_dim=32 if partial else 64, interleaved=interleaved, max_position=8192)
    shape = (lambda h: (batch, h, seq_len, 64)) if layout == "bhsd" else (lambda h: (batch, seq_len, h, 64))
    q = torch.randn(shape(kv_heads * groups), generator=g).to(dtype)
    k = torch.randn(shape(kv_heads), generator=g).to(dtype)
    ids = torch.randint(0, 6000, (batch, seq_len), generator=g)
    kwargs: dict = {"layout": layout}
    if form == "offset":
        kwargs["offset"] = start
    elif form == "ids_1d":
        kwargs["position_ids"] = ids[0]
    elif form == "ids_2d":
        kwargs["position_ids"] = ids
    elif form == "ids_row":
        kwargs["position_ids"] = ids[:1]
    elif form == "arange":
        kwargs["position_ids"] = P.arange(seq_len, offset=start)
    else:
        kwargs["position_ids"] = P.from_ids(ids, batch=batch, seq_len=seq_len)
    expected = general(rope, mp, q.clone(), k.clone(), inplace=inplace, **kwargs)  # also fills the table cache
    q_in, k_in = q.clone(), k.clone()
    assert taken(rope, q_in.clone(), k_in.clone(), inplace=inplace, **kwargs)
    got = rope(q_in, k_in, inplace=inplace, **kwargs)
    for e, o, x in zip(expected, got, (q_in, k_in)):
        assert torch.equal(e, o) and e.dtype == o.dtype and e.shape == o.shape
        assert (o is x) == inplace
        assert o.stride() == e.stride()


def test_fast_path_identical_to_hugging_face_at_the_decode_shape():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rope = rotary.RoPE(128, max_position=8192)
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 1, 128)
    ids = torch.tensor([[4096]])
    cos, sin = rope.cos_sin(ids)
    expected = apply_rotary_pos_emb(q, k, cos, sin)
    for kwargs in ({"offset": 4096}, {"position_ids": ids}):
        got = rope(q, k, **kwargs)
        assert taken(rope, q, k, **kwargs)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_general_path_for_what_the_fast_path_does_not_take():
    rope = rotary.RoPE(64, max_position=64)
    q, k = torch.randn(1, 4, 2, 64), torch.randn(1, 2, 2, 64)
    rope(q, k)  # fill the cache
    assert not taken(rope, q.requires_grad_(), k)  # autograd
    q = q.detach()
    assert not taken(
        rope, q, k, position_ids=torch.tensor([3, 4], dtype=torch.int32)
    )  # int32 ids: general path converts
    assert taken(rope, q, k, offset=100)  # past the table: grown as the general path grows it
    ids = torch.tensor([1000, 1001])
    assert not taken(rope, q, k, position_ids=ids)  # ids past it: the general path grows it
    rope(q, k, position_ids=ids)
    assert taken(rope, q, k, position_ids=ids)
    beyond = rotary.rope.CACHE_ROWS  # past the cache's limit: rows computed for these positions
    assert not taken(rope, q, k, offset=beyond)
    assert torch.equal(rope(q, k, offset=beyond)[0], rope(q, k, position_ids=torch.tensor([beyond, beyond + 1]))[0])
    assert not taken(rope, q.double(), k.double())  # float64 tables
    assert not taken(rope, q, k, layout="bsdh")
    with pytest.raises(ValueError, match="unknown layout 'bsdh'"):
        rope(q, k, layout="bsdh")
    with pytest.raises(ValueError, match="head_dim 32 but this RoPE was built for head_dim=64"):
        rope(q[..., :32], k[..., :32])
    negative = torch.tensor([-1, 0])  # a rotation by a negative angle, as position * inv_freq gives it
    want = rotary.reference.rotate_complex(q.double(), negative, rope.inv_freq)
    assert float((rope(q, k, position_ids=negative)[0].double() - want).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="q and k share memory|are the same memory"):
        rope(q, q, inplace=True)
    with pytest.raises(ValueError, match=r"position_ids of shape \(3,\) do not fit .* S=2"):
        rope(q, k, position_ids=torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("form", ["shared", "indexed_1d", "indexed_2d", "per_token", "per_token_batch_1"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_with_upstream_tables_takes_the_fast_path_bit_identically(form, layout, inplace, dtype, monkeypatch):
    from rotary import rotation as apply

    rope = rotary.RoPE(64, rotary_dim=48, max_position=8192)
    g = torch.Generator().manual_seed(0)
    shape = (lambda h: (2, h, 3, 64)) if layout == "bhsd" else (lambda h: (2, 3, h, 64))
    q, k = torch.randn(shape(8), generator=g).to(dtype), torch.randn(shape(2), generator=g).to(dtype)
    ids = torch.randint(0, 5000, (2, 3), generator=g)
    if form.startswith("per_token"):  # Hugging Face's [B, S, r] tables (rotary.hf.patch), or [1, S, r]
        cos, sin = rope.cos_sin(ids[:1] if form == "per_token_batch_1" else ids)
        tables = rotary.RotaryTables.from_tensors(cos, sin, interleaved=False)
    else:
        positions = {"shared": P.arange(3, offset=4000), "indexed_1d": ids[0], "indexed_2d": ids}[form]
        tables = rope.tables(positions)
    calls = []
    real = apply._fast_pair
    monkeypatch.setattr(apply, "_fast_pair", lambda *a: calls.append(real(*a)) or calls[-1])
    got = rotary.rotate([q.clone(), k.clone()], tables, layout=layout, inplace=inplace, kinds=("q", "k"))
    assert calls and calls[-1] is not None
    monkeypatch.setattr(apply, "_fast_pair", lambda *a: None)
    expected = rotary.rotate([q.clone(), k.clone()], tables, layout=layout, inplace=inplace, kinds=("q", "k"))
    for e, o in zip(expected, got):
        assert torch.equal(e, o) and o.stride() == e.stride()


def test_rotate_fast_path_leaves_mismatches_to_the_general_path():
    rope = rotary.RoPE(64)
    q, k = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 3, 64)
    per_token = rotary.RotaryTables.from_tensors(*rope.cos_sin(torch.zeros(2, 3, dtype=torch.long)), interleaved=False)
    with pytest.raises(ValueError, match="cos/sin have batch 2 but x has batch 1"):
        rotary.rotate([q, k], per_token)  # [B, S, r] tables for another batch size
    q4, k4 = torch.randn(4, 4, 1, 64), torch.randn(4, 2, 1, 64)
    for batch in (2, 8):  # S fits, the B * S rows do not: rope_decode declines, the general path names B
        per_token = rotary.RotaryTables.from_tensors(
            *rope.cos_sin(torch.zeros(batch, 1, dtype=torch.long)), interleaved=False
        )
        with pytest.raises(ValueError, match=f"cos/sin have batch {batch} but x has batch 4"):
            rotary.rotate([q4, k4], per_token)
    with pytest.raises(ValueError, match="cover S=2 positions but"):
        rotary.rotate([q, k], rope.tables(P.arange(2)))  # a shared [S, r] table for 2 tokens, not 3
    with pytest.raises(ValueError, match="position_ids of shape"):
        rotary.rotate([q, k], rope.tables(torch.arange(4)))  # rows for 4 tokens
    with pytest.raises(ValueError, match="kinds must give"):
        rotary.rotate([q, k], rope.tables(P.arange(3)), kinds=("q", "v"))
