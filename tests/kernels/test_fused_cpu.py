"""The fused CPU kernel against the pure-torch oracle: bit-identical results over drawn shapes,
strides, dtypes, pairings, partial rotation, GQA, layouts and position forms."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from helpers import hf_frequencies, make_qk
from rotary import reference
from rotary.kernels import extension
from rotary.kernels.eager import rotate_torch
from variant_checks import assert_close, largest_angle, to_bhsd

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@pytest.fixture(scope="module", autouse=True)
def _extension_built():
    # the fused path must really run here: a failed build is a failed test, not a silent fallback
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()


def oracle(x: torch.Tensor, cos_rows: torch.Tensor, sin_rows: torch.Tensor, layout: str, interleaved: bool):
    """Pure-torch rotation of a contiguous copy; cos_rows/sin_rows ``[B or 1, S, r]``."""
    head_axis = 1 if layout == "bhsd" else 2
    c, s = cos_rows.unsqueeze(head_axis), sin_rows.unsqueeze(head_axis)
    return rotate_torch(x.contiguous(), c, s, interleaved=interleaved, inplace=False)


def assert_matches(got, expected, x, cos_rows, sin_rows, layout, interleaved):
    """Both pairings: bit-identical to the pure-torch path (same products, same rounding order)."""
    assert torch.equal(got, expected), f"max error {(got.double() - expected.double()).abs().max()}"


@st.composite
def cases(draw):
    B, S = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    Hk = draw(st.integers(1, 3))
    Hq = Hk * draw(st.integers(1, 3))  # GQA
    D = 2 * draw(st.integers(1, 12))
    r = 2 * draw(st.integers(1, D // 2))
    return dict(
        shape=(B, S, Hq, Hk, D),
        r=r,
        dtype=draw(st.sampled_from(DTYPES)),
        layout=draw(st.sampled_from(["bhsd", "bshd"])),
        interleaved=draw(st.booleans()),
        strided=draw(st.booleans()),
        inplace=draw(st.booleans()),
        tables=draw(st.sampled_from(["shared", "per_batch", "position_ids_1d", "position_ids_2d"])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=150, deadline=None)
@given(cases())
def test_fused_matches_pure_torch(case):
    gen = torch.Generator().manual_seed(case["seed"])
    B, S, Hq, Hk, D = case["shape"]
    rope = rotary.RoPE(D, rotary_dim=case["r"], interleaved=case["interleaved"])
    q, k, qkv = make_qk(case["shape"], dtype=case["dtype"], layout=case["layout"], strided=case["strided"], gen=gen)
    positions = torch.randint(0, 40, (B, S), generator=gen)
    table_cos, table_sin = rope.cos_sin(
        torch.arange(40), dtype=torch.float64 if case["dtype"] == torch.float64 else torch.float32
    )
    kind = case["tables"]
    if kind == "shared":
        cos, sin, kwargs, rows = table_cos[:S], table_sin[:S], {}, torch.arange(S).expand(1, S)
    elif kind == "per_batch":
        cos, sin, kwargs, rows = table_cos[positions], table_sin[positions], {}, positions
    elif kind == "position_ids_1d":
        rows = positions[:1]
        cos, sin, kwargs = table_cos, table_sin, {"position_ids": rows[0]}
    else:
        rows = positions
        cos, sin, kwargs = table_cos, table_sin, {"position_ids": rows}
    expected = [oracle(t, table_cos[rows], table_sin[rows], case["layout"], case["interleaved"]) for t in (q, k)]
    before = [t.clone() for t in (q, k)]
    opts = dict(interleaved=case["interleaved"], layout=case["layout"], inplace=case["inplace"], **kwargs)
    got = [rotary.apply_rotary(t, cos, sin, **opts) for t in (q, k)]
    for g, e, t, b in zip(got, expected, (q, k), before):
        assert g.dtype == t.dtype and g.shape == t.shape
        assert_matches(g, e, b, table_cos[rows], table_sin[rows], case["layout"], case["interleaved"])
        if case["inplace"]:
            assert g is t
        else:
            assert torch.equal(t, b), "out-of-place call modified its input"
    # and both are the rotation: q against rotary.reference at each token's row, with transformers' frequencies
    # restated (docs/core.md: bit-identical), not the pure-torch path the kernel is compared with above
    inv_freq = hf_frequencies({"rope_type": "default"}, 10000.0, case["r"])[0]
    x = to_bhsd(before[0], case["layout"])
    want = torch.stack(
        [
            reference.rotate_complex(x[b], rows[min(b, rows.shape[0] - 1)], inv_freq, interleaved=case["interleaved"])
            for b in range(B)
        ]
    )
    assert_close(to_bhsd(got[0], case["layout"]), want, x, largest_angle(rows[..., None].double(), inv_freq[None]))
    if qkv is not None and case["inplace"]:  # v (the heads after q and k) is never touched
        v_after = qkv[:, :, Hq + Hk :].clone()
        _, _, fresh = make_qk(
            case["shape"],
            dtype=case["dtype"],
            layout=case["layout"],
            strided=True,
            gen=torch.Generator().manual_seed(case["seed"]),
        )
        assert torch.equal(v_after, fresh[:, :, Hq + Hk :])


def test_module_fuses_q_and_k_and_matches_separate_calls():
    rope = rotary.RoPE(64, rotary_dim=32)
    q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)
    pos = torch.tensor([[3, 4, 5, 6] * 4, list(range(16))])
    qr, kr = rope(q, k, position_ids=pos)
    cos, sin = rope.cos_sin(pos)
    assert torch.equal(qr, rotary.apply_rotary(q, cos, sin))
    assert torch.equal(kr, rotary.apply_rotary(k, cos, sin))
    assert torch.equal(qr[..., 32:], q[..., 32:])  # pass-through channels


def test_inplace_on_qkv_views_leaves_everything_else_alone():
    B, S, H, D = 2, 7, 4, 16
    qkv = torch.randn(B, S, 3 * H * D)
    view = qkv.view(B, S, 3, H, D)
    q, k, v = view[:, :, 0], view[:, :, 1], view[:, :, 2]
    expected_q = rotary.apply_rotary(
        q.contiguous(), *rotary.RoPE(D, rotary_dim=8).cos_sin(torch.arange(S)), layout="bshd"
    )
    v_before = v.clone()
    ptr = qkv.data_ptr()
    rope = rotary.RoPE(D, rotary_dim=8)
    qr, kr = rope(q, k, layout="bshd", inplace=True)
    assert qr is q and kr is k and qkv.data_ptr() == ptr
    assert torch.equal(view[:, :, 0], expected_q)
    assert torch.equal(v, v_before)


def test_against_float64_block_diagonal_reference():
    # an independent oracle (matrix form, float64) at fp32 rounding
    rope = rotary.RoPE(32, interleaved=True)
    x = torch.randn(1, 2, 50, 32)
    got = rope.rotate(x, offset=1000)
    ref = rotary.reference.rotate_matrix(x.double(), torch.arange(1000, 1050), rope.inv_freq, interleaved=True)
    assert (got.double() - ref).abs().max() < 1e-5


def test_large_shape_uses_threads_and_matches():
    # big enough to be split across threads (grain 32k elements)
    rope = rotary.RoPE(128)
    q = torch.randn(1, 32, 300, 128, dtype=torch.bfloat16)
    cos, sin = rope.cos_sin(torch.arange(300))
    expected = oracle(q, cos.unsqueeze(0), sin.unsqueeze(0), "bhsd", False)
    assert torch.equal(rotary.apply_rotary(q, cos, sin), expected)
    assert torch.equal(rotary.apply_rotary_(q, cos, sin), expected)


def test_inplace_allocates_nothing_of_the_inputs_size():
    from rotary.tools.bench import extra_peak_bytes

    rope = rotary.RoPE(128, rotary_dim=64)
    q, k = torch.randn(1, 16, 1024, 128), torch.randn(1, 4, 1024, 128)  # 8 MiB + 2 MiB
    rope(q, k, inplace=True)  # warm the table cache
    inplace = extra_peak_bytes(lambda: rope(q, k, inplace=True))
    if inplace is None:
        pytest.skip("peak resident memory needs Linux /proc")
    assert inplace < 2**20, f"in-place rotation added {inplace} bytes"
    # the measurement is not blind: a fresh 64 MiB tensor shows up
    assert extra_peak_bytes(lambda: torch.ones(2**24)) >= 60 * 2**20


# Rotary dims around the vector widths (8 and 16 fp32 lanes): whole vectors, whole vectors plus a
# partial one, a partial one alone, and the 32/64-pair sizes the kernel specialises; head sizes
# equal to r, one more (odd: an unrotated tail of one channel) and a few more.
TAIL_DIMS = [
    (2, 3),
    (6, 6),
    (14, 17),
    (16, 16),
    (18, 21),
    (30, 31),
    (32, 35),
    (34, 34),
    (46, 49),
    (64, 67),
    (66, 66),
    (128, 128),
    (130, 133),
]


@pytest.mark.parametrize("r,D", TAIL_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_vector_tails_forward_backward_inplace_and_strided(r, D, dtype, interleaved, monkeypatch):
    """Every channel count a vector does not fill, forward (in place and out of place, contiguous and
    views into a wider buffer) and backward, bit-identical to the pure-torch path."""
    from rotary.kernels import ops

    def no_fallback(rotation):
        raise AssertionError("the pure-torch path ran: this test is about the fused kernel")

    monkeypatch.setattr(ops, "run_torch", no_fallback)
    gen = torch.Generator().manual_seed(r * 1000 + D)
    B, S, H = 2, 5, 3
    rope = rotary.RoPE(r, interleaved=interleaved)
    cos, sin = rope.cos_sin(torch.arange(7, 7 + S))
    # a view into a [B, H, S, D + 5] buffer: rows are D + 5 apart, channels still contiguous
    wide = torch.randn(B, H, S, D + 5, generator=gen).to(dtype)
    for x in (wide[..., :D].contiguous(), wide[..., 2 : D + 2]):
        before = x.clone()
        expected = oracle(x, cos.unsqueeze(0), sin.unsqueeze(0), "bhsd", interleaved)
        got = rotary.apply_rotary(x, cos, sin, interleaved=interleaved)
        assert torch.equal(got, expected), f"max error {(got.double() - expected.double()).abs().max()}"
        assert torch.equal(x, before)
        buffer = wide.clone()
        view = buffer[..., 2 : D + 2] if not x.is_contiguous() else x.clone()
        assert rotary.apply_rotary_(view, cos, sin, interleaved=interleaved) is view
        assert torch.equal(view, expected)
        if not x.is_contiguous():  # the channels around the view are untouched
            assert torch.equal(buffer[..., :2], wide[..., :2]) and torch.equal(buffer[..., D + 2 :], wide[..., D + 2 :])

    # backward: the kernel rotates the incoming gradient by the conjugate; autograd through the
    # pure-torch path is the oracle
    grad = torch.randn(B, H, S, D, generator=gen).to(dtype)
    x = wide[..., 1 : D + 1].detach().requires_grad_()
    rotary.apply_rotary(x, cos, sin, interleaved=interleaved).backward(grad)
    ref = wide[..., 1 : D + 1].detach().clone().requires_grad_()
    rotate_torch(
        ref, cos.unsqueeze(0).unsqueeze(0), sin.unsqueeze(0).unsqueeze(0), interleaved=interleaved, inplace=False
    ).backward(grad)
    assert x.grad is not None and torch.equal(x.grad, ref.grad)


def _fp32_patterns() -> torch.Tensor:
    """fp32 values whose rounding to 16 bits is delicate: every exponent (denormals, infinities, NaNs)
    with low bits at and around the bf16 and fp16 rounding ties, both signs, plus random bit patterns."""
    gen = torch.Generator().manual_seed(14)
    exponents = torch.arange(256, dtype=torch.int64) << 23
    low = [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x10000]
    low += [0x17FFF, 0x18000, 0x18001, 0x7F8000, 0x7FFFFF]
    special = (exponents[:, None] | torch.tensor(low)[None, :]).flatten()
    bits = torch.cat([special, special | (1 << 31), torch.randint(0, 2**32, (1 << 16,), generator=gen)])
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return bits.view(torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_16_bit_rounding_matches_pure_torch_for_delicate_values(dtype, interleaved):
    """The kernel rounds its fp32 results to bf16/fp16 in vector registers: with x = (1, 0) pairs,
    cos = v and sin = 0 the first output of each pair is v itself, rounded, for every v above. Equal
    to the pure-torch path bit for bit; NaN stays NaN (its bits may differ: the kernel writes the
    bf16 NaN of c10::BFloat16, torch's vectorised conversion another one)."""
    values = _fp32_patterns()
    n = values.numel() // 16 * 16
    v = values[:n].reshape(-1, 16)  # 16 pairs per row: whole AVX-512 vectors and masked tails alike
    N = v.shape[0]
    ones, zeros = torch.ones(N, 16), torch.zeros(N, 16)
    if interleaved:
        x = torch.stack([ones, zeros], -1).flatten(-2)
        cos = v.repeat_interleave(2, -1)
    else:
        x = torch.cat([ones, zeros], -1)
        cos = torch.cat([v, v], -1)
    x = x.to(dtype).reshape(1, N, 1, 32)
    sin = torch.zeros(N, 32)
    got = rotary.apply_rotary(x, cos, sin, layout="bshd", interleaved=interleaved, validate=False)
    expected = rotate_torch(x, cos[None, :, None], sin[None, :, None], interleaved=interleaved, inplace=False)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan], expected[~nan])
    first = got[..., 0::2] if interleaved else got[..., :16]
    assert torch.equal(first.isnan(), v.isnan()[None, :, None])  # not blind: the values went through
    finite = v.isfinite()[None, :, None] & (v.to(dtype).float().isfinite()[None, :, None])
    assert torch.equal(first[finite].float(), v.to(dtype).float()[None, :, None][finite])


