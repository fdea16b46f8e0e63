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
    # inv_freq mirrors the frozen frequencies; every path (cached, compiled) computes from those
    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 5, 16, generator=gen)
    before = rope.rotate(q, offset=3)
    with torch.no_grad():
        rope.inv_freq.mul_(0.5)
    compiled = torch.compile(lambda x: rope.rotate(x, offset=3), fullgraph=True, backend="eager")
    assert torch.equal(rope.rotate(q, offset=3), before)
    assert torch.allclose(compiled(q), before, atol=1e-6)
