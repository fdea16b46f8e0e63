"""Plans per call signature (rotary.plans): a recorded plan's call is bit-identical to the general path for
every position form and table form it takes, and any change of the signature between two calls on one module
gets the general path's answer or its error."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from helpers import hf_frequencies
from rotary import plans, reference
from rotary import positions as P
from rotary.kernels import extension
from variant_checks import assert_close, largest_angle, to_bhsd


@pytest.fixture(scope="module", autouse=True)
def _extension_built():
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()


@pytest.fixture
def replays(monkeypatch):
    """The tensors of every call a recorded plan ran (``rotary.rotation.run_plan``)."""
    from rotary import rotation

    calls = []
    real = rotation.run_plan

    def counting(plan, xs, *args):
        outs = real(plan, xs, *args)
        if outs:  # (empty: another signature, left to the general path)
            calls.append(len(xs))
        return outs

    monkeypatch.setattr(rotation, "run_plan", counting)
    return calls


def general(f, *args, **kwargs):
    """``f``'s result on the general path (plans off)."""
    with plans.general_path():
        return f(*args, **kwargs)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq_len=st.integers(1, 5),
    kv_heads=st.integers(1, 2),
    groups=st.integers(1, 3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    layout=st.sampled_from(["bhsd", "bshd"]),
    interleaved=st.booleans(),
    partial=st.booleans(),
    form=st.sampled_from(["offset", "ids_1d", "ids_2d", "ids_row", "arange"]),
    inplace=st.booleans(),
    start=st.integers(0, 5000),
    seed=st.integers(0, 2**16),
)
def test_a_plan_is_bit_identical_to_the_general_path(
    batch, seq_len, kv_heads, groups, dtype, layout, interleaved, partial, form, inplace, start, seed
):
    g = torch.Generator().manual_seed(seed)
    rope = rotary.RoPE(64, rotary_dim=32 if partial else 64, interleaved=interleaved, max_position=2048)
    shape = (lambda h: (batch, h, seq_len, 64)) if layout == "bhsd" else (lambda h: (batch, seq_len, h, 64))
    q = torch.randn(shape(kv_heads * groups), generator=g).to(dtype)
    k = torch.randn(shape(kv_heads), generator=g).to(dtype)
    ids = torch.randint(0, 6000, (batch, seq_len), generator=g)
    kwargs: dict = {"layout": layout, "inplace": inplace}
    if form == "offset":
        kwargs["offset"] = start
    elif form == "ids_1d":
        kwargs["position_ids"] = ids[0]
    elif form == "ids_2d":
        kwargs["position_ids"] = ids
    elif form == "ids_row":
        kwargs["position_ids"] = ids[:1]
    else:
        kwargs["position_ids"] = P.arange(seq_len, offset=start)
    expected = general(rope, q.clone(), k.clone(), **kwargs)
    # the general path's answer is the float64 reference rotation at each token's position (the oracle; q's, k
    # takes the same tables), with transformers' default frequencies restated (docs/core.md: bit-identical)
    rows = {"ids_1d": ids[:1], "ids_2d": ids, "ids_row": ids[:1]}.get(form, torch.arange(start, start + seq_len)[None])
    inv_freq = hf_frequencies({"rope_type": "default"}, 10000.0, 32 if partial else 64)[0]
    x, out = to_bhsd(q, layout), to_bhsd(expected[0], layout)
    want = torch.empty(x.shape, dtype=torch.float64)
    for b in range(batch):
        want[b] = reference.rotate_complex(x[b], rows[min(b, len(rows) - 1)], inv_freq, interleaved=interleaved)
    assert_close(out, want, x, largest_angle(rows[..., None].double(), inv_freq[None]))
    rope(q.clone(), k.clone(), **kwargs)  # records the plan
    q_in, k_in = q.clone(), k.clone()
    got = rope(q_in, k_in, **kwargs)
    for e, o, x in zip(expected, got, (q_in, k_in)):
        assert torch.equal(e, o) and e.dtype == o.dtype and e.shape == o.shape
        assert (o is x) == inplace
        assert o.stride() == e.stride()


