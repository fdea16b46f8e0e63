"""RoPE (rope.py, rope_tables.py) as an nn.Module: dtype safety, autograd, torch.compile, the read-only
inv_freq, its argument checks, threads sharing one RoPE, and arbitrary input to RoPE.rotate."""

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from helpers import hf_frequencies, outputs_from_threads
from rotary import reference
from strategies import DTYPES
from variant_checks import expect


def test_to_bfloat16_keeps_inv_freq_and_tables_fp32(gen):
    rope = rotary.RoPE(128, base=500000.0)
    want_inv = rope.inv_freq.clone()
    want_cos, _ = rope.cos_sin(torch.arange(8192))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), rope).to(torch.bfloat16)
    assert model[0].weight.dtype == torch.bfloat16  # the rest of the model did move
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, want_inv)
    cos, _ = rope.cos_sin(torch.arange(8192))
    assert cos.dtype == torch.float32 and torch.equal(cos, want_cos)
    rope.half().double()
    assert torch.equal(rope.inv_freq, want_inv)
    q = torch.randn(1, 2, 8, 128, generator=gen).to(torch.bfloat16)
    assert rope.rotate(q).dtype == torch.bfloat16


def test_state_dict_has_no_tables():
    # inv_freq is derived from the config; checkpoints must not pin (or override) it
    assert rotary.RoPE(16).state_dict() == {}


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_float64(interleaved, gen):
    rope = rotary.RoPE(8, rotary_dim=6, interleaved=interleaved)
    q = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: rope(q, k, offset=3), (q, k))
    cos, sin = rope.cos_sin(torch.tensor([[1, 2, 3, 4, 9]]))
    assert torch.autograd.gradcheck(
        lambda x: rotary.apply_rotary(x, cos, sin, interleaved=interleaved, layout="bshd"), (q.transpose(1, 2),)
    )


def test_backward_is_rotation_by_minus_theta(gen):
    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 7, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(1, 2, 7, 16, generator=gen, dtype=torch.float64)
    rope.rotate(q, offset=4).backward(upstream)
    # R(θ)ᵀ = R(-θ): rotating the upstream gradient back to position 0 from position p
    cos, sin = rope.cos_sin(torch.arange(4, 11))
    want = rotary.apply_rotary(upstream, cos, -sin)
    assert torch.allclose(q.grad, want, atol=1e-12)


def test_torch_compile_fullgraph(gen):
    rope = rotary.RoPE(32, rotary_dim=16)

    def step(q, k):
        q, k = rope(q, k, offset=5)
        return (q @ k.transpose(-1, -2)).softmax(-1)

    q = torch.randn(1, 4, 12, 32, generator=gen)
    k = torch.randn(1, 4, 12, 32, generator=gen)
    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert torch.allclose(compiled(q, k), step(q, k), atol=1e-6)

    def with_positions(q, k, position_ids):
        return rope(q, k, position_ids=position_ids)

    pos = torch.arange(12).view(1, 12) + 100
    compiled = torch.compile(with_positions, fullgraph=True, backend="eager")
    for got, want in zip(compiled(q, k, pos), with_positions(q, k, pos)):
        assert torch.equal(got, want)


@pytest.mark.slow
def test_torch_compile_inductor_matches_eager(gen):
    rope = rotary.RoPE(32)
    q, k = torch.randn(2, 4, 16, 32, generator=gen), torch.randn(2, 4, 16, 32, generator=gen)
    compiled = torch.compile(lambda q, k: rope(q, k, offset=7), fullgraph=True)
    for got, want in zip(compiled(q, k), rope(q, k, offset=7)):
        assert torch.allclose(got, want, atol=1e-6)


def test_max_position_validation():
    with pytest.raises(ValueError, match="max_position must be a positive int, got 0"):
        rotary.RoPE(8, max_position=0)


