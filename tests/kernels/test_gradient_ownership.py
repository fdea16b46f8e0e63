"""Gradient ownership: a backward never writes into an incoming gradient, whoever holds it; and the
cases an adversarial review of the training paths found (each failed before its fix)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rotary
from helpers import run_interpreted
from rotary.kernels import extension
from rotary.tables import RotaryTables


@pytest.fixture(autouse=True)
def _extension_built():
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()


class _Recorder(TorchDispatchMode):
    """Keeps every op's output, as a numerics-debugging recorder does."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.seen.append(out)
        return out


def _tracer(frame, event, arg):
    frame.f_locals  # noqa: B018 - what a debugger does: a snapshot holding every local
    return _tracer


def _rotated(rope, inplace, layout="bshd"):
    """q and k (non-leaf, as projections leave them) rotated by ``rope``, with their leaves."""
    q_leaf = torch.randn(1, 3, 2, 16, requires_grad=True)
    k_leaf = torch.randn(1, 3, 2, 16, requires_grad=True)
    return (q_leaf, k_leaf), rope(q_leaf * 1, k_leaf * 1, layout=layout, inplace=inplace)


def _expected_grad(rope, g):
    """The gradient of a rotation for an output gradient ``g``: ``g`` rotated by -θ (the formula)."""
    cos, sin = rope.cos_sin(torch.arange(g.shape[1]))
    return rotary.apply_rotary(g, cos, -sin, layout="bshd")


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("holder", ["hook", "retain_grad", "grad_tensors", "shared by an addition", "debugger"])
def test_an_incoming_gradient_is_never_written_to(inplace, holder):
    # autograd hands one gradient tensor to several consumers (both inputs of an addition), keeps the
    # caller's grad_tensors and what hooks and retain_grad keep; the backward must leave it as it came
    rope = rotary.RoPE(16)
    (q_leaf, k_leaf), (qr, kr) = _rotated(rope, inplace)
    w = torch.randn(1, 3, 2, 16)
    kept = []
    if holder == "hook":
        qr.register_hook(lambda grad: kept.append(grad))
        (qr * w).sum().backward()
    elif holder == "retain_grad":
        qr.retain_grad()
        torch.autograd.backward(qr, w.clone())
        kept.append(qr.grad)
    elif holder == "grad_tensors":
        g = w.clone()
        torch.autograd.backward(qr, g)
        kept.append(g)
    elif holder == "shared by an addition":
        other = torch.randn(1, 3, 2, 16, requires_grad=True)
        torch.autograd.backward(qr + other * 1, w.clone())  # the same tensor reaches qr and other * 1
        kept.append(other.grad)
    else:
        previous = sys.gettrace()
        sys.settrace(_tracer)  # a debugger holding frame locals
        try:
            (qr * w).sum().backward()
        finally:
            sys.settrace(previous)
        kept.append(w)
    assert torch.equal(kept[0], w), "an incoming gradient was rotated where it lay"
    assert torch.equal(q_leaf.grad, _expected_grad(rope, w))


@pytest.mark.parametrize("inplace", [False, True])
def test_gradients_under_a_dispatch_mode_that_keeps_every_output(inplace):
    rope = rotary.RoPE(16)
    w = torch.randn(1, 3, 2, 16)
    with _Recorder():
        (q_leaf, _), (qr, kr) = _rotated(rope, inplace)
        kept = []
        qr.register_hook(lambda grad: kept.append(grad))
        ((qr * w).sum() + kr.sum()).backward()
    assert torch.equal(kept[0], w)
    assert torch.equal(q_leaf.grad, _expected_grad(rope, w))


def test_the_source_probes_nothing_about_who_holds_a_gradient():
    # the contract is by construction (never write to an incoming gradient), not by counting references
    src = Path(rotary.__file__).resolve().parent
    banned = ("sys.settrace", "_use_count", "_storage_Use_Count", "getrefcount")
    found = [
        f"{path.relative_to(src)}: {word}" for path in src.rglob("*.py") for word in banned if word in path.read_text()
    ]
    assert not found, found