def test_a_plan_reaches_the_kernel_at_the_decode_shape_and_equals_hugging_face(replays):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rope = rotary.RoPE(128, max_position=8192)
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 1, 128)
    ids = torch.tensor([[4096]])
    expected = apply_rotary_pos_emb(q, k, *rope.cos_sin(ids))
    tables = rope.tables(ids)
    for call in (
        lambda: rope(q, k, offset=4096),
        lambda: rope(q, k, position_ids=ids),
        lambda: rotary.rotate([q, k], tables),
    ):
        call()  # records
        before = len(replays)
        got = call()
        assert len(replays) == before + 1
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_positions_past_the_plan_s_table_are_rotated_as_the_general_path_does(replays):
    rope = rotary.RoPE(64, max_position=64)
    q, k = torch.randn(1, 4, 2, 64), torch.randn(1, 2, 2, 64)
    rope(q, k)
    rope(q, k, offset=100)  # past the table: the general path grows it, and records a plan with it
    assert torch.equal(rope(q, k, offset=100)[0], general(rope, q, k, offset=100)[0])
    ids = torch.tensor([0, 1])
    rope(q, k, position_ids=ids)
    for far in (torch.tensor([1000, 70000]), torch.tensor([-5, 2**40])):  # the kernel computes these rows
        before = len(replays)
        got = rope(q, k, position_ids=far)
        assert len(replays) == before + 1
        want = rotary.reference.rotate_complex(q.double(), far, rope.inv_freq)
        assert float((got[0].double() - want).abs().max()) < 1e-4
        assert torch.equal(got[0], general(rope, q, k, position_ids=far)[0])
    with pytest.raises(ValueError, match="offset must be"):
        rope(q, k, offset=-1)
    with pytest.raises(ValueError, match="each give positions"):
        rope(q, k, position_ids=ids, offset=3)


def _call(rope, q, k, **kwargs):
    try:
        return rope(q, k, **kwargs)
    except (ValueError, TypeError, RuntimeError) as error:
        return type(error), str(error)


def _same(a, b, strides=True):
    if isinstance(a, tuple) and isinstance(a[0], type):
        return a == b
    return all(torch.equal(x, y) and (not strides or x.stride() == y.stride()) for x, y in zip(a, b))


def test_each_change_of_the_signature_between_two_calls_gets_the_general_path_s_answer():
    rope = rotary.RoPE(64, max_position=64)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 8, 3, 64, generator=g)
    q, k = base[:, :6], base[:, 6:]
    qkv = torch.randn(2, 3, 12, 64, generator=g)
    with torch.inference_mode():
        inference_q = torch.randn(2, 6, 3, 64)
    leaf = torch.randn(2, 6, 3, 64, requires_grad=True)
    changes = {
        "shape": lambda: (torch.randn(2, 6, 4, 64), torch.randn(2, 2, 4, 64)),
        "strides": lambda: (q.transpose(1, 2).contiguous().transpose(1, 2), k),
        "storage offset": lambda: (torch.randn(50000)[7 : 7 + q.numel()].view(q.shape), k.clone()),
        "dtype": lambda: (q.bfloat16(), k.bfloat16()),
        "another dtype for k": lambda: (q, k.half()),
        "layout": lambda: (q.transpose(1, 2), k.transpose(1, 2)),
        "views of one qkv": lambda: (qkv[:, :, :6].transpose(1, 2), qkv[:, :, 6:8].transpose(1, 2)),
        "in place, overlapping q and k": lambda: (base[:, :6], base[:, 4:6]),
        "in place, the same tensor": lambda: (q.clone(), None),
        "grad mode": lambda: (leaf, k),
        "inference tensor": lambda: (inference_q, k),
        "head_dim": lambda: (q[..., :32], k[..., :32]),
    }
    layouts = {"layout": "bshd", "views of one qkv": "bhsd"}
    for inplace in (False, True):
        for name, make in changes.items():
            a, b = make()
            b = a if b is None else b
            kwargs = {"offset": 5, "inplace": inplace, "layout": layouts.get(name, "bhsd")}
            first = (q.clone(), k.clone())
            _call(rope, *first, offset=5, inplace=inplace)  # records a plan for the first signature
            _call(rope, *(t.clone() for t in first), offset=5, inplace=inplace)  # and runs it
            want = general(_call, rope, *(t.clone() if isinstance(t, torch.Tensor) else t for t in (a, b)), **kwargs)
            got = _call(rope, *(t.clone() for t in (a, b)), **kwargs) if not inplace else None
            if inplace:  # in place the tensors themselves matter (overlap): the same ones on both paths
                saved = a.detach().clone(), b.detach().clone()
                want = general(_call, rope, a, b, **kwargs)
                if not isinstance(want[0], type):
                    want = tuple(t.detach().clone() for t in want)
                with torch.no_grad():
                    a.detach().copy_(saved[0]), b.detach().copy_(saved[1])
                got = _call(rope, a, b, **kwargs)
            assert _same(want, got, strides=not inplace), (
                name,
                inplace,
                want if isinstance(want[0], type) else "tensors",
            )
    # grad mode and inference mode themselves, with the same tensors
    x, y = q.clone(), k.clone()
    rope(x, y, offset=5)
    with torch.no_grad():
        assert _same(rope(x, y, offset=5), general(rope, x, y, offset=5))
    with torch.inference_mode():
        assert _same(rope(x, y, offset=5), general(rope, x, y, offset=5))
    # the frequency buffer edited in place: the general path's error
    rope.inv_freq.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        rope(x, y, offset=5)