def test_a_max_position_whose_tables_do_not_fit_is_refused_before_allocating(gen):
    """issue 24: RoPE(64, max_position=2**40) then a call was torch's allocator error (8 TiB)."""
    with pytest.raises(
        ValueError,
        match=r"RoPE\(max_position=1099511627776\) with rotary_dim=64: its cos/sin table cache, built on the first "
        r"call, would need 512.0 TiB, more than the limit of 4.0 GiB; use max_position <= 8388608 \(it is the length "
        r"of the table cache, not a limit on positions",
    ):
        rotary.RoPE(64, max_position=2**40)
    with pytest.raises(ValueError, match=r"max_position=8388609\) with rotary_dim=64"):
        rotary.RoPE(64, max_position=8388609)
    with pytest.raises(ValueError, match=r"rotary_dim=128: .*use max_position <= 4194304 "):
        rotary.RoPE(256, rotary_dim=128, max_position=4194305)
    # the largest that fits is accepted (nothing is built before a call)
    assert rotary.RoPE(64, max_position=8388608).max_position == 8388608
    # learnable frequencies never cache tables: max_position builds nothing, and positions far out still work
    rope = rotary.RoPE(64, max_position=2**40, learnable_frequencies=True)
    q = torch.randn(1, 2, 3, 64, generator=gen)
    far = torch.tensor([0, 2**39, 2**40 + 5])
    torch.testing.assert_close(rope.rotate(q, position_ids=far), rotary.RoPE(64).rotate(q, position_ids=far))


def test_repr_names_configuration():
    text = repr(rotary.RoPE(64, rotary_dim=32, base=500000.0, interleaved=True))
    assert "rotary_dim=32" in text and "base=500000" in text and "interleaved=True" in text


def test_editing_the_inv_freq_buffer_cannot_make_paths_disagree(gen):
    # inv_freq mirrors the frozen frequencies; every path (cached, compiled) computes from those. An edit is
    # refused (issue 24: it used to be ignored), and after .float() it used to corrupt the frozen frequencies
    # themselves (the buffer was their tensor), so that compiled calls rotated with the edit and cached ones without
    rope = rotary.RoPE(16).float()
    q = torch.randn(1, 2, 5, 16, generator=gen)
    before = rope.rotate(q, offset=3)
    want = rope.freqs.inv_freq.clone()
    with torch.no_grad():
        rope.inv_freq.mul_(0.5)
    with pytest.raises(
        RuntimeError,
        match=r"rope.inv_freq was modified in place .*the edit would be ignored; "
        r"inv_freq is read-only and has been restored. To rotate with other "
        r"frequencies build a new RoPE \(rotary.RoPE\(head_dim, base=",
    ):
        rope.rotate(q, offset=3)
    assert torch.equal(rope.inv_freq, want) and torch.equal(rope.freqs.inv_freq, want)
    compiled = torch.compile(lambda x: rope.rotate(x, offset=3), fullgraph=True, backend="eager")
    assert torch.equal(rope.rotate(q, offset=3), before)
    assert torch.allclose(compiled(q), before, atol=1e-6)


@pytest.mark.parametrize(
    "edit",
    [
        lambda rope: rope.inv_freq.mul_(0.25),
        lambda rope: rope.inv_freq[:2].zero_(),  # through a view
        lambda rope: rope.inv_freq.detach().fill_(1.0),
        lambda rope: rope.learned_inv_freq.div_(4),
        lambda rope: torch.mul(rope.inv_freq, 0.5, out=rope.inv_freq),
        lambda rope: rope.inv_freq.__setitem__(0, 2.0),
        lambda rope: torch.nn.init.ones_(rope.inv_freq),
        lambda rope: rope.register_buffer("inv_freq", torch.ones(8), persistent=False),
    ],
    ids=["mul_", "view", "detach", "learned_inv_freq", "out=", "setitem", "nn.init", "register_buffer"],
)
@pytest.mark.parametrize("call", ["forward", "decode", "cos_sin", "rotate"])
def test_an_in_place_edit_of_inv_freq_is_an_error_at_the_next_call(edit, call, gen):
    """issue 24: `rope.inv_freq /= 4` was silently ignored."""
    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 1 if call == "decode" else 5, 16, generator=gen)
    run = {
        "forward": lambda: rope(q, q),
        "decode": lambda: rope(q, q, offset=7),  # the CPU decoding fast path
        "cos_sin": lambda: rope.cos_sin(torch.arange(5)),
        "rotate": lambda: (rope.rotate(q),),
    }[call]
    want = run()
    with torch.no_grad():
        edit(rope)
    with pytest.raises(RuntimeError, match=r"rope.inv_freq was modified in place"):
        run()
    assert torch.equal(rope.inv_freq, rotary.frequencies(16).inv_freq)  # restored
    for got, expected in zip(run(), want):
        assert torch.equal(got, expected)