@pytest.mark.parametrize("where", ["x", "out", "tables", "weight", "rstd", "positions", "table_grad"])
def test_the_cpu_entries_refuse_tensors_of_another_device(where):
    # the entries read every tensor through its pointer: a meta (or CUDA) tensor among them was a segfault (rope,
    # rmsnorm_rope) or torch's error about unallocated data (rope_table_grad)
    ext = extension.load_cpu_extension()
    x, out, rstd, w = torch.randn(1, 3, 2, 8), torch.empty(1, 3, 2, 8), torch.empty(1, 3, 2), torch.ones(8)
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(3)[None])
    cos, sin = cos[0], sin[0]
    ids = torch.arange(3).expand(1, 3)

    def meta(t, name):
        return t.to("meta") if name == where else t

    with pytest.raises(RuntimeError, match="rotary: .*CPU"):
        if where in ("weight", "rstd"):
            ext.rmsnorm_rope(
                [x], [out], [meta(rstd, "rstd")], [meta(w, "weight")], [cos], [sin], None, 0, False, True, 1e-6, None
            )
        elif where == "table_grad":
            gcos = torch.empty(1, 3, 8, device="meta")
            ext.rope_table_grad([x], [out], [cos], [sin], [gcos], [torch.empty(1, 3, 8)], False, False)
        else:
            tables = (meta(cos, "tables"), meta(sin, "tables"))
            ext.rope(
                [meta(x, "x")],
                [meta(out, "out")],
                [tables[0]],
                [tables[1]],
                meta(ids, "positions"),
                0,
                False,
                False,
                None,
            )