def test_a_table_edited_in_place_is_read_again_by_the_plan():
    rope = rotary.RoPE(64)
    q, k = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 3, 64)
    cos, sin = rope.cos_sin(torch.arange(3))
    tables = rotary.RotaryTables.from_tensors(cos, sin, interleaved=False)
    rotary.rotate([q, k], tables)
    rotary.rotate([q, k], tables)
    cos[1].neg_()
    sin[1].neg_()  # a rotation by -θ at position 1
    got = rotary.rotate([q, k], tables)
    assert torch.equal(got[0], general(rotary.rotate, [q, k], tables)[0])


@pytest.mark.parametrize("form", ["shared", "indexed_1d", "indexed_2d", "per_token", "per_token_batch_1"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("inplace", [False, True])
def test_rotate_with_upstream_tables_records_a_plan_bit_identical_to_the_general_path(form, layout, inplace, replays):
    rope = rotary.RoPE(64, rotary_dim=48, max_position=8192)
    g = torch.Generator().manual_seed(0)
    shape = (lambda h: (2, h, 3, 64)) if layout == "bhsd" else (lambda h: (2, 3, h, 64))
    q, k = torch.randn(shape(8), generator=g), torch.randn(shape(2), generator=g)
    ids = torch.randint(0, 5000, (2, 3), generator=g)
    if form.startswith("per_token"):  # Hugging Face's [B, S, r] tables (rotary.hf.patch), or [1, S, r]
        cos, sin = rope.cos_sin(ids[:1] if form == "per_token_batch_1" else ids)
        tables = rotary.RotaryTables.from_tensors(cos, sin, interleaved=False)
    else:
        positions = {"shared": P.arange(3, offset=4000), "indexed_1d": ids[0], "indexed_2d": ids}[form]
        tables = rope.tables(positions)
    args = dict(layout=layout, inplace=inplace, kinds=("q", "k"))
    rotary.rotate([q.clone(), k.clone()], tables, **args)
    before = len(replays)
    got = rotary.rotate([q.clone(), k.clone()], tables, **args)
    assert len(replays) == before + 1
    expected = general(rotary.rotate, [q.clone(), k.clone()], tables, **args)
    for e, o in zip(expected, got):
        assert torch.equal(e, o) and o.stride() == e.stride()


def test_rotate_leaves_mismatches_to_the_general_path_s_messages():
    rope = rotary.RoPE(64)
    q, k = torch.randn(1, 4, 3, 64), torch.randn(1, 2, 3, 64)
    rotary.rotate([q, k], rope.tables(P.arange(3)))
    rotary.rotate([q, k], rope.tables(P.arange(3)))
    per_token = rotary.RotaryTables.from_tensors(*rope.cos_sin(torch.zeros(2, 3, dtype=torch.long)), interleaved=False)
    with pytest.raises(ValueError, match="cos/sin have batch 2 but x has batch 1"):
        rotary.rotate([q, k], per_token)
    with pytest.raises(ValueError, match="cover S=2 positions but"):
        rotary.rotate([q, k], rope.tables(P.arange(2)))
    with pytest.raises(ValueError, match="kinds must give"):
        rotary.rotate([q, k], rope.tables(P.arange(3)), kinds=("q", "v"))
    with pytest.raises(TypeError, match="inplace must be"):
        rotary.rotate([q, k], rope.tables(P.arange(3)), inplace=1)


def test_the_plan_cache_is_bounded():
    cache = plans.PlanCache(limit=3)
    for i in range(10):
        cache.put(i, plans.GENERAL)
    assert len(cache) == 3 and cache.get(9) is plans.GENERAL and cache.get(0) is None


def test_caller_tables_are_checked_once_per_table_and_again_after_an_edit(monkeypatch):
    from rotary import table_checks

    checked = []
    real = table_checks.check_rows
    monkeypatch.setattr(rotary.tables, "check_rows", lambda *a: checked.append(1) or real(*a))
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4)[None])  # per-token [1, S, r], as Hugging Face hands them
    q = torch.randn(1, 2, 4, 8)
    for _ in range(3):
        rotary.apply_rotary(q, cos, sin)
    assert len(checked) == 1  # the same tensors, unchanged: checked once
    good = cos.clone()
    cos[0, 2, 0] = float("nan")  # an in-place edit moves the version counter: checked again, and named
    with pytest.raises(ValueError, match="NaN"):
        rotary.apply_rotary(q, cos, sin)
    rotary.apply_rotary(q, good, sin.clone())  # new tensors (perhaps at a freed one's address): checked
    assert len(checked) == 3


