"""apply_rotary and RoPE: RoPE's defining properties, the reference forms, dtypes, layouts, errors."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rotary
from helpers import hf_frequencies
from rotary import reference


@st.composite
def configs(draw):
    head_dim = 2 * draw(st.integers(1, 24))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    return dict(
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        base=draw(st.sampled_from([100.0, 10000.0, 500000.0])),
        interleaved=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        seq_len=draw(st.integers(1, 12)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def make(cfg, heads=2, batch=2):
    g = torch.Generator().manual_seed(cfg["seed"])
    rope = rotary.RoPE(cfg["head_dim"], base=cfg["base"], rotary_dim=cfg["rotary_dim"], interleaved=cfg["interleaved"])
    shape = (batch, heads, cfg["seq_len"], cfg["head_dim"])
    q = torch.randn(shape, generator=g, dtype=cfg["dtype"])
    k = torch.randn(shape, generator=g, dtype=cfg["dtype"])
    return rope, q, k


def tol(dtype):
    return 2e-5 if dtype == torch.float32 else 1e-6  # tables are fp32 (1.2e-7) times norms of ~5


@given(configs())
def test_norm_preserved(cfg):
    rope, q, k = make(cfg)
    qr, kr = rope(q, k, offset=37)
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=tol(cfg["dtype"]), rtol=0)
    assert qr.dtype == q.dtype


@given(configs())
def test_position_zero_is_identity(cfg):
    rope, q, _ = make(cfg)
    out = rope.rotate(q, position_ids=torch.zeros(cfg["seq_len"], dtype=torch.long))
    assert torch.equal(out, q)


@given(configs(), st.integers(0, 5000), st.integers(0, 5000))
def test_relative_property(cfg, m, t):
    """<f(q, m), f(k, n)> == <q, R(n-m) k> == <f(q, m+t), f(k, n+t)>."""
    rope, q, k = make(cfg)
    n = m + 3
    q1, k1 = q[:, :, :1], k[:, :, :1]
    fq, fk = rope.rotate(q1, offset=m), rope.rotate(k1, offset=n)
    lhs = (fq.double() * fk.double()).sum(-1)
    rel = rope.rotate(k1, offset=n - m).double()  # R(n-m) k
    mid = (q1.double() * rel).sum(-1)
    fq_t, fk_t = rope.rotate(q1, offset=m + t), rope.rotate(k1, offset=n + t)
    shifted = (fq_t.double() * fk_t.double()).sum(-1)
    bound = 4 * tol(cfg["dtype"]) * q1.norm(dim=-1).double() * k1.norm(dim=-1).double()
    assert ((lhs - mid).abs() <= bound).all()
    assert ((lhs - shifted).abs() <= bound).all()


@given(configs())
def test_fast_path_equals_all_three_references(cfg):
    rope, q, _ = make(cfg)
    pos = torch.arange(cfg["seq_len"]) * 7 + 3
    fast = rope.rotate(q, position_ids=pos).double()
    # the frequencies of the references: transformers' default expression over the rotated channels, restated
    # (docs/core.md: inv_freq is bit-identical to it), not the module's own
    inv, inter = hf_frequencies({"rope_type": "default"}, cfg["base"], cfg["rotary_dim"])[0], cfg["interleaved"]
    assert torch.equal(rope.inv_freq, inv)
    # the fast path rounds cos/sin to fp32 once; the references stay in float64
    bound = 4e-7 * q.abs().max().item() * 2 + (1e-6 if cfg["dtype"] == torch.float32 else 0)
    for ref in (
        reference.rotate_matrix(q, pos, inv, interleaved=inter),
        reference.rotate_complex(q, pos, inv, interleaved=inter),
        torch.from_numpy(reference.rotate_numpy(q.numpy(), pos.numpy(), inv.numpy(), interleaved=inter)),
    ):
        assert float((fast - ref).abs().max()) <= bound
    # pass-through channels are untouched, bit for bit
    r = cfg["rotary_dim"]
    assert torch.equal(rope.rotate(q, position_ids=pos)[..., r:], q[..., r:])


@given(configs())
def test_half_and_interleaved_related_by_converters(cfg):
    cfg = dict(cfg, interleaved=False)
    half, q, _ = make(cfg)
    inter = rotary.RoPE(cfg["head_dim"], base=cfg["base"], rotary_dim=cfg["rotary_dim"], interleaved=True)
    r = cfg["rotary_dim"]
    out_half = half.rotate(q, offset=11)
    out_inter = inter.rotate(rotary.to_interleaved(q, r), offset=11)
    assert torch.equal(rotary.to_interleaved(out_half, r), out_inter)  # same products, same roundings
    assert torch.equal(rotary.to_half(rotary.to_interleaved(q, r), r), q)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_low_precision_inputs_rotated_in_fp32_and_cast_once(dtype, interleaved, gen):
    rope = rotary.RoPE(64, interleaved=interleaved)
    q = torch.randn(2, 4, 33, 64, generator=gen).to(dtype)
    out = rope.rotate(q, offset=1000)
    assert out.dtype == dtype
    want = rope.rotate(q.float(), offset=1000).to(dtype)  # fp32 arithmetic, one rounding
    assert torch.equal(out, want)


def test_gqa_and_both_layouts(gen):
    rope = rotary.RoPE(32, rotary_dim=16)
    q = torch.randn(2, 8, 10, 32, generator=gen)
    k = torch.randn(2, 2, 10, 32, generator=gen)
    qr, kr = rope(q, k, offset=5)
    assert qr.shape == q.shape and kr.shape == k.shape
    q2, k2 = rope(q.transpose(1, 2), k.transpose(1, 2), offset=5, layout="bshd")
    assert torch.equal(q2.transpose(1, 2), qr) and torch.equal(k2.transpose(1, 2), kr)
    # MQA: one kv head
    _, k1 = rope(q, k[:, :1], offset=5)
    assert torch.equal(k1, kr[:, :1])


def test_batched_position_ids_with_left_padding(gen):
    rope = rotary.RoPE(16)
    q = torch.randn(2, 3, 6, 16, generator=gen)
    k = torch.randn(2, 3, 6, 16, generator=gen)
    # sequence 0 has 2 pad tokens on the left; its real tokens start at position 0
    position_ids = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    qr, kr = rope(q, k, position_ids=position_ids)
    # each row at its own positions, against the float64 reference (not another path of the library)
    for x, out in ((q, qr), (k, kr)):
        for b in range(2):
            want = reference.rotate_complex(x[b].double(), position_ids[b], rope.inv_freq)
            torch.testing.assert_close(out[b].double(), want, rtol=0, atol=2e-5 * max(1.0, float(x.abs().max())))
    # the real tokens of the padded row are rotated as the unpadded sequence from position 0
    torch.testing.assert_close(
        qr[0, :, 2:].double(),
        reference.rotate_complex(q[0, :, 2:].double(), torch.arange(4), rope.inv_freq),
        rtol=0,
        atol=2e-5 * max(1.0, float(q.abs().max())),
    )
    cos, sin = rope.cos_sin(position_ids)
    assert torch.equal(rotary.apply_rotary(k, cos, sin), kr)  # the functional form, from the same tables


def test_inplace_rotates_only_the_rotary_channels(gen):
    rope = rotary.RoPE(16, rotary_dim=8)
    x = torch.randn(1, 2, 5, 16, generator=gen)
    want = rope.rotate(x, offset=3)
    y = x.clone()
    tail = y[..., 8:].clone()
    cos, sin = rope.cos_sin(torch.arange(3, 8))
    out = rotary.apply_rotary_(y, cos, sin)
    assert out is y and torch.equal(y, want) and torch.equal(y[..., 8:], tail)
    z = x.clone()
    q2, _ = rope(z, z.clone(), offset=3, inplace=True)
    assert q2 is z and torch.equal(z, want)


def test_check_tables_catches_seed_002_pairing_mistake():
    # seed 002 built tables for adjacent pairs and applied them with rotate_half
    cos, sin = rotary.RoPE(8, interleaved=True).cos_sin(torch.arange(6))
    with pytest.raises(ValueError, match="laid out for the interleaved .*interleaved=False"):
        rotary.check_tables(cos, sin, interleaved=False)
    x = torch.randn(1, 1, 6, 8)
    with pytest.raises(ValueError, match="interleaved"):
        rotary.apply_rotary(x, cos, sin, interleaved=False, validate=True)
    rotary.check_tables(cos, sin, interleaved=True)
    # the default check samples a few rows: the mistake cannot pass silently
    with pytest.raises(ValueError, match="laid out for the interleaved"):
        rotary.apply_rotary(x, cos, sin)
    # and what goes wrong if nobody checks: the result is not the rotation (the pure-torch path
    # also changes norms, as seed 002 printed; the fused kernel reads one angle per pair, so it
    # rotates, but by the wrong angles)
    wrong = rotary.apply_rotary(x, cos, sin, interleaved=False, validate=False)
    right = rotary.RoPE(8, interleaved=False).rotate(x)
    assert float((wrong - right).abs().max()) > 1e-2
    from rotary.kernels.eager import rotate_torch

    torch_wrong = rotate_torch(x, cos[None, None], sin[None, None], interleaved=False, inplace=False)
    assert float((torch_wrong.norm(dim=-1) - x.norm(dim=-1)).abs().max()) > 1e-3
    half = rotary.RoPE(8).cos_sin(torch.arange(6))
    with pytest.raises(ValueError, match="laid out for the half"):
        rotary.check_tables(*half, interleaved=True)


def test_check_tables_rejects_non_rotation_tables():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    with pytest.raises(ValueError, match="cos²\\+sin² is not constant"):
        rotary.check_tables(cos * torch.linspace(1, 2, 4)[:, None], sin, interleaved=False)
    noise = torch.rand(4, 8)
    with pytest.raises(ValueError, match="fit neither pairing"):
        rotary.check_tables(noise, noise, interleaved=False)


# --- bad input --------------------------------------------------------------------------------
def _qk(**over):
    d = dict(q=torch.randn(1, 2, 4, 8), k=torch.randn(1, 2, 4, 8))
    d.update(over)
    return d


@pytest.mark.parametrize(
    "inputs, kwargs, exc, match",
    [
        (
            _qk(q=torch.ones(1, 2, 4, 8, dtype=torch.long)),
            {},
            TypeError,
            "q must be fp32, bf16, fp16 or fp64, got dtype torch.int64",
        ),
        (
            _qk(k=torch.ones(1, 2, 4, 8, dtype=torch.int32)),
            {},
            TypeError,
            "k must be fp32, bf16, fp16 or fp64, got dtype torch.int32",
        ),
        (_qk(k=torch.randn(1, 2, 4, 6)), {}, ValueError, "k has head_dim 6 but this RoPE was built for head_dim=8"),
        (_qk(q=torch.randn(1, 2, 4, 16)), {}, ValueError, "q has head_dim 16"),
        (_qk(k=torch.randn(1, 2, 5, 8)), {}, ValueError, "q and k must share S: got S=4 for q and S=5 for k"),
        (_qk(q=torch.randn(2, 4, 8)), {}, ValueError, "packed \\[total_tokens, H, D\\] inputs need cu_seqlens"),
        (_qk(q=torch.randn(2, 4)), {}, ValueError, "q must be 4-D.*\\(2, 4\\)"),
        (_qk(), {"layout": "sbhd"}, ValueError, "unknown layout 'sbhd'"),
        (_qk(), {"position_ids": torch.arange(4.0)}, TypeError, "integer dtype.*torch.float32"),
        (_qk(), {"position_ids": torch.ones(4, dtype=torch.bool)}, TypeError, "integer dtype.*torch.bool"),
        (
            _qk(),
            {"position_ids": torch.arange(5)},
            ValueError,
            r"position_ids of shape \(5,\) do not fit x .* with B=1, S=4",
        ),
        (
            _qk(),
            {"position_ids": torch.zeros(1, 1, 4, dtype=torch.long)},
            ValueError,
            "\\[S\\] or \\[B, S\\].*\\(1, 1, 4\\)",
        ),
        (_qk(), {"offset": -1}, ValueError, "offset must be an int >= 0, got -1"),
        (_qk(), {"offset": 1.5}, ValueError, "offset must be an int >= 0, got 1.5"),
    ],
)
def test_bad_inputs_to_rope(inputs, kwargs, exc, match):
    rope = rotary.RoPE(8)
    with pytest.raises(exc, match=match):
        rope(inputs["q"], inputs["k"], **kwargs)


@pytest.mark.parametrize(
    "cos_shape, x_shape, layout, match",
    [
        ((4, 10), (1, 2, 4, 8), "bhsd", "r=10 channels but x has head_dim=8"),
        ((4, 3), (1, 2, 4, 8), "bhsd", "r=3 channels"),
        ((5, 8), (1, 2, 4, 8), "bhsd", "cover S=5 positions but x .* has S=4"),
        ((4, 8), (1, 4, 2, 8), "bhsd", "cover S=4 positions but x .* has S=2"),
        ((3, 4, 8), (2, 2, 4, 8), "bhsd", "cos/sin have batch 3 but x has batch 2"),
        ((4,), (1, 2, 4, 8), "bhsd", "must be \\[S, r\\] or \\[B, S, r\\]"),
    ],
)
def test_bad_tables_to_apply_rotary(cos_shape, x_shape, layout, match):
    cos = torch.ones(cos_shape)
    with pytest.raises(ValueError, match=match):
        rotary.apply_rotary(torch.randn(x_shape), cos, torch.zeros(cos_shape), layout=layout)


def test_apply_rotary_table_type_errors():
    x = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="same shape"):
        rotary.apply_rotary(x, torch.ones(2, 4), torch.ones(2, 2))
    with pytest.raises(TypeError, match="floating point.*int64"):
        rotary.apply_rotary(x, torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got ndarray"):
        rotary.apply_rotary(np.zeros((1, 1, 2, 4)), torch.ones(2, 4), torch.ones(2, 4))


# --- found in review: inputs that used to give silently wrong tensors or unclear errors ----------
def test_position_ids_with_another_batch_size_are_rejected():
    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 4, 16)
    three_rows = torch.arange(12).view(3, 4)
    for call in (lambda: rope(q, q.clone(), position_ids=three_rows), lambda: rope.rotate(q, position_ids=three_rows)):
        with pytest.raises(ValueError, match=r"position_ids of shape \(3, 4\) do not fit x .* with B=1, S=4"):
            call()
    q2 = torch.randn(2, 2, 4, 16)
    with pytest.raises(ValueError, match=r"position_ids of shape \(3, 4\) do not fit x .* with B=2, S=4"):
        rope.rotate(q2, position_ids=three_rows)
    assert rope.rotate(q2, position_ids=three_rows[:1]).shape == q2.shape  # [1, S] broadcasts


def test_inplace_refuses_memory_it_would_rotate_twice():
    rope = rotary.RoPE(16)
    k = torch.randn(1, 1, 4, 16).expand(1, 3, 4, 16)  # MQA keys broadcast over heads
    with pytest.raises(ValueError, match="k .*overlapping memory"):
        rope(torch.randn(1, 3, 4, 16), k, inplace=True)
    a = torch.randn(1, 3, 4, 16)
    with pytest.raises(ValueError, match="q and k are the same memory"):
        rope(a, a, inplace=True)
    q_out, k_out = rope(torch.randn(1, 3, 4, 16), k)  # out of place the expanded view is fine
    assert torch.equal(k_out[:, 0], k_out[:, 2])


def test_uint8_position_ids_are_rejected_not_used_as_a_mask():
    with pytest.raises(TypeError, match="uint8.*boolean mask"):
        rotary.RoPE(16).cos_sin(torch.tensor([3, 2, 1, 0], dtype=torch.uint8))


def test_q_and_k_of_different_dtypes_name_both():
    rope = rotary.RoPE(16)
    with pytest.raises(TypeError, match="q and k must share a dtype, got torch.bfloat16 for q and torch.float32 for k"):
        rope(torch.randn(1, 2, 4, 16).bfloat16(), torch.randn(1, 2, 4, 16))


def test_a_wrong_layout_names_the_layout_that_fits(gen):
    """A [B, S, H, D] tensor passed as the default [B, H, S, D] (and the reverse): the error says which
    layout to pass whenever the tables' positions fit the other sequence axis."""
    cos, sin = rotary.RoPE(32).cos_sin(torch.arange(12))
    bshd = torch.randn(2, 12, 4, 32, generator=gen)
    with pytest.raises(ValueError, match=r"has S=4; if x is \[B, S, H, D\], pass layout='bshd'"):
        rotary.apply_rotary(bshd, cos, sin)
    with pytest.raises(ValueError, match=r"if x is \[B, H, S, D\], pass layout='bhsd'"):
        rotary.apply_rotary(bshd.transpose(1, 2), cos, sin, layout="bshd")
    table_cos, table_sin = rotary.RoPE(32).cos_sin(torch.arange(64))
    with pytest.raises(ValueError, match=r"use \[S\] or \[B, S\]; if x is \[B, S, H, D\], pass layout='bshd'"):
        rotary.apply_rotary(bshd, table_cos, table_sin, position_ids=torch.arange(12))
    with pytest.raises(ValueError) as other:  # fits neither layout: no hint that would mislead
        rotary.apply_rotary(bshd, cos[:5], sin[:5])
    assert "layout=" not in str(other.value)
    assert torch.equal(
        rotary.apply_rotary(bshd, cos, sin, layout="bshd"),
        rotary.apply_rotary(bshd.transpose(1, 2), cos, sin).transpose(1, 2),
    )
