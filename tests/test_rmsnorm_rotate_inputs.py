"""rotary.rmsnorm_rotate and the fused QK-norm of rotary.hf.patch under inputs an adversarial user passes.

Each test here was a defect found by review: it failed before its fix. The fused op must equal the
unfused composition (``rotary.qk_norm.rms_norm`` then the rotation) or name the bad value.
"""

from __future__ import annotations

import pytest
import torch

import rotary
from rotary.qk_norm import rms_norm

B, S, HQ, HK, D = 2, 5, 4, 2, 16


def _qkw(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, HQ, S, D, generator=g) * 3, torch.randn(B, HK, S, D, generator=g) * 3
    wq, wk = torch.randn(D, generator=g), torch.randn(D, generator=g)
    return [t.to(dtype) for t in (q, k, wq, wk)]


# torch.compile(dynamic=True) ------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
def test_compile_fullgraph_dynamic_equals_eager(style):
    """dynamic=True makes a float argument (eps, even its default) a symbolic float, which
    ``math.isfinite`` in the eps check could not trace: fullgraph failed before the kernel was reached.

    One eps, not the default (one that the compiled call dropped would show), for every call: the custom op
    specializes the graph on eps (a float argument of the op), so a second value would only compile again.
    The default eps under compile: ``tests/test_rmsnorm_rotate.py::test_torch_compile_fullgraph_equals_eager``."""
    rope = rotary.RoPE(D, rotary_dim=12)

    def f(q, k, wq, wk, eps):
        a, b = rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=3, eps=eps, style=style)
        return (a * 2).sum() + b.square().sum(), a, b, rms_norm(q, wq, eps=eps, style=style)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for seed, eps in ((0, 1e-5), (1, 1e-5)):
        inputs = [t.requires_grad_() for t in _qkw(seed=seed)]
        loss, *outs = f(*inputs, eps)
        loss_c, *outs_c = compiled(*inputs, eps)
        assert all(torch.equal(a, b) for a, b in zip(outs, outs_c))
        grads, grads_c = (torch.autograd.grad(x, inputs) for x in (loss, loss_c))
        assert all(torch.equal(a, b) for a, b in zip(grads, grads_c))
    # another length: the same graph (dynamic shapes; inputs that require grad, as the graph was traced for; the
    # batch kept at 2, which duck sizing tied to k's 2 heads), the same results
    q, k = torch.randn(2, HQ, 7, D, requires_grad=True), torch.randn(2, HK, 7, D, requires_grad=True)
    wq, wk = (t.requires_grad_() for t in _qkw()[2:])
    assert all(torch.equal(a, b) for a, b in zip(f(q, k, wq, wk, 1e-5), compiled(q, k, wq, wk, 1e-5)))


def test_eps_of_numpy_types():
    """np.float32 (e.g. read from a NumPy config) is a number like a Python float."""
    np = pytest.importorskip("numpy")
    q, k, wq, wk = _qkw()
    rope = rotary.RoPE(D)
    want = rotary.rmsnorm_rotate(q, k, wq, wk, rope, eps=float(np.float32(1e-5)))
    got = rotary.rmsnorm_rotate(q, k, wq, wk, rope, eps=np.float32(1e-5))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(ValueError, match=r"eps must be a finite number > 0, got np.float32\(nan\)"):
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, eps=np.float32("nan"))


# hf.patch: the deferred q_norm / k_norm --------------------------------------------------------------