def test_in_place_leaves_a_tensor_that_needs_no_gradient_out_of_the_graph():
    # q needs a gradient, k does not (a frozen branch): rotating both in one Function would tie k in
    rope = rotary.RoPE(16)
    q_leaf = torch.randn(1, 2, 3, 16, requires_grad=True)
    keys = torch.randn(1, 2, 3, 16)
    expected = rope(keys.clone(), keys.clone())[1]
    qr, kr = rope(q_leaf * 1, keys, inplace=True)
    assert kr is keys and not keys.requires_grad and keys.grad_fn is None and keys.is_leaf
    assert torch.equal(keys, expected)
    qr.sum().backward()
    w = torch.randn(1, 2, 3, 16, requires_grad=True)
    (keys * w).sum().backward()  # a later step uses the keys: no tie to the first step's graph


@pytest.mark.parametrize("inplace", [False, True])
def test_an_output_without_gradient_gives_its_input_none(inplace):
    # with a zero gradient instead, AdamW would still move k's projection (weight decay, moments)
    rope = rotary.RoPE(16)
    k_proj = torch.nn.Linear(16, 32)
    q_leaf = torch.randn(1, 3, 2, 16, requires_grad=True)
    qr, kr = rope(q_leaf * 1, k_proj(torch.randn(1, 3, 16)).view(1, 3, 2, 16), layout="bshd", inplace=inplace)
    (qr * 2).sum().backward()
    assert k_proj.weight.grad is None
    other = q_leaf.detach().clone().requires_grad_()
    qr, kr = rope(other * 1, torch.randn(1, 3, 2, 16, requires_grad=True) * 1, layout="bshd")
    ((qr * 2).sum() + (kr * 0).sum()).backward()  # the same q gradient, with k's present
    assert torch.equal(q_leaf.grad, other.grad)


def test_a_slice_of_a_larger_gradient_is_not_kept_as_the_inputs_grad():
    # torch.cat's backward hands each input a slice of one gradient: rotated in place and kept as
    # q.grad, it would keep the whole buffer alive
    rope = rotary.RoPE(16)
    q = torch.randn(1, 3, 4, 16, requires_grad=True)
    k = torch.randn(1, 3, 4, 16, requires_grad=True)
    other = torch.randn(15, 3, 4, 16, requires_grad=True)
    w = torch.randn(16, 3, 4, 16)
    qr, kr = rope(q, k, layout="bshd")
    (torch.cat([qr, other * 2], dim=0) * w).sum().backward()
    assert q.grad.untyped_storage().nbytes() == q.nbytes
    got, q.grad = q.grad, None
    torch.autograd.backward(rope(q, k, layout="bshd")[0], w[:1].clone())  # the caller's: never in place
    assert torch.equal(got, q.grad)


@pytest.mark.parametrize("interleaved", [False, True])
def test_in_place_with_learnable_frequencies_trains_as_out_of_place(interleaved):
    grads = []
    for inplace in (False, True):
        torch.manual_seed(0)
        rope = rotary.RoPE(16, learnable_frequencies=True, interleaved=interleaved)
        q_leaf = torch.randn(1, 4, 3, 16, requires_grad=True)
        k_leaf = torch.randn(1, 4, 3, 16, requires_grad=True)
        qr, kr = rope(q_leaf * 1, k_leaf * 1, inplace=inplace)
        ((qr * 2).sum() + (kr * kr).sum()).backward()
        grads.append([q_leaf.grad, k_leaf.grad, *(p.grad for p in rope.parameters())])
    assert len(grads[0]) == 3
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("transform", ["grad", "vjp", "vmap", "is_grads_batched", "vmap_decode"])
def test_torch_func_transforms_are_refused_by_name(transform):
    rope = rotary.RoPE(16)
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)

    def loss(a):
        qr, kr = rope(a * 1, k)
        return (qr * 2).sum() + kr.sum()

    calls = {
        "grad": lambda: torch.func.grad(loss)(q),
        "vjp": lambda: torch.func.vjp(lambda a: rope(a, k)[0], q)[1](torch.ones_like(q)),
        "vmap": lambda: torch.func.vmap(lambda a: rope(a, a)[0])(q.expand(3, *q.shape).clone()),
        "vmap_decode": lambda: torch.func.vmap(lambda a: rope(a, a)[0])(torch.randn(3, 1, 2, 1, 16)),
    }
    leaf = q.clone().requires_grad_()
    calls["is_grads_batched"] = lambda: torch.autograd.grad(
        rope(leaf * 1, k)[0], leaf, torch.randn(3, *q.shape), is_grads_batched=True
    )
    with pytest.raises(TypeError, match="torch.func transform"):
        calls[transform]()