# rmsnorm_rotate (rotary.qk_norm): the same design, with the norm weights in the signature ------------------


@pytest.fixture
def norm_replays(monkeypatch):
    """One entry per rmsnorm_rotate call a recorded plan ran (``rotary.qk_norm._run_plan``)."""
    from rotary import qk_norm

    calls = []
    real = qk_norm._run_plan

    def counting(*args):
        outs = real(*args)
        if outs:
            calls.append(1)
        return outs

    monkeypatch.setattr(qk_norm, "_run_plan", counting)
    return calls


def _model_tables(rope, ids, dtype):
    """Hugging Face's per-token tables in the model's dtype, as ``hf.patch`` hands them to rmsnorm_rotate."""
    cos, sin = rope.cos_sin(ids)
    return rotary.RotaryTables.unchecked(cos.to(dtype), sin.to(dtype), False)


@pytest.mark.parametrize("form", ["model_tables", "offset", "position_ids", "far_ids"])
@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_an_rmsnorm_rotate_plan_is_bit_identical_to_the_general_path(form, style, dtype, norm_replays):
    rope = rotary.RoPE(64, rotary_dim=48, max_position=64)
    g = torch.Generator().manual_seed(1)
    layout = "bshd" if form == "offset" else "bhsd"
    shape = (lambda h: (2, 3, h, 64)) if layout == "bshd" else (lambda h: (2, h, 3, 64))
    q, k = torch.randn(shape(8), generator=g).to(dtype), torch.randn(shape(2), generator=g).to(dtype)
    wq, wk = torch.rand(64, generator=g).to(dtype), torch.rand(64, generator=g)  # the weight's dtype or fp32
    if form == "far_ids":  # a weight that is a strided view, read in place or widened by the plan's call
        wq = torch.rand(128, generator=g).to(dtype)[::2]
    wk = torch.nn.Parameter(wk, requires_grad=False)  # a model's norm weight (hf.patch passes the Parameter)
    ids = torch.tensor([[3, 9, 40], [0, 1, 2]])
    kwargs: dict = {"style": style, "layout": layout}
    if form == "model_tables":
        source = _model_tables(rope, ids, torch.float32 if dtype == torch.float64 else dtype)
    else:
        source = rope
        kwargs.update(
            {"offset": {"offset": 17}, "position_ids": {"position_ids": ids}, "far_ids": {"position_ids": ids * 1000}}[
                form
            ]
        )
    expected = general(rotary.rmsnorm_rotate, q, k, wq, wk, source, **kwargs)
    rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs)  # records
    before = len(norm_replays)
    got = rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs)
    assert len(norm_replays) == before + 1
    for e, o in zip(expected, got):
        assert torch.equal(e, o) and o.dtype == e.dtype and o.stride() == e.stride()


