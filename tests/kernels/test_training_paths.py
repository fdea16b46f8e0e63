"""Training paths: q/k-sized allocations of forward + backward, counted from the allocator's records
(deterministic), and the in-place path (rotated input, rotated gradient) against the out-of-place one,
bit for bit."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import rotary
from rotary.kernels import extension, ops
from rotary.models import Decoder, DecoderConfig
from rotary.nn import RotaryAttention
from rotary.tools.bench import allocations

B, S, HQ, HK, D = 2, 64, 8, 2, 64


@pytest.fixture(scope="module", autouse=True)
def _extension_built():
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()


def sized(call, *tensors: torch.Tensor) -> list[int]:
    """Allocations made by ``call`` of exactly the size of one of ``tensors``."""
    found = allocations(call)
    if found is None:
        pytest.skip("this PyTorch build records no allocations")
    sizes = {t.nbytes for t in tensors}
    return sorted(size for size in found if size in sizes)


def leaves(layout: str, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    q = torch.randn(shape(HQ), generator=g).to(dtype).requires_grad_()
    k = torch.randn(shape(HK), generator=g).to(dtype).requires_grad_()
    return q, k


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("grad_layout", ["same", "other"])
def test_out_of_place_forward_backward_allocates_one_output_and_one_gradient_per_input(layout, dtype, grad_layout):
    rope = rotary.RoPE(D)
    q, k = leaves(layout, dtype)
    grads = [torch.randn_like(t) for t in (q, k)]
    if grad_layout == "other":  # the incoming gradient in the other memory layout: read as it is, no copy
        grads = [g.transpose(1, 2).contiguous().transpose(1, 2) for g in grads]

    def step():
        q.grad = k.grad = None
        torch.autograd.backward(rope(q, k, layout=layout), grads)

    step()
    got = sized(step, q, k)
    assert got == sorted([q.nbytes, k.nbytes] * 2), (
        f"fwd+bwd allocated {got}; want one output and one gradient per input"
    )
    # the gradients land in .grad as they were allocated, laid out like the inputs
    assert q.grad.stride() == q.stride() and k.grad.stride() == k.stride()


def _inplace_vs_identity(make, rotate_in_place):
    """q/k-sized allocations of a training step with the in-place rotation and with none at all."""
    counts = []
    for rot in (rotate_in_place, lambda q, k: (q, k)):

        def step(rot=rot):
            leaves_, q, k = make()
            q, k = rot(q, k)
            # the downstream op's backward makes fresh gradients (as attention's does)
            ((q * 2).sum() + (k * 3).sum()).backward()
            return leaves_

        step()
        leaves_ = step()
        counts.append(sized(step, *leaves_))
    return counts


@pytest.mark.parametrize("form", ["bhsd", "bshd", "projection"])
@pytest.mark.parametrize("inplace", [True, False])
def test_training_step_allocates_the_outputs_and_one_gradient_per_input(form, inplace):
    # the backward never writes into an incoming gradient (autograd may share it), so each path
    # allocates one gradient per input; out of place also one output per input; nothing else of q/k's
    # size (no copy of the base of a projection view, no clone of a gradient)
    rope = rotary.RoPE(D)
    ql, kl = leaves("bshd" if form == "projection" else form, torch.float32)
    layout = "bhsd" if form in ("bhsd", "projection") else "bshd"

    def make():
        ql.grad = kl.grad = None
        q, k = ql * 1, kl * 1
        if form == "projection":  # q = proj(h).view(B, S, H, D).transpose(1, 2), as RotaryAttention makes it
            q = (ql * 1).reshape(B, S, HQ * D).view(B, S, HQ, D).transpose(1, 2)
            k = (kl * 1).reshape(B, S, HK * D).view(B, S, HK, D).transpose(1, 2)
        return (ql, kl), q, k

    with_rope, without = _inplace_vs_identity(make, lambda q, k: rope(q, k, layout=layout, inplace=inplace))
    added = Counter([ql.nbytes, kl.nbytes] * (1 if inplace else 2))
    extra = Counter(with_rope) - Counter(without)
    # at most what the rotation itself needs (where the layout of a projection view makes autograd
    # copy a gradient anyway, the rotated gradient takes that copy's place)
    assert extra <= added, f"{with_rope} vs {without} without RoPE"
    if form != "projection":
        assert extra == added


def _grads(rope, mode, make_downstream, dtype=torch.float32, layout="bhsd", inplace=False):
    q_leaf, k_leaf = leaves(layout, dtype, seed=1)
    q, k = q_leaf * 1, k_leaf * 1
    qr, kr = rope(q, k, layout=layout, inplace=inplace)
    make_downstream(mode, qr, kr)
    return q_leaf.grad, k_leaf.grad


STORE: list[torch.Tensor] = []


def downstream(mode: str, qr: torch.Tensor, kr: torch.Tensor) -> None:
    g = torch.Generator().manual_seed(2)
    wq, wk = torch.randn(qr.shape, generator=g).to(qr.dtype), torch.randn(kr.shape, generator=g).to(kr.dtype)
    if mode == "fresh":
        ((qr * wq).sum() + (kr * wk).sum()).backward()
    elif mode == "user":  # gradients the caller holds: must not be overwritten
        before = (wq.clone(), wk.clone())
        torch.autograd.backward((qr, kr), (wq, wk))
        assert torch.equal(wq, before[0]) and torch.equal(wk, before[1]), "the caller's gradient was modified"
    elif mode == "user_view":  # the caller's gradient reaches the rotation as a view of it
        gq = torch.randn(qr.transpose(1, 2).shape, generator=g).to(qr.dtype)
        before = gq.clone()
        torch.autograd.backward((qr.transpose(1, 2), (kr * wk).sum()), (gq, None))
        assert torch.equal(gq, before)
    elif mode == "shared":  # an addition hands one gradient to both of its inputs
        other = torch.zeros_like(qr, requires_grad=True)
        (((qr + other) * wq).sum() + (kr * wk).sum()).backward()
        STORE.append(other.grad)
    elif mode == "hook":  # a hook keeps the gradient of the rotated q
        qr.register_hook(lambda grad: STORE.append(grad))
        ((qr * wq).sum() + (kr * wk).sum()).backward()
    else:
        raise AssertionError(mode)


@pytest.mark.parametrize("mode", ["fresh", "user", "user_view", "shared", "hook"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace_gradients_are_bit_identical_to_out_of_place(mode, dtype, interleaved):
    rope = rotary.RoPE(D, rotary_dim=48, interleaved=interleaved)
    STORE.clear()
    expected = _grads(rope, mode, downstream, dtype)
    kept_expected = [t.clone() for t in STORE]
    STORE.clear()
    got = _grads(rope, mode, downstream, dtype, inplace=True)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    for e, g in zip(kept_expected, STORE):  # gradients others hold are not rotated under them
        assert torch.equal(e, g)


def test_inplace_gradcheck_float64():
    rope = rotary.RoPE(8, rotary_dim=6)
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)

    def f(q, k):
        qr, kr = rope(q * 1, k * 1, inplace=True)
        return qr * 2, kr * 3  # fresh gradients downstream: the backward rotates them in place

    assert torch.autograd.gradcheck(f, (q, k))
    assert torch.autograd.gradgradcheck(f, (q, k))


def _attention_pair(**kwargs):
    torch.manual_seed(0)
    attn = RotaryAttention(64, 8, num_kv_heads=2, causal=True, **kwargs)
    other = RotaryAttention(64, 8, num_kv_heads=2, causal=True, inplace_rope=False, **kwargs)
    other.load_state_dict(attn.state_dict())
    return attn, other


@pytest.mark.parametrize("rotary_value", [False, True])
def test_attention_rotates_in_place_with_identical_training_results(rotary_value):
    inplace, out_of_place = _attention_pair(rotary_value=rotary_value)
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1))
    for attn in (inplace, out_of_place):
        attn(x).square().sum().backward()
    for (name, a), (_, b) in zip(inplace.named_parameters(), out_of_place.named_parameters()):
        assert torch.equal(a.grad, b.grad), name

    def step(attn):
        def call():
            attn.zero_grad(set_to_none=True)
            attn(x).sum().backward()

        return call

    # the same layer without RoPE: what projections, attention and autograd allocate anyway (e.g. a
    # copy where the gradient of repeated keys, [B, H, S, D], meets the projection's [B, S, H * D])
    torch.manual_seed(0)
    plain = RotaryAttention(64, 8, num_kv_heads=2, causal=True, rope=False)
    plain.load_state_dict(inplace.state_dict(), strict=False)
    sizes = (torch.empty(2, 16, 8, 8), torch.empty(2, 16, 2, 8))
    n_in, n_plain = (sized(step(a), *sizes) for a in (inplace, plain))
    extra = Counter(n_in) - Counter(n_plain)
    # one new gradient per rotated tensor at most (the backward never writes into an incoming one)
    rotated = [*sizes, sizes[1]] if rotary_value else sizes  # q, k (and v)
    assert extra <= Counter(t.nbytes for t in rotated), f"{n_in} vs {n_plain} without RoPE"


def test_attention_keeps_q_unrotated_for_a_forward_hook():
    attn, reference = _attention_pair()
    x = torch.randn(1, 5, 64)
    seen = []
    attn.q_proj.register_forward_hook(lambda module, args, out: seen.append(out))
    assert not attn._rotate_in_place()
    torch.testing.assert_close(attn(x), reference(x), rtol=0, atol=0)
    assert torch.equal(seen[0], reference.q_proj(x))


def test_decoder_training_step_in_place_equals_out_of_place():
    config = DecoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    model, reference = Decoder(config), Decoder(config)
    reference.load_state_dict(model.state_dict())
    for block in reference.layers:
        block.attn.inplace_rope = False
    ids = torch.randint(50, (2, 12), generator=torch.Generator().manual_seed(3))
    for m in (model, reference):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        logits = m(ids)
        F.cross_entropy(logits[:, :-1].reshape(-1, 50), ids[:, 1:].reshape(-1)).backward()
        optimizer.step()
    for (name, a), (_, b) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(a, b), name
    assert all(block.attn._rotate_in_place() for block in model.layers)


def test_in_place_without_autograd_returns_the_inputs_themselves():
    # a reshaped view of a projection output that needs no gradient: the inputs come back, not new views
    rope = rotary.RoPE(8)
    for S in (0, 3):
        q = torch.randn(1, S, 16).view(1, S, 2, 8).transpose(1, 2)
        k = torch.randn(1, S, 8).view(1, S, 1, 8).transpose(1, 2)
        tables = rope.tables(torch.arange(S))
        out = rotary.rotate([q, k], tables, inplace=True, kinds=("q", "k"))
        assert out[0] is q and out[1] is k


def test_a_gradient_laid_out_unlike_the_input_gets_a_new_tensor_in_the_inputs_layout():
    # q is [B, H, S, D] over [B, S, H, D] storage; the downstream product's backward makes a fresh
    # gradient, but contiguous in [B, H, S, D]. Rotated in place it would reach the leaf in the wrong
    # layout, and autograd would copy it into x.grad's: the backward rotates it into the input's layout
    rope = rotary.RoPE(D)
    leaf_q, leaf_k = leaves("bshd", torch.float32)
    q, k = leaf_q.transpose(1, 2), leaf_k.transpose(1, 2)
    seen = []
    q.register_hook(lambda grad: seen.append(grad.stride()))
    qr, kr = rope(q, k)
    w = torch.randn(qr.shape)
    ((qr * w).sum() + kr.sum()).backward()
    assert seen == [q.stride()]
    got, leaf_q.grad = leaf_q.grad, None
    torch.autograd.backward(rope(q, k)[0], w.clone())  # a gradient the caller holds: never in place
    assert torch.equal(got, leaf_q.grad)


def _kernel_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = ops.run
    monkeypatch.setattr(ops, "run", lambda rotation: (calls.append(len(rotation.xs)), real(rotation))[1])
    return calls


def test_in_place_under_autograd_rotates_q_and_k_in_one_kernel_call(monkeypatch):
    rope = rotary.RoPE(D)
    ql, kl = leaves("bhsd", torch.float32)
    q, k = ql * 1, kl * 1
    calls = _kernel_calls(monkeypatch)
    qr, kr = rope(q, k, inplace=True)
    assert qr is q and kr is k and calls == [2]
    ((qr * 2).sum() + (kr * 3).sum()).backward()
    assert calls == [2, 2]  # the backward: both gradients in one call


def test_in_place_on_views_of_one_qkv_rotates_each_view_alone(monkeypatch):
    # autograd accepts an in-place Function on a view only with a single output: one call per view
    rope = rotary.RoPE(D)
    leaf = torch.randn(B, S, HQ + 2 * HK, D, requires_grad=True)
    qkv = leaf * 1
    q, k = qkv[:, :, :HQ], qkv[:, :, HQ : HQ + HK]
    calls = _kernel_calls(monkeypatch)
    qr, kr = rope(q, k, layout="bshd", inplace=True)
    assert calls == [1, 1]
    ((qr * 2).sum() + (kr * 3).sum()).backward()
    got = leaf.grad.clone()
    leaf.grad = None
    qkv = leaf * 1
    qr, kr = rope(qkv[:, :, :HQ], qkv[:, :, HQ : HQ + HK], layout="bshd")  # out of place: the oracle
    ((qr * 2).sum() + (kr * 3).sum()).backward()
    assert torch.equal(got, leaf.grad)