def test_a_hook_on_a_strided_view_rotated_in_place_does_not_crash():
    # plain PyTorch (2.13) segfaults when a hook is registered on a view whose base was changed in
    # place through another view before its grad_fn was rebuilt; rotary rebuilds it. In a process of its own.
    script = """
import torch, rotary
rope = rotary.RoPE(16)
ql = torch.randn(1, 2, 6, 16, requires_grad=True)
kl = torch.randn(1, 1, 6, 16, requires_grad=True)
q, k = (ql * 1)[:, :, ::2], (kl * 1)[:, :, ::2]
qr, kr = rope(q, k, inplace=True)
kept = []
qr.register_hook(lambda g: kept.append(g))
((qr * 2).sum() + (kr * 3).sum()).backward()
assert kept and torch.equal(kept[0], torch.full_like(kept[0], 2.0))
print("ok")
"""
    # a child forked from the interpreter server (torch imported, nothing of rotary): a crash ends it alone
    assert run_interpreted(script).strip() == "ok"


def test_dual_tensors_of_forward_mode_ad_are_refused_by_name():
    # a dual tensor does not require grad: the kernels ran on its primal and the result had no tangent (rope,
    # rotate, apply_rotary, rmsnorm_rotate), on the general path and on a plan recorded outside forward AD
    import torch.autograd.forward_ad as fwad

    rope = rotary.RoPE(16)
    q, k, w = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), torch.rand(16)
    cos, sin = rope.cos_sin(torch.arange(3)[None])
    calls = {
        "rope": lambda a: rope(a, k),
        "rotate": lambda a: rotary.rotate([k, a], rope.tables(torch.arange(3))),
        "apply_rotary": lambda a: rotary.apply_rotary(a, cos, sin),
        "rmsnorm_rotate": lambda a: rotary.rmsnorm_rotate(a, k, w, w, rope),
    }
    for name, call in calls.items():
        call(q), call(q)  # a plan recorded for these tensors' signature
        with fwad.dual_level():
            dual = fwad.make_dual(q, torch.ones_like(q))
            with pytest.raises(TypeError, match="forward-mode AD"):
                call(dual)
                pytest.fail(name)
            call(q)  # plain tensors under a dual level: rotated
    # rmsnorm_rotate's weights: a dual one, or one torch.func.grad differentiates (torch's bare RuntimeError before)
    with fwad.dual_level():
        with pytest.raises(TypeError, match="q_weight is a tensor .*forward-mode AD"):
            rotary.rmsnorm_rotate(q, k, fwad.make_dual(w, torch.ones_like(w)), w, rope)
    with pytest.raises(TypeError, match="k_weight is a tensor inside a torch.func transform"):
        torch.func.grad(lambda v: rotary.rmsnorm_rotate(q, k, w, v, rope)[0].sum())(w)
    # the tables a caller hands (apply_rotary's cos/sin, RotaryTables' cos, sin, k_cos, k_sin): the kernels read their
    # primal, so a tangent or a torch.func wrapper on them was dropped with no error (the result had no tangent)
    with fwad.dual_level():
        dual_cos = fwad.make_dual(cos, torch.ones_like(cos))
        with pytest.raises(TypeError, match="cos is a tensor .*forward-mode AD"):
            rotary.apply_rotary(q, dual_cos, sin)
        with pytest.raises(TypeError, match="k_sin is a tensor .*forward-mode AD"):
            RotaryTables.unchecked(cos, sin, False, k_cos=cos, k_sin=fwad.make_dual(sin, torch.ones_like(sin)))
        assert fwad.unpack_dual(rotary.apply_rotary(q, cos, sin)).tangent is None  # plain tables: rotated
    with pytest.raises(TypeError, match="sin is a tensor inside a torch.func transform"):
        torch.func.grad(lambda s: rotary.apply_rotary(q, cos, s).sum())(sin)