@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_that_is_a_negative_view_gets_the_general_path_s_answer(style, dtype, norm_replays):
    # z.conj().imag is a view of z's imaginary parts with torch's negative bit set: its values are -storage. It
    # has the signature of any weight of its strides and storage offset; a plan's call that read the storage
    # (rmsnorm_direct widening a strided weight) rotated with the weight's negation
    rope = rotary.RoPE(64, max_position=64)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 4, 3, 64, generator=g).to(dtype), torch.randn(2, 2, 3, 64, generator=g).to(dtype)
    w = torch.rand(64, generator=g)
    negative = torch.complex(torch.zeros(64), -w).conj().imag  # values w, stored as -w
    plain = torch.zeros(129)[1::2]  # the same strides and storage offset, no negative bit
    plain.copy_(w)
    assert negative.is_neg() and torch.equal(negative, w) and negative.stride() == plain.stride()
    assert negative.storage_offset() == plain.storage_offset()
    rotary.rmsnorm_rotate(q, k, plain, w, rope, offset=5, style=style)  # records
    before = len(norm_replays)
    got = rotary.rmsnorm_rotate(q, k, negative, w, rope, offset=5, style=style)
    assert len(norm_replays) == before + 1  # the plan took the call
    assert _same(got, general(rotary.rmsnorm_rotate, q, k, w.clone(), w, rope, offset=5, style=style))


def test_16_bit_model_tables_that_are_a_negative_view_get_the_general_path_s_answer(norm_replays):
    # a plan's call widens a 16-bit model's per-token tables from their storage (rmsnorm_direct): one with the
    # negative bit (fp16 complex32's conj().imag) must be read as its values, as the general path reads it
    rope = rotary.RoPE(64, max_position=64)
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, 4, 3, 64, generator=g).half(), torch.randn(1, 2, 3, 64, generator=g).half()
    wq, wk = torch.rand(64, generator=g), torch.rand(64, generator=g)
    cos, sin = (t.half() for t in rope.cos_sin(torch.tensor([[2, 5, 9]])))
    pairs = torch.stack([torch.zeros_like(sin), -sin], -1)  # [1, 3, 64, 2]: imaginary parts -sin
    negative = torch.view_as_complex(pairs).conj().imag  # values sin, stored as -sin
    plain = torch.zeros_like(pairs)[..., 1]  # the same strides and storage offset, no negative bit
    plain.copy_(sin)
    assert negative.is_neg() and torch.equal(negative, sin) and negative.stride() == plain.stride()
    strided_cos = torch.zeros_like(pairs)[..., 1]
    strided_cos.copy_(cos)
    tables = rotary.RotaryTables.unchecked(strided_cos, plain, False)
    rotary.rmsnorm_rotate(q, k, wq, wk, tables)  # records
    before = len(norm_replays)
    got = rotary.rmsnorm_rotate(q, k, wq, wk, rotary.RotaryTables.unchecked(strided_cos, negative, False))
    assert len(norm_replays) == before + 1  # the plan took the call
    want = general(rotary.rmsnorm_rotate, q, k, wq, wk, rotary.RotaryTables.unchecked(cos, sin, False))
    assert _same(got, want)


def _norm_call(q, k, wq, wk, source, **kwargs):
    try:
        return rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs)
    except (ValueError, TypeError, RuntimeError) as error:
        return type(error), str(error)