def _qk_norm_model(model_type: str):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    config = {
        "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=2, head_dim=8, **common),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(num_key_value_heads=2, head_dim=8, **common),
    }[model_type]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norm weights away from their initial 1 (Qwen3) / 0 (Gemma-3)
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.normal_(0.5, 0.3)
    return model


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_patched_norms_called_outside_their_attention_still_normalise(model_type):
    """While patched, q_norm / k_norm defer to the fused call only inside their own attention's forward;
    called anywhere else (an analysis tool, a hook, another module reusing them) they normalise as before,
    instead of silently returning their input."""
    model = _qk_norm_model(model_type)
    attention = model.model.layers[0].self_attn
    x = torch.randn(2, 3, 4, 8)
    want = [attention.q_norm(x), attention.k_norm(x)]
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        logits = model(ids).logits
        rotary.hf.patch(model)
        assert torch.equal(model(ids).logits, logits)
        assert torch.equal(attention.q_norm(x), want[0]) and torch.equal(attention.k_norm(x), want[1])
        rotary.hf.unpatch(model)
    assert not torch.equal(want[0], x)


# rms_norm: the norm it fuses, public as rotary.qk_norm.rms_norm ------------------------------------------


@pytest.mark.parametrize(
    "x,weight",
    [
        (torch.tensor([[3, 4]]), torch.tensor([1, 1])),  # returned [[0, 1]]: the normalised x truncated to int
        (torch.tensor([[True, False]]), torch.tensor([True, True])),
        (torch.ones(2, 2, dtype=torch.complex64), torch.ones(2, dtype=torch.complex64)),  # imaginary part dropped
        (torch.ones(2, 2).to(torch.float8_e4m3fn), torch.ones(2).to(torch.float8_e4m3fn)),
    ],
    ids=["int64", "bool", "complex64", "float8"],
)
def test_rms_norm_refuses_dtypes_it_would_get_wrong(x, weight):
    with pytest.raises(TypeError, match=rf"x must be fp32, bf16, fp16 or fp64, got dtype {x.dtype}"):
        rms_norm(x, weight)


def test_sparse_and_mkldnn_tensors_are_named():
    # a sparse weight made rms_norm return a sparse tensor (qwen3) or fail in torch (gemma3: "add(sparse, dense) is
    # not supported"), and rmsnorm_rotate fail in torch or in the kernel; a sparse q failed in torch
    q, k, wq, wk = _qkw()
    rope = rotary.RoPE(D)
    for weight in (wq.to_sparse(), wq.to_mkldnn()):
        for style in ("qwen3", "gemma3"):
            with pytest.raises(rotary.InputTypeError, match="q_weight must be a dense.*to_dense"):
                rotary.rmsnorm_rotate(q, k, weight, wk, rope, style=style)
            with pytest.raises(rotary.InputTypeError, match="weight must be a dense.*to_dense"):
                rms_norm(q, weight, style=style)
    for x in (q.to_sparse(), q.to_mkldnn()):
        with pytest.raises(rotary.InputTypeError, match="q must be a dense.*to_dense"):
            rotary.rmsnorm_rotate(x, k, wq, wk, rope)
        with pytest.raises(rotary.InputTypeError, match="x must be a dense.*to_dense"):
            rms_norm(x, wq)


def test_rms_norm_of_a_zero_dim_tensor_is_a_named_error():
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., D\] \(at least 1-D\), got a 0-D tensor"):
        rms_norm(torch.tensor(3.0), torch.ones(1))


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_forward_hooks_on_patched_norms_see_and_change_the_normalised_output(model_type):
    """A forward hook on q_norm (an observer, activation steering) saw the unnormalised input while
    patched, and what it returned was normalised again by the fused call: with a hook, that norm runs
    its own forward and the attention rotates the result."""
    model = _qk_norm_model(model_type)
    q_norm = model.model.layers[0].self_attn.q_norm
    seen = []

    def hook(module, args, output):
        seen.append(output.clone())
        return output * 2.0  # steering: changes what the attention rotates

    ids = torch.randint(64, (2, 9))
    handle = q_norm.register_forward_hook(hook)
    with torch.no_grad():
        want = model(ids).logits
        rotary.hf.patch(model)
        got = model(ids).logits
        rotary.hf.unpatch(model)
    handle.remove()
    assert torch.equal(seen[0], seen[1])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
