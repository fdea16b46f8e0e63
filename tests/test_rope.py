"""RoPE as an nn.Module: dtype safety, autograd, torch.compile."""

import pytest
import torch

import rotary


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
    with pytest.raises(RuntimeError, match=r"rope.inv_freq was modified in place .*the edit would be ignored; "
                                           r"inv_freq is read-only and has been restored. To rotate with other "
                                           r"frequencies build a new RoPE \(rotary.RoPE\(head_dim, base="):  # fmt: skip
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
    message = r"rope.inv_freq is read-only: .*a new value would be ignored; to rotate with other frequencies build a new RoPE"
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