def test_assigning_inv_freq_is_an_attribute_error_naming_what_to_do():
    rope = rotary.RoPE(16)
    message = (
        r"rope.inv_freq is read-only: .*a new value would be ignored; to rotate with other frequencies build a new RoPE"
    )
    with pytest.raises(AttributeError, match=message):
        rope.inv_freq /= 4  # divides the buffer in place, then assigns it
    assert torch.equal(rope.inv_freq, rotary.frequencies(16).inv_freq)
    with pytest.raises(AttributeError, match=message):
        rope.inv_freq = torch.ones(8)
    assert torch.equal(rope.inv_freq, rotary.frequencies(16).inv_freq)
    q = torch.randn(1, 1, 3, 16)
    assert torch.equal(rope.rotate(q), rotary.RoPE(16).rotate(q))


def test_copies_of_inv_freq_with_the_same_values_are_not_edits(gen):
    import copy

    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 5, 16, generator=gen)
    want = rope(q, q)
    twin = copy.deepcopy(rope)
    assert torch.equal(twin(q, q)[0], want[0])
    buffers = {"inv_freq": rope.inv_freq.clone()}  # a functional call with the module's own buffers
    got = torch.func.functional_call(rope, buffers, (q, q))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with torch.no_grad():
        rope.inv_freq.mul_(1.0)  # an in-place op that changes nothing: nothing to refuse
    assert torch.equal(rope(q, q)[0], want[0])
    with pytest.raises(RuntimeError, match="modified in place"):
        torch.func.functional_call(rope, {"inv_freq": rope.inv_freq * 2}, (q, q))