def test_each_change_of_an_rmsnorm_rotate_signature_gets_the_general_path_s_answer(norm_replays):
    rope = rotary.RoPE(64, max_position=64)
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 6, 3, 64, generator=g), torch.randn(2, 2, 3, 64, generator=g)
    wq, wk = torch.rand(64, generator=g), torch.rand(64, generator=g)
    qkv = torch.randn(2, 3, 12, 64, generator=g)
    with torch.inference_mode():
        inference_q = torch.randn(2, 6, 3, 64)
    leaf = torch.randn(2, 6, 3, 64, requires_grad=True)
    changes = {  # name -> (q, k, q_weight, k_weight, layout)
        "shape": lambda: (torch.randn(2, 6, 4, 64), torch.randn(2, 2, 4, 64), wq, wk, "bhsd"),
        "strides": lambda: (q.transpose(1, 2).contiguous().transpose(1, 2), k, wq, wk, "bhsd"),
        "storage offset": lambda: (torch.randn(50000)[7 : 7 + q.numel()].view(q.shape), k, wq, wk, "bhsd"),
        "dtype": lambda: (q.bfloat16(), k.bfloat16(), wq, wk, "bhsd"),
        "another dtype for k": lambda: (q, k.half(), wq, wk, "bhsd"),
        "weight dtype": lambda: (q, k, wq.half(), wk, "bhsd"),
        "weight shape": lambda: (q, k, torch.rand(128), wk, "bhsd"),
        "layout": lambda: (q.transpose(1, 2), k.transpose(1, 2), wq, wk, "bshd"),
        "views of one qkv, overlapping q and k": lambda: (
            qkv[:, :, :6].transpose(1, 2),
            qkv[:, :, 4:6].transpose(1, 2),
            wq,
            wk,
            "bhsd",
        ),
        "no unit channel stride": lambda: (q.transpose(2, 3).contiguous().transpose(2, 3), k, wq, wk, "bhsd"),
        "grad mode": lambda: (leaf, k, wq, wk, "bhsd"),
        "a weight that requires grad": lambda: (q, k, wq.clone().requires_grad_(), wk, "bhsd"),
        "inference tensor": lambda: (inference_q, k, wq, wk, "bhsd"),
        "head_dim": lambda: (q[..., :32], k[..., :32], wq[:32], wk[:32], "bhsd"),
    }
    ids = torch.tensor([[0, 1, 2], [5, 6, 7]])
    for form in ("rope", "tables"):
        for name, make in changes.items():
            a, b, w1, w2, layout = make()
            source = rope if form == "rope" else _model_tables(rope, ids, torch.float32)
            kwargs = {"offset": 5} if form == "rope" else {}
            _norm_call(q, k, wq, wk, source, **kwargs)  # records a plan for the first signature
            before = len(norm_replays)
            _norm_call(q, k, wq, wk, source, **kwargs)  # and runs it
            assert len(norm_replays) == before + 1, (form, name)
            want = general(_norm_call, a, b, w1, w2, source, layout=layout, **kwargs)
            got = _norm_call(a, b, w1, w2, source, layout=layout, **kwargs)
            assert _same(want, got), (form, name, want if isinstance(want[0], type) else "tensors")
            if not isinstance(got[0], type) and got[0].requires_grad:  # autograd: the general path's gradients
                got[0].sum().backward()
    # grad mode and inference mode themselves, with the same tensors
    for source, kwargs in ((rope, {"offset": 5}), (_model_tables(rope, ids, torch.float32), {})):
        rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs)
        for mode in (torch.no_grad, torch.inference_mode, torch.enable_grad):
            with mode():
                assert _same(
                    rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs),
                    general(rotary.rmsnorm_rotate, q, k, wq, wk, source, **kwargs),
                )
    # eps and the style (the key's values) changed after a plan was recorded
    for source, kwargs in ((rope, {"offset": 5}), (_model_tables(rope, ids, torch.float32), {})):
        rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs)
        for extra in ({"eps": 0.5}, {"style": "gemma3"}, {"style": "gemma3", "eps": 0.25}):
            got = rotary.rmsnorm_rotate(q, k, wq, wk, source, **kwargs, **extra)
            assert _same(got, general(rotary.rmsnorm_rotate, q, k, wq, wk, source, **kwargs, **extra)), extra
    # the model's table edited in place: read again by the plan
    tables = _model_tables(rope, ids, torch.float32)
    rotary.rmsnorm_rotate(q, k, wq, wk, tables)
    tables.cos[1].neg_()
    before = len(norm_replays)
    got = rotary.rmsnorm_rotate(q, k, wq, wk, tables)
    assert len(norm_replays) == before + 1 and _same(got, general(rotary.rmsnorm_rotate, q, k, wq, wk, tables))
    # a weight edited in place (training): read again
    wq.mul_(3)
    assert _same(
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=5),
        general(rotary.rmsnorm_rotate, q, k, wq, wk, rope, offset=5),
    )
    # the errors the general path names, after a plan was recorded
    with pytest.raises(ValueError, match="eps must be"):
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=5, eps=-1.0)
    with pytest.raises(ValueError, match="offset must be"):
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=-1)
    with pytest.raises(ValueError, match="already say where each token is"):
        rotary.rmsnorm_rotate(q, k, wq, wk, tables, offset=5)
    # the frequency buffer edited in place: the general path's error
    rope.inv_freq.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=5)


