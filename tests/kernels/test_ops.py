"""The custom ops: opcheck, gradcheck (in and out of place, views of a qkv tensor), torch.compile
fullgraph, and the warn-once fallback when the extension cannot be built (simulated)."""

from __future__ import annotations

import warnings

import pytest
import torch

import rotary
from rotary.kernels import extension, ops  # noqa: F401  (ops registers rotary::rope / rotary::rope_)
from rotary.kernels.eager import rotate_torch


def tables(S=5, D=8, r=6, interleaved=False):
    return rotary.RoPE(D, rotary_dim=r, interleaved=interleaved).cos_sin(torch.arange(S))


@pytest.mark.parametrize("interleaved", [False, True])
def test_opcheck(interleaved):
    cos, sin = tables(interleaved=interleaved)
    xs = [torch.randn(2, 5, 3, 8, requires_grad=True), torch.randn(2, 5, 1, 8, requires_grad=True)]
    positions = torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0]])
    for pos in (None, positions):
        lists = ([cos] * len(xs), [sin] * len(xs))
        torch.library.opcheck(torch.ops.rotary.rope.default, (xs, *lists, pos, 0, interleaved, False))
        torch.library.opcheck(
            torch.ops.rotary.rope_.default, ([x.detach().clone() for x in xs], *lists, pos, 0, interleaved, True)
        )


def test_opcheck_of_the_value_checks_compiled_rotate_and_cache_runs_on_the_cpu():
    from rotary import serving

    torch.library.opcheck(torch.ops.rotary.checked_slots.default, (torch.tensor([[0, 3], [1, 2]]), 2, 4))
    cos_sin_cache = torch.cat(rotary.RoPE(8).cos_sin(torch.arange(6)), dim=-1)[:, ::2]
    torch.library.opcheck(torch.ops.rotary.checked_positions.default, (cos_sin_cache, torch.tensor([[0, 5], [2, 1]])))
    with pytest.raises(ValueError, match=r"slots must be in 0 \.\. 3 .*got 0 \.\. 4"):
        serving.checked_slots(torch.tensor([[0, 4]]), 1, 4)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck(layout, interleaved):
    cos, sin = tables(interleaved=interleaved)
    shape = (2, 3, 5, 8) if layout == "bhsd" else (2, 5, 3, 8)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    opts = dict(interleaved=interleaved, layout=layout)
    assert torch.autograd.gradcheck(lambda t: rotary.apply_rotary(t, cos, sin, **opts), (x,))
    assert torch.autograd.gradgradcheck(lambda t: rotary.apply_rotary(t, cos, sin, **opts), (x,))
    assert torch.autograd.gradcheck(lambda t: rotary.apply_rotary(t * 1, cos, sin, inplace=True, **opts), (x,))


def test_gradcheck_inplace_on_qkv_views():
    # q and k rotated in place as views of one projection output; v stays as computed
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    w = torch.randn(3 * 2 * 8, 16, dtype=torch.float64, requires_grad=True)
    rope = rotary.RoPE(8, rotary_dim=6)

    def f(w):
        qkv = (x @ w.T).view(1, 5, 3, 2, 8)
        rope(qkv[:, :, 0], qkv[:, :, 1], layout="bshd", inplace=True)
        return qkv * 1

    assert torch.autograd.gradcheck(f, (w,))


def test_inplace_on_leaf_is_refused_with_a_named_error():
    cos, sin = tables()
    x = torch.randn(1, 2, 5, 8, requires_grad=True)
    with pytest.raises(ValueError, match="x is a leaf tensor that requires grad.*inplace=False"):
        rotary.apply_rotary_(x, cos, sin)


def test_inplace_after_use_is_caught_by_version_counter():
    cos, sin = tables()
    x = torch.randn(1, 2, 5, 8, requires_grad=True)
    y = x * 1
    z = (y * y).sum()  # saves y for backward
    rotary.apply_rotary_(y, cos, sin)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_backward_is_the_conjugate_rotation():
    cos, sin = tables(S=7, D=16, r=16)
    x = torch.randn(2, 4, 7, 16, requires_grad=True)
    g = torch.randn_like(x)
    rotary.apply_rotary(x, cos, sin).backward(g)
    expected = rotate_torch(g, cos.view(1, 1, 7, 16), -sin.view(1, 1, 7, 16), interleaved=False, inplace=False)
    assert torch.equal(x.grad, expected)


def test_table_gradients_take_the_torch_path():
    cos, sin = tables()
    cos.requires_grad_()
    x = torch.randn(1, 2, 5, 8)
    rotary.apply_rotary(x, cos, sin).sum().backward()
    assert cos.grad is not None and cos.grad.abs().sum() > 0


@pytest.mark.parametrize("inplace", [False, True])
def test_compile_fullgraph_aot_eager(inplace):
    rope = rotary.RoPE(16, rotary_dim=12)

    def f(q, k):
        if inplace:
            q, k = q * 1, k * 1
        qr, kr = rope(q, k, inplace=inplace)
        return (qr * 2).sum() + kr.square().sum()

    q, k = torch.randn(2, 4, 6, 16, requires_grad=True), torch.randn(2, 2, 6, 16, requires_grad=True)
    f(q, k).backward()
    grads = q.grad.clone(), k.grad.clone()
    q.grad = k.grad = None
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out = compiled(q, k)
    assert torch.allclose(out, f(q, k))
    out.backward()
    assert torch.allclose(q.grad, grads[0]) and torch.allclose(k.grad, grads[1])


@pytest.mark.slow
def test_compile_fullgraph_inductor():
    rope = rotary.RoPE(32)
    q, k = torch.randn(1, 4, 8, 32), torch.randn(1, 2, 8, 32)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k: rope(q, k, position_ids=torch.arange(8)), fullgraph=True)
    for got, expected in zip(compiled(q, k), rope(q, k)):
        assert torch.equal(got, expected)


def test_fallback_warns_once_and_matches(monkeypatch):
    def broken_build():
        raise RuntimeError("simulated: no C++ compiler")

    monkeypatch.setattr(extension, "_build", broken_build)
    monkeypatch.setattr(extension, "_module", None)
    monkeypatch.setattr(extension, "_tried", False)
    monkeypatch.setattr(extension, "_error", None)
    cos, sin = tables(D=16, r=16)
    x = torch.randn(2, 3, 5, 16)
    expected = rotate_torch(x, cos.view(1, 1, 5, 16), sin.view(1, 1, 5, 16), interleaved=False, inplace=False)
    with pytest.warns(RuntimeWarning, match="fused CPU kernel is unavailable .*simulated: no C\\+\\+ compiler"):
        got = rotary.apply_rotary(x, cos, sin)
    assert torch.equal(got, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would fail here
        assert torch.equal(rotary.apply_rotary_(x.clone(), cos, sin), expected)
        x.requires_grad_()
        rotary.apply_rotary(x, cos, sin).sum().backward()
    assert "simulated" in extension.cpu_extension_error()


def test_fallback_by_environment_variable(monkeypatch):
    monkeypatch.setenv("ROTARY_NO_EXTENSION", "1")
    monkeypatch.setattr(extension, "_module", None)
    monkeypatch.setattr(extension, "_tried", False)
    monkeypatch.setattr(extension, "_error", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user asked for the pure-torch path: no warning
        assert extension.load_cpu_extension() is None
    assert extension.cpu_extension_error() == "disabled by ROTARY_NO_EXTENSION"


def test_build_name_depends_on_cpu_and_source(monkeypatch):
    name = extension._build_name()
    monkeypatch.setattr(extension, "_cpu_fingerprint", lambda: "another cpu")
    assert extension._build_name() != name