def test_with_scaling_argument_checks():
    rope = rotary.RoPE(64, base=10000.0)
    with pytest.raises(TypeError, match="dict"):
        rope.with_scaling("linear")
    with pytest.raises(rotary.ConfigError, match="rope_theta"):
        rope.with_scaling({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0})
    same = rope.with_scaling({"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert torch.equal(same.inv_freq, rope.inv_freq / 2)


@pytest.fixture
def q(gen):
    return torch.randn(1, 4, 8, 64, generator=gen)


def test_offset_and_position_ids_together_is_an_error(q):
    with pytest.raises(ValueError, match="position_ids and offset=100 each give positions; pass one"):
        rotary.RoPE(64)(q, q.clone(), position_ids=torch.arange(8), offset=100)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(interleaved="false"), "interleaved must be True or False, got 'false'"),
        (dict(interleaved=1), "interleaved must be True or False, got 1"),
        (dict(strict="no"), "strict must be True or False"),
        (dict(dynamic="sometimes"), "'hf'.*'stateless'"),
        (dict(max_position=2.0), "max_position must be a positive int"),
    ],
)
def test_config_values_of_the_wrong_type(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        rotary.RoPE(64, **kwargs)


@pytest.mark.parametrize("inplace", ["yes", 1, None])
def test_inplace_must_be_a_bool_on_every_path(inplace, q):
    """The decoding fast paths (found by tests/variants/test_variants_robustness.py) check it too."""
    rope = rotary.RoPE(64)
    tables = rope.tables(torch.arange(8))
    calls = [
        lambda: rope(q, q.clone(), inplace=inplace),
        lambda: rope.rotate(q, inplace=inplace),
        lambda: rotary.rotate([q, q.clone()], tables, inplace=inplace),
        lambda: rotary.rotate([q], tables, inplace=inplace),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=f"inplace must be True or False, got {inplace!r}"):
            call()


def test_inplace_on_overlapping_views_is_refused_but_disjoint_views_work(gen):
    rope = rotary.RoPE(64)
    qkv = torch.randn(1, 8, 8, 64, generator=gen)
    with pytest.raises(ValueError, match="q and k share memory"):
        rope(qkv[:, 0:4], qkv[:, 2:6], inplace=True)
    fused = torch.randn(1, 8, 3, 4, 64, generator=gen)  # [B, S, 3, H, D]: q, k, v interleave in memory
    q, k = fused[:, :, 0], fused[:, :, 1]
    want = rope(q, k, layout="bshd")
    rope(q, k, layout="bshd", inplace=True)  # disjoint, although their extents overlap
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


def test_inplace_on_the_meta_device_tells_storages_apart():
    """Every meta storage has address 0: separate tensors are not one memory, but views of one buffer
    that share elements are still refused."""
    rope = rotary.RoPE(64)
    q, k = torch.zeros(1, 8, 8, 64, device="meta"), torch.zeros(1, 2, 8, 64, device="meta")
    q_rot, k_rot = rope(q, k, inplace=True)
    assert q_rot is q and k_rot is k
    qkv = torch.zeros(1, 8, 8, 64, device="meta")
    with pytest.raises(ValueError, match="q and k share memory"):
        rope(qkv[:, 0:4], qkv[:, 2:6], inplace=True)
    with pytest.raises(ValueError, match="q and k are the same memory"):
        rope(q, q, inplace=True)
    fused = torch.zeros(1, 8, 3, 4, 64, device="meta")  # q, k interleaved in one buffer, no element shared
    rope(fused[:, :, 0], fused[:, :, 1], layout="bshd", inplace=True)


def test_negative_positions_rotate_by_the_negative_angle_under_compile_too():
    # every integer position is a rotation (as position * inv_freq is in Hugging Face's code), compiled or not
    rope = rotary.RoPE(16)
    f = torch.compile(lambda q, p: rope(q, q, position_ids=p), backend="eager", fullgraph=True)
    q = torch.randn(1, 2, 4, 16)
    ids = torch.tensor([0, -1, 2, -300])
    want = rotary.reference.rotate_complex(q.double(), ids, rope.inv_freq)
    for out in (f(q, ids)[0], rope(q, q, position_ids=ids)[0]):
        assert float((out.double() - want).abs().max()) < 1e-5


def test_huge_positions_take_microseconds_and_no_table():
    rope = rotary.RoPE(128)
    start = time.perf_counter()
    cos, _ = rope.cos_sin(torch.tensor([2**31 - 1], dtype=torch.int32))
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 1, 128)
    for offset in (2**20, 2**22, 2**40):
        out = rope(q, k, offset=offset)[0]
        ref = rotary.reference.rotate_complex(q.double(), torch.tensor([offset]), rope.inv_freq)
        assert float((out.double() - ref).abs().max()) < 1e-5
    elapsed = time.perf_counter() - start
    assert cos.shape == (1, 128) and all(c.length <= 1 << 16 for c in rope._caches.values())
    assert elapsed < 30  # generous: a table per position would take minutes and gigabytes