# rotate_and_cache (rotary.serving): the one-pass kernel's call replayed from the signature -------------------


@pytest.fixture
def cache_replays(monkeypatch):
    """The status of every rotate_and_cache call a recorded plan handed to the kernel (``[-1]``: another signature)."""
    ext = extension.load_cpu_extension()

    class Counting:
        def __getattr__(self, name):
            return getattr(ext, name)

        def rope_cache_plan(self, *args):
            status, outs = ext.rope_cache_plan(*args)
            calls.append(list(status))
            return status, outs

    calls = []
    monkeypatch.setattr(rotary.serving, "load_cpu_extension", lambda: Counting())
    return calls


def _cache_call(q, k, v, k_cache, v_cache, slots, **kwargs):
    """``rotate_and_cache``'s outputs and the caches it wrote, or its error."""
    try:
        out = rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, **kwargs)
    except (ValueError, TypeError, RuntimeError) as error:
        return type(error), str(error)
    return (*out, k_cache, v_cache)


def test_each_change_of_a_rotate_and_cache_signature_gets_the_general_path_s_answer(cache_replays):
    rope = rotary.RoPE(16)
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([[3, 4], [7, 8]])
    half = rope.cos_sin(torch.arange(32))
    cos_sin_cache = torch.cat((half[0][:, :8], half[1][:, :8]), dim=-1)
    forms = {
        "tables": lambda: {"tables": rope.tables(ids)},
        "model tables": lambda: {"tables": rotary.RotaryTables.from_tensors(*rope.cos_sin(ids), interleaved=False)},
        "cos_sin_cache": lambda: {"positions": ids, "cos_sin_cache": cos_sin_cache},
    }
    q, k, v = (torch.randn(2, 2, h, 16, generator=g) for h in (4, 2, 2))  # [B, S, H, D]
    qkv = torch.randn(2, 2, 8, 16, generator=g)
    with torch.inference_mode():
        inference_k = torch.randn(2, 2, 2, 16)
    leaf = torch.randn(2, 2, 2, 16, requires_grad=True)
    slots = torch.tensor([[0, 1], [5, 6]])
    caches = lambda dtype=torch.float32: [torch.zeros(2, 8, 2, 16, dtype=dtype) for _ in range(2)]  # noqa: E731
    changes = {  # name -> (q, k, v, k_cache, v_cache, slots, extra keyword arguments)
        "shape": lambda: (q[:, :1], k[:, :1], v[:, :1], *caches(), slots[:, :1], {}),
        "strides": lambda: (q.transpose(1, 2).contiguous().transpose(1, 2), k, v, *caches(), slots, {}),
        "storage offset": lambda: (torch.randn(9000)[5 : 5 + q.numel()].view(q.shape), k, v, *caches(), slots, {}),
        "dtype": lambda: (q.bfloat16(), k.bfloat16(), v.bfloat16(), *caches(torch.bfloat16), slots, {}),
        "cache dtype": lambda: (q, k, v, *caches(torch.bfloat16), slots, {}),
        "layout": lambda: (
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            *caches(),
            slots,
            {"layout": "bhsd"},
        ),
        "in place, q, k and v views of one qkv": lambda: (
            qkv[:, :, :4],
            qkv[:, :, 4:6],
            qkv[:, :, 6:],
            *caches(),
            slots,
            {"inplace": True},
        ),
        "in place, overlapping q and k": lambda: (
            qkv[:, :, :4],
            qkv[:, :, 2:4],
            v,
            *caches(),
            slots,
            {"inplace": True},
        ),
        "in place, v is k": lambda: (q, k, k, *caches(), slots, {"inplace": True}),
        "caches sharing memory": lambda: (
            q,
            k,
            v,
            (big := torch.zeros(2, 8, 4, 16))[:, :, :2],
            big[:, :, 1:3],
            slots,
            {},
        ),
        "grad mode": lambda: (q, leaf, v, *caches(), slots, {}),
        "inference tensor": lambda: (q, k, v, *caches(), slots, {"inplace": True, "_k": inference_k}),
        "slots outside the cache": lambda: (q, k, v, *caches(), torch.tensor([[0, 1], [5, 8]]), {}),
        "two tokens, one row": lambda: (q, k, v, *caches(), torch.tensor([[0, 0], [5, 6]]), {}),
    }
    for form, make_tables in forms.items():
        for name, make in changes.items():
            a, b, c, kc, vc, s, extra = make()
            if "_k" in extra:
                b = extra.pop("_k")
            kwargs = {**make_tables(), **extra}
            first = (q.clone(), k.clone(), v.clone(), *caches(), slots)
            _cache_call(*first, **make_tables(), inplace=extra.get("inplace", False))  # records a plan
            before = len(cache_replays)
            _cache_call(*(t.clone() for t in first), **make_tables(), inplace=extra.get("inplace", False))  # runs it
            assert cache_replays[before:] == [[]], (form, name)
            tensors = (a, b, c, kc, vc)
            saved = [t.detach().clone() for t in tensors]
            want = general(_cache_call, *tensors, s, **kwargs)
            if not isinstance(want[0], type):
                want = tuple(t.detach().clone() for t in want)
            with torch.no_grad():
                for t, value in zip(tensors, saved):
                    if not t.is_inference():  # (an inference tensor is refused before anything is written)
                        t.detach().copy_(value)
            got = _cache_call(*tensors, s, **kwargs)
            assert _same(want, got, strides=False), (form, name, want if isinstance(want[0], type) else "tensors")
    # inference mode and grad mode themselves, and a table edited in place, with the same tensors
    for form, make_tables in forms.items():
        kwargs = make_tables()
        for mode in (torch.no_grad, torch.inference_mode, torch.enable_grad):
            with mode():
                kc, vc = caches()
                got = _cache_call(q, k, v, kc, vc, slots, **kwargs)
                want = general(_cache_call, q, k, v, *caches(), slots, **kwargs)
                assert _same(want, got), (form, mode)
        # the row token (1, 0) reads, edited in place: a rotation by -θ there
        row = (
            kwargs["cos_sin_cache"][7]
            if "cos_sin_cache" in kwargs
            else kwargs["tables"].cos[(7,) if form == "tables" else (1, 0)]
        )
        row.neg_()
        before = len(cache_replays)
        got = _cache_call(q, k, v, *caches(), slots, **kwargs)
        assert cache_replays[before:] == [[]], form
        assert _same(got, general(_cache_call, q, k, v, *caches(), slots, **kwargs))
        row.neg_()
    # NaN in a cos_sin_cache row a token reads, after a plan was recorded: the general path's error
    cos_sin_cache[7, 0] = float("nan")
    want = general(_cache_call, q, k, v, *caches(), slots, **forms["cos_sin_cache"]())
    assert isinstance(want[0], type) and "cos_sin_cache row 7" in want[1]
    assert _same(want, _cache_call(q, k, v, *caches(), slots, **forms["cos_sin_cache"]()))
