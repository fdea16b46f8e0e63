"""Learnable frequencies, θ_i · exp(α_i): equal to RoPE at α = 0, gradients (gradcheck, through the
fused kernels), training recovers a teacher's frequencies, fp32 through ``.to(bfloat16)``, the meta
device, the state dict, and the error with length-dependent scaling."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call

import rotary
from helpers import forbid_torch_path, hf_frequencies
from rotary import reference
from rotary.kernels.extension import load_cpu_extension
from variant_checks import EPS64, FLOATS, assert_close, expect, tensors, to_bhsd

needs_kernel = pytest.mark.skipif(load_cpu_extension() is None, reason="the fused CPU kernel is not built here")


@pytest.mark.parametrize(
    "scaling", [None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}]
)
def test_starts_equal_to_the_frozen_rope(scaling, gen):
    learnable = rotary.RoPE(32, scaling=scaling, learnable_frequencies=True)
    frozen = rotary.RoPE(32, scaling=scaling)
    assert list(learnable.state_dict()) == ["log_frequency_scale"] and not frozen.state_dict()
    assert learnable.log_frequency_scale.dtype == torch.float32 and not learnable.log_frequency_scale.any()
    q, k = torch.randn(2, 4, 9, 32, generator=gen), torch.randn(2, 2, 9, 32, generator=gen)
    for kwargs in ({}, {"offset": 100}, {"position_ids": torch.tensor([[0, 0, 1, 2, 3, 5, 8, 13, 21]] * 2)}):
        got, want = learnable(q, k, **kwargs), frozen(q, k, **kwargs)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(learnable.learned_inv_freq, frozen.inv_freq)


@needs_kernel
def test_gradcheck_through_the_fused_kernel(monkeypatch, gen):
    forbid_torch_path(monkeypatch)
    rope = rotary.RoPE(8, base=100.0, learnable_frequencies=True)
    alpha = (torch.randn(4, generator=gen, dtype=torch.float64) * 0.1).requires_grad_()
    q = torch.randn(2, 2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 5, 8, generator=gen, dtype=torch.float64)

    def f(alpha, q):
        return functional_call(rope, {"log_frequency_scale": alpha}, (q, k), {"offset": 3})

    assert torch.autograd.gradcheck(f, (alpha, q))

    # and the gradient equals the float64 complex-form oracle's
    def oracle(alpha, q):
        inv = rope.inv_freq.double() * alpha.exp()
        pos = torch.arange(3, 8)
        return rotary.reference.rotate_complex(q, pos, inv), rotary.reference.rotate_complex(k, pos, inv)

    g_q, g_k = (
        torch.randn(2, 2, 5, 8, generator=gen, dtype=torch.float64),
        torch.randn(2, 1, 5, 8, generator=gen, dtype=torch.float64),
    )
    got = torch.autograd.grad(f(alpha, q), (alpha, q), (g_q, g_k))
    want = torch.autograd.grad(oracle(alpha, q), (alpha, q), (g_q, g_k))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@needs_kernel
def test_training_recovers_a_teachers_frequencies_on_the_fused_kernel(monkeypatch):
    """A student fits the attention scores of a teacher whose frequencies are 0.8 times its own
    (linear scaling by 1.25): every pair's exp(α_i) reaches 0.8."""
    forbid_torch_path(monkeypatch)
    g = torch.Generator().manual_seed(0)
    teacher = rotary.RoPE(16, base=100.0, scaling={"rope_type": "linear", "factor": 1.25})
    student = rotary.RoPE(16, base=100.0, learnable_frequencies=True)
    opt = torch.optim.Adam(student.parameters(), lr=0.02)
    losses = []
    for _ in range(150):
        q, k = torch.randn(4, 2, 16, 16, generator=g), torch.randn(4, 2, 16, 16, generator=g)
        with torch.no_grad():
            tq, tk = teacher(q, k)
        sq, sk = student(q, k)
        # scores as a broadcast product, not sq @ sk.transpose(-1, -2): that gives k's gradient a
        # non-unit stride over D, which the kernels' backward hands to the pure-torch path
        scores = (sq.unsqueeze(3) * sk.unsqueeze(2)).sum(-1)
        loss = ((scores - tq @ tk.transpose(-1, -2)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 1e-4 * losses[0]
    torch.testing.assert_close(student.log_frequency_scale.exp(), torch.full((8,), 0.8), rtol=1e-3, atol=0)
    assert not student._caches  # tables were computed per call, never cached


def test_learned_values_survive_bfloat16_and_stay_fp32():
    rope = rotary.RoPE(16, learnable_frequencies=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), rope)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    learned = torch.linspace(-0.3, 0.2, 8) + 1e-4  # values bf16 cannot hold
    with torch.no_grad():
        rope.log_frequency_scale.copy_(learned)
    q = torch.randn(1, 2, 6, 16)
    before = rope(q, q)
    rope(q, q)[0].sum().backward()
    grad = rope.log_frequency_scale.grad.clone()
    param = rope.log_frequency_scale
    model.to(torch.bfloat16)
    assert model[0].weight.dtype == torch.bfloat16
    assert rope.log_frequency_scale is param and param.dtype == torch.float32 and torch.equal(param, learned)
    assert param.grad.dtype == torch.float32 and torch.equal(param.grad, grad)
    after = rope(q, q)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    opt.step()  # the optimizer still holds the same fp32 parameter
    assert torch.equal(param, learned - grad)
    model.double()
    assert param.dtype == torch.float32


def test_meta_device_to_empty_then_reset_or_load():
    trained = rotary.RoPE(16, learnable_frequencies=True)
    with torch.no_grad():
        trained.log_frequency_scale.copy_(torch.linspace(-0.2, 0.2, 8))
    with torch.device("meta"):
        rope = rotary.RoPE(16, learnable_frequencies=True)
    assert rope.log_frequency_scale.is_meta
    rope.to_empty(device="cpu")
    rope.reset_parameters()
    q = torch.randn(1, 2, 5, 16)
    assert torch.equal(rope(q, q)[0], rotary.RoPE(16)(q, q)[0])
    rope.load_state_dict(trained.state_dict())
    assert torch.equal(rope(q, q)[0], trained(q, q)[0])
    with torch.device("meta"):
        meta = rotary.RoPE(16, learnable_frequencies=True).to(torch.bfloat16)
    assert meta.log_frequency_scale.dtype == torch.float32


def test_changed_frequencies_change_the_tables_and_carry_over_to_a_new_scaling():
    rope = rotary.RoPE(16, learnable_frequencies=True)
    q = torch.randn(1, 1, 4, 16)
    first = rope.rotate(q)
    with torch.no_grad():
        rope.log_frequency_scale.fill_(math.log(0.5))
    halved = rotary.RoPE(16, scaling={"rope_type": "linear", "factor": 2.0})
    assert not torch.equal(rope.rotate(q), first)
    torch.testing.assert_close(rope.rotate(q), halved.rotate(q), rtol=0, atol=1e-6)
    stretched = rope.with_scaling({"rope_type": "linear", "factor": 2.0})
    assert stretched.learnable_frequencies and torch.equal(stretched.log_frequency_scale, rope.log_frequency_scale)


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64},
        {
            "rope_type": "longrope",
            "factor": 2.0,
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_length_dependent_scaling_is_an_error_that_says_why(scaling):
    with pytest.raises(
        ValueError,
        match=rf"cannot be combined with rope_type '{scaling['rope_type']}': its frequencies are recomputed for "
        r"each sequence length.*learnable_frequencies=False",
    ):
        rotary.RoPE(8, scaling=scaling, max_position=128, learnable_frequencies=True)
    with pytest.raises(TypeError, match="learnable_frequencies must be True or False"):
        rotary.RoPE(8, learnable_frequencies="yes")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    head_dim=st.sampled_from([4, 8, 8, 6]),
    learnable=st.sampled_from([True, True, True, "true", 1]),
    scaling=st.sampled_from(
        [None, None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}]
    ),
    interleaved=st.booleans(),
    alpha=st.sampled_from([0.0, 0.5, -3.0, "random"]),
    data=st.data(),
)
def test_learnable_frequencies_are_right_or_a_named_error(head_dim, learnable, scaling, interleaved, alpha, data):
    # learnable_frequencies must be True or False (not "true", not 1), and not with a length-dependent
    # scaling type (dynamic): its frequencies are recomputed per call
    valid = learnable is True and (scaling is None or scaling["rope_type"] != "dynamic")
    rope = expect(
        valid,
        rotary.RoPE,
        head_dim,
        base=100.0,
        scaling=scaling,
        interleaved=interleaved,
        learnable_frequencies=learnable,
    )
    if not valid:
        return
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    with torch.no_grad():
        if alpha == "random":
            rope.log_frequency_scale.copy_(torch.randn(head_dim // 2, generator=g))
        else:
            rope.log_frequency_scale.fill_(alpha)
    dtype = data.draw(st.sampled_from(FLOATS))
    seq = data.draw(st.integers(0, 5))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"]))
    shape = [2, 2, seq, head_dim] if layout == "bhsd" else [2, seq, 2, head_dim]
    q = data.draw(tensors(shape=shape, dtype=dtype))
    k = data.draw(tensors(shape=shape, dtype=dtype))
    pos = data.draw(st.sampled_from([None, "ids", "big"]))
    ids = torch.arange(seq) if pos is None else torch.randint(0, 50 if pos == "ids" else 2**20, (seq,), generator=g)
    out = expect(True, rope, q, k, position_ids=None if pos is None else ids, layout=layout)  # every draw fits
    # the learned frequencies θ_i · exp(α_i): θ transformers' for the block (restated, docs/core.md: bit-identical),
    # α the scales set above
    theta = hf_frequencies(scaling or {"rope_type": "default"}, 100.0, head_dim, head_dim=head_dim)[0]
    assert torch.equal(rope.original_freqs.inv_freq, theta)
    inv64 = theta.double() * rope.log_frequency_scale.detach().double().exp()
    angle = float(ids.max()) * float(inv64.max()) if seq else 0.0
    for got, x in zip(out, (q, k)):
        xb = to_bhsd(x, layout).double()
        ref = torch.stack([reference.rotate_complex(xb[b], ids, inv64, interleaved=interleaved) for b in range(2)])
        # the learned frequency θ·exp(α) may be rounded to fp32 before the float64 angles: angle · 2^-23 more
        assert_close(got, to_bhsd(ref, layout), x, angle * 2**-23 / EPS64 / 8)
    # the gradient reaches α and equals the float64 reference's (rotate_complex is differentiable)
    if dtype in (torch.float32, torch.float64) and seq and pos != "big":
        qg = q.detach().double() if dtype == torch.float64 else q.detach()
        w = torch.randn(shape, generator=g, dtype=torch.float64)
        rope.zero_grad()
        (rope.rotate(qg, position_ids=ids, layout=layout).double() * w).sum().backward()
        a64 = rope.log_frequency_scale.detach().double().requires_grad_()
        f64 = theta.double() * a64.exp()
        xb = to_bhsd(qg, layout).double()
        ref = torch.stack([reference.rotate_complex(xb[b], ids, f64, interleaved=interleaved) for b in range(2)])
        (to_bhsd(ref, layout) * w).sum().backward()
        got_g, want_g = rope.log_frequency_scale.grad.double(), a64.grad
        assert float((got_g - want_g).abs().max()) <= 1e-3 * max(1.0, float(want_g.abs().max()))