def test_tables_cached_under_inference_mode_still_train():
    rope = rotary.RoPE(16)
    with torch.inference_mode():
        rope.rotate(torch.randn(1, 1, 4, 16))
    x = torch.randn(1, 1, 4, 16, requires_grad=True)
    rope.rotate(x).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize(
    "scaling, dynamic",
    [
        (None, "hf"),  # the cache grows concurrently to different lengths
        ({"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}, "stateless"),
        (
            {
                "rope_type": "longrope",
                "original_max_position_embeddings": 16,
                "factor": 4.0,
                "short_factor": [1.0 + i / 32 for i in range(8)],
                "long_factor": [1.0 + i for i in range(8)],
            },
            "hf",
        ),
    ],
)
def test_one_rope_shared_by_threads_gives_single_threaded_results(scaling, dynamic, gen, one_intraop_thread):
    lengths = [3, 40, 9, 70, 17, 5, 33, 100, 12, 64]
    inputs = [torch.randn(1, 2, n, 16, generator=gen) for n in lengths]
    offsets = [0, 7, 300, 1, 5000, 2, 90, 0, 65, 16]
    single = rotary.RoPE(16, scaling=scaling, dynamic=dynamic, max_position=4)
    want = [single(x, x, offset=o)[0] for x, o in zip(inputs, offsets)]
    shared = rotary.RoPE(16, scaling=scaling, dynamic=dynamic, max_position=4)
    got = outputs_from_threads(lambda i: shared(inputs[i], inputs[i], offset=offsets[i])[0], len(lengths), 6, True)
    for (t, rep, i), out in got.items():
        assert torch.equal(out, want[i]), (t, rep, i)


DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 16}


def test_one_hf_dynamic_ntk_rope_shared_by_threads_after_warm_up(gen, one_intraop_thread):
    """transformers' state machine (dynamic="hf") keeps the frequencies of the longest call seen; once a
    call of the longest length has run, every call between the trained length and it uses those same
    frequencies in any order, so each thread's output must equal the single-threaded one."""
    lengths = [17, 100, 40, 64, 23, 99, 16, 70]
    inputs = [torch.randn(1, 2, n, 16, generator=gen) for n in lengths]
    single = rotary.RoPE(16, scaling=DYNAMIC, max_position=4)
    single(inputs[1], inputs[1])  # warm up at the longest length
    want = [single(x, x)[0] for x in inputs]
    assert not torch.equal(want[0], rotary.RoPE(16, scaling=DYNAMIC)(inputs[0], inputs[0])[0])  # not the fresh state
    shared = rotary.RoPE(16, scaling=DYNAMIC, max_position=4)
    shared(inputs[1], inputs[1])
    got = outputs_from_threads(lambda i: shared(inputs[i], inputs[i])[0], len(lengths), 6, True)
    for (t, rep, i), out in got.items():
        assert torch.equal(out, want[i]), (t, rep, i)


def test_one_hf_dynamic_ntk_rope_shared_by_threads_with_resets(gen, one_intraop_thread):
    """Short calls reset the state and long calls grow it, concurrently: a short call must use the
    trained frequencies, and a long call of length n the frequencies of some length m >= n that a call
    asked for (what some serial order of the same calls gives), never a torn or foreign state."""
    lengths = [5, 30, 9, 60, 12, 45, 3, 80]
    inputs = [torch.randn(1, 2, n, 16, generator=gen) for n in lengths]
    trained = rotary.RoPE(16)  # dynamic NTK below its trained length is plain RoPE
    # the single-threaded result of a length-n input under the frequencies grown to length m
    candidates = {}
    for i, n in enumerate(lengths):
        for m in lengths:
            if n > 16 and m >= n:
                rope = rotary.RoPE(16, scaling=DYNAMIC)
                rope(torch.zeros(1, 1, m, 16), torch.zeros(1, 1, m, 16))
                candidates.setdefault(i, []).append(rope(inputs[i], inputs[i])[0])
    shared = rotary.RoPE(16, scaling=DYNAMIC, max_position=4)
    got = outputs_from_threads(lambda i: shared(inputs[i], inputs[i])[0], len(lengths), 6, True)
    for (t, rep, i), out in got.items():
        if lengths[i] <= 16:
            assert torch.equal(out, trained(inputs[i], inputs[i])[0]), (t, rep, i)
        else:
            assert any(torch.equal(out, c) for c in candidates[i]), (t, rep, i)


def test_a_longrope_block_edited_after_construction_changes_nothing(gen):
    scaling = {
        "rope_type": "longrope",
        "original_max_position_embeddings": 16,
        "factor": 4.0,
        "short_factor": [1.0] * 8,
        "long_factor": [1.0 + i for i in range(8)],
    }
    rope = rotary.RoPE(16, scaling=scaling)
    q = torch.randn(1, 1, 40, 16, generator=gen)  # past 16 tokens: the long factors, computed lazily
    scaling["long_factor"][0] = 100.0  # edited in place after construction, before first use
    scaling["factor"] = 8.0
    fresh = rotary.RoPE(16, scaling={**scaling, "factor": 4.0, "long_factor": [1.0 + i for i in range(8)]})
    assert torch.equal(rope(q, q)[0], fresh(q, q)[0])


TOL = {torch.float32: 2e-5, torch.float64: 1e-9, torch.bfloat16: 8e-2, torch.float16: 8e-3}


def _expected(x, pos, layout, interleaved):
    """The float64 reference rotation of x (4-D) at its positions by ``RoPE(head_dim)``'s documented frequencies:
    transformers' default ones at base 10000 (restated in helpers; docs/core.md: bit-identical)."""
    inv_freq = hf_frequencies({"rope_type": "default"}, 10000.0, x.shape[-1])[0]
    seq_dim = 2 if layout == "bhsd" else 1
    s = x.shape[seq_dim]
    if pos is None:
        ids = torch.arange(s).expand(x.shape[0], s)
    else:
        ids = pos.long().expand(x.shape[0], s)
    xb = x.double() if layout == "bhsd" else x.double().transpose(1, 2)
    out = torch.empty_like(xb)
    for b in range(xb.shape[0]):
        out[b] = reference.rotate_complex(xb[b], ids[b], inv_freq, interleaved=interleaved)
    return out if layout == "bhsd" else out.transpose(1, 2)


#: what :func:`rotate_calls` spoils in a valid call, one thing at a time (None: nothing, the call is valid)
SPOILS = [None] * 5 + [
    "dtype",
    "head_dim",
    "rank",
    "layout",
    "inplace",
    "offset",
    "float_ids",
    "list_ids",
    "ids_shape",
    "ids_and_offset",
    "packed_without_ids",
]


@st.composite
def rotate_calls(draw):
    """``(head_dim, x, kwargs, spoil)``: a call of ``RoPE(head_dim).rotate(x, **kwargs)``, valid by construction
    unless ``spoil`` names the one thing made wrong. Valid: a floating ``x`` of ``head_dim`` channels, 4-D in
    ``bhsd`` or ``bshd`` (sometimes a strided view) or packed ``[T, H, D]`` / ``[T, H * D]`` with per-token ids;
    positions as ids ``[S]``, ``[1, S]`` or ``[B, S]`` (int64 or int32, negative and huge ones too) or an
    ``offset >= 0``; ``inplace`` a bool."""
    head_dim = draw(st.sampled_from([2, 4, 6]))
    dtype = draw(st.sampled_from(DTYPES[:4]))
    kind = draw(st.sampled_from(["bhsd", "bhsd", "bshd", "packed", "flat"]))
    b, h, s = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 5))
    spoil = draw(st.sampled_from(SPOILS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if kind in ("bhsd", "bshd"):
        shape = (b, h, s, head_dim) if kind == "bhsd" else (b, s, h, head_dim)
        strided = draw(st.booleans())
        seq_dim = 2 if kind == "bhsd" else 1
        if strided:  # every other token of a twice longer tensor: a non-contiguous view
            longer = list(shape)
            longer[seq_dim] *= 2
            every_other = (slice(None),) * seq_dim + (slice(None, None, 2),)
            x = torch.randn(longer, generator=g).to(dtype)[every_other]
        else:
            x = torch.randn(shape, generator=g).to(dtype)
        kwargs = {"layout": kind}
        if draw(st.booleans()):
            rows = draw(st.sampled_from([None, 1, b]))
            top = 2**31 - 1 if draw(st.booleans()) else 2**41
            values = draw(st.lists(st.integers(-3, top), min_size=s, max_size=s))
            ids = torch.tensor(values, dtype=torch.int64)
            if top < 2**31 and draw(st.booleans()):
                ids = ids.to(torch.int32)
            kwargs["position_ids"] = ids if rows is None else ids.expand(rows, s)
        else:
            kwargs["offset"] = draw(st.sampled_from([0, 5, 2**40]))
    else:
        t = s
        x = torch.randn((t, h, head_dim), generator=g).to(dtype)
        if kind == "flat":
            x = x.reshape(t, h * head_dim)
        ids = torch.tensor(draw(st.lists(st.integers(-3, 70), min_size=t, max_size=t)), dtype=torch.int64)
        kwargs = {"position_ids": ids, "layout": draw(st.sampled_from(["bhsd", "bshd"]))}
    kwargs["inplace"] = draw(st.booleans())
    if spoil == "dtype":
        x = x.to(draw(st.sampled_from([torch.int64, torch.bool])))
    elif spoil == "head_dim":
        x = torch.randn(*x.shape[:-1], x.shape[-1] + 2) if kind != "flat" else torch.randn(x.shape[0], 2 * h + 1)
    elif spoil == "rank":
        x = x.reshape(1, *x.shape) if kind in ("bhsd", "bshd") else x.reshape(-1)
    elif spoil == "layout" and kind in ("bhsd", "bshd"):  # a packed input has no layout to read
        kwargs["layout"] = draw(st.sampled_from(["sbhd", None, "BHSD"]))
    elif spoil == "inplace":
        kwargs["inplace"] = draw(st.sampled_from(["yes", 1, None]))
    elif spoil == "offset":
        kwargs.pop("position_ids", None)
        kwargs["offset"] = draw(st.sampled_from([-1, 1.5, True]))
        x = x if kind in ("bhsd", "bshd") else x.reshape(1, x.shape[0], h, head_dim)  # 4-D, offset alone
    elif spoil == "float_ids" and "position_ids" in kwargs:
        kwargs["position_ids"] = kwargs["position_ids"].float()
    elif spoil == "list_ids" and "position_ids" in kwargs:
        kwargs["position_ids"] = kwargs["position_ids"].tolist()
    elif spoil == "ids_shape" and "position_ids" in kwargs:
        kwargs["position_ids"] = torch.zeros(1, 1, s + 1, dtype=torch.int64)
    elif spoil == "ids_and_offset":
        kwargs.setdefault("position_ids", torch.zeros(s, dtype=torch.int64))
        kwargs["offset"] = draw(st.sampled_from([1, 5]))
    elif spoil == "packed_without_ids" and kind in ("packed", "flat"):
        del kwargs["position_ids"]
    else:
        spoil = None  # the spoil does not apply to this call: it stays valid
    return head_dim, x, kwargs, spoil


@settings(max_examples=150, deadline=None)
@given(call=rotate_calls(), interleaved=st.booleans())
def test_rope_rotate_is_the_rotation_and_refuses_what_the_contract_refuses(call, interleaved):
    """A valid call (classified up front, :func:`rotate_calls`) returns the float64 reference rotation; a call
    with one thing wrong raises a named error."""
    head_dim, x, kwargs, spoil = call
    rope = rotary.RoPE(head_dim, interleaved=interleaved, max_position=8)
    before = x.clone()
    out = expect(spoil is None, rope.rotate, x, **kwargs)
    if spoil is not None:
        return
    assert out.shape == x.shape and out.dtype == x.dtype
    positions, layout = kwargs.get("position_ids"), kwargs["layout"]
    if x.dim() == 4:
        view, view_layout = before, layout
    else:  # packed [T, H, D] or vLLM's flat [T, H * D]: one sequence of T tokens, per-token positions
        heads = x.shape[1] if x.dim() == 3 else x.shape[1] // head_dim
        view, view_layout = before.reshape(1, x.shape[0], heads, head_dim), "bshd"
    if positions is None:
        seq_dim = 2 if view_layout == "bhsd" else 1
        positions = torch.arange(kwargs["offset"], kwargs["offset"] + view.shape[seq_dim])
    ref = _expected(view, positions, view_layout, interleaved).reshape(x.shape)
    scale = max(1.0, float(before.double().abs().max())) if before.numel() else 1.0
    big = bool(positions.numel()) and int(positions.abs().max()) > 2**20
    tol = TOL[x.dtype] * scale * (1e4 if big else 1)  # fp32 of angles ~1e12 rad: the reference differs too
    assert float((out.double() - ref).abs().max()) <= tol if out.numel() else True
    if kwargs["inplace"]:
        assert out is x
