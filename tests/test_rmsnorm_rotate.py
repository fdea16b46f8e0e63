"""rotary.rmsnorm_rotate: per-head RMSNorm of q and k, then RoPE, against the unfused composition.

The composition is what users run today: Hugging Face's ``Qwen3RMSNorm`` / ``Gemma3RMSNorm`` on q and on k
(``rotary.qk_norm.rms_norm``, checked equal to them bit for bit below), then rotary's rotation. On the CPU
the fused kernel equals it bit for bit in every dtype: it rounds where the composition rounds and sums the
squares in the order of torch's CPU sum kernel. Gradients are the composition's gradient written out in
fp32: equal to autograd's up to fp32 summation order for fp32 inputs; for bf16/fp16 autograd rounds every
intermediate to the 16-bit dtype and the fused backward does not, so there both are compared with a
float64 gradient. The Triton kernel runs under Triton's interpreter (``TRITON_INTERPRET=1``) in a
subprocess: the interpreter must be on before Triton is imported.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

import rotary
from covering import covering
from helpers import accelerator_rules, run_interpreted
from rotary import plans
from rotary.kernels import norm as K
from rotary.kernels.extension import load_cpu_extension
from rotary.qk_norm import rms_norm

B, S, HQ, HK, D = 2, 7, 4, 2, 16
IDS = torch.tensor([[3, 0, 7, 1, 1, 11, 2], [5, 6, 7, 8, 9, 10, 40]])
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _qk(dtype=torch.float32, layout="bhsd", hq=HQ, hk=HK, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    return (torch.randn(shape(hq), generator=g) * scale).to(dtype), (torch.randn(shape(hk), generator=g) * scale).to(
        dtype
    )


def _weights(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(D, generator=g).to(dtype), torch.randn(D, generator=g).to(dtype)


def _unfused(q, k, wq, wk, style, rope, layout="bhsd", **where):
    """The composition: norm q, norm k, rotate both (rotary's rotation, one call)."""
    nq, nk = rms_norm(q, wq, style=style), rms_norm(k, wk, style=style)
    if isinstance(rope, rotary.RotaryTables):
        return tuple(rotary.rotate([nq, nk], rope, layout=layout, kinds=("q", "k")))
    return rope(nq, nk, layout=layout, **where)


@pytest.fixture
def kernel_only(monkeypatch):
    """Fail if rmsnorm_rotate falls back to the pure-torch composition instead of the compiled kernel."""
    if load_cpu_extension() is None:
        pytest.skip("the compiled CPU kernel is unavailable")

    def fail(*args, **kwargs):
        pytest.fail("rmsnorm_rotate took the pure-torch path instead of the CPU kernel")

    monkeypatch.setattr(K, "run_torch", fail)


# the norm itself ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
def test_rms_norm_is_hugging_faces_bit_for_bit(dtype, style):
    pytest.importorskip("transformers")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    module = Qwen3RMSNorm(100, eps=1e-5) if style == "qwen3" else Gemma3RMSNorm(100, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(torch.randn(100, generator=torch.Generator().manual_seed(0)))
    module.to(dtype)
    x = (torch.randn(3, 5, 100, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    with torch.no_grad():
        assert torch.equal(rms_norm(x, module.weight, eps=1e-5, style=style), module(x))


# forward: the fused kernel equals the composition -------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_forward_equals_the_composition_bit_for_bit(dtype, style, interleaved, layout, kernel_only):
    rope = rotary.RoPE(D, interleaved=interleaved)
    q, k = _qk(dtype, layout)
    wq, wk = _weights(dtype)
    for where in ({}, {"offset": 5}, {"position_ids": IDS}):
        got = rotary.rmsnorm_rotate(q, k, wq, wk, rope, style=style, layout=layout, **where)
        want = _unfused(q, k, wq, wk, style, rope, layout, **where)
        for g, w in zip(got, want):
            assert g.dtype == dtype and g.shape == w.shape
            assert torch.equal(g, w), (where, (g.double() - w.double()).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hk", [1, 4])  # MQA, and as many k heads as q heads
@pytest.mark.parametrize("head_dim,rotary_dim", [(16, 8), (20, 12), (6, 4), (100, 64)])
def test_gqa_and_partial_rotation(dtype, hk, head_dim, rotary_dim, kernel_only):
    """Channels past r are normalised, not rotated; every width: tails of the sum's 8-lane vectors too."""
    g = torch.Generator().manual_seed(2)
    q = (torch.randn(B, S, HQ, head_dim, generator=g) * 3).to(dtype)
    k = (torch.randn(B, S, hk, head_dim, generator=g) * 3).to(dtype)
    wq, wk = torch.randn(head_dim, generator=g).to(dtype), torch.randn(head_dim, generator=g).to(dtype)
    rope = rotary.RoPE(head_dim, rotary_dim=rotary_dim)
    for style in ("qwen3", "gemma3"):
        got = rotary.rmsnorm_rotate(q, k, wq, wk, rope, style=style, layout="bshd", position_ids=IDS)
        want = _unfused(q, k, wq, wk, style, rope, "bshd", position_ids=IDS)
        for x, w, out, expected in zip((q, k), (wq, wk), got, want):
            assert torch.equal(out, expected)
            assert torch.equal(out[..., rotary_dim:], rms_norm(x, w, style=style)[..., rotary_dim:])
            assert not torch.equal(out[..., :rotary_dim], rms_norm(x, w, style=style)[..., :rotary_dim])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rounding_ties_and_special_values_bit_for_bit(dtype, interleaved, kernel_only):
    """The kernel's roundings to bf16/fp16 (the normalised value, the weighted one, the rotated one) are the
    composition's, ties to even included, and so are NaN, inf and overflowing squares. Vectors of ±1
    normalise to ±1 exactly (eps below an fp32 ulp), so an fp32 weight halfway between two 16-bit numbers
    makes the weighted value a tie; both neighbours' parities are covered."""
    head_dim, rotary_dim = 72, 56  # full vectors, a partial one, channels past the rotated ones
    g = torch.Generator().manual_seed(5)
    ulp = torch.finfo(dtype).eps
    grid = 1 + ulp * torch.arange(head_dim, dtype=torch.float32)  # consecutive 16-bit numbers in [1, 2)
    ties = grid + ulp / 2  # halfway to the next: rounds down from an even mantissa, up from an odd one
    x = torch.randint(0, 2, (B, S, 3, head_dim), generator=g).float() * 2 - 1
    x[0, 0, 1] = float("nan")  # one NaN channel poisons its vector
    x[0, 1, 1, 3] = float("inf")
    x[1, 0, 1] = 6e4 if dtype == torch.float16 else 3e38  # squares overflow fp32 for bf16: rstd 0
    x[1, 2, 2] = torch.randn(head_dim, generator=g) * 1e-3  # no tie: ordinary roundings
    x = x.to(dtype)
    q, k = x[:, :, :2], x[:, :, 2:]
    rope = rotary.RoPE(head_dim, rotary_dim=rotary_dim, interleaved=interleaved)
    for style, weight in (("qwen3", ties), ("qwen3", -ties), ("gemma3", ties - 1)):
        got = rotary.rmsnorm_rotate(
            q, k, weight, weight, rope, style=style, layout="bshd", eps=1e-12, position_ids=IDS % 5
        )
        normed = (rms_norm(x, weight, eps=1e-12, style=style) for x in (q, k))
        want = rope(*normed, layout="bshd", position_ids=IDS % 5)
        for out, expected in zip(got, want):  # NaN payloads aside (torch's own conversions differ in them)
            nan = expected.isnan()
            assert torch.equal(out.isnan(), nan), style
            assert torch.equal(out[~nan].view(torch.int16), expected[~nan].view(torch.int16)), (
                style,
                (out != expected).sum(),
            )
        # the ties are there: at position 0 (no rotation) the weighted ±1 rounds half the channels up
        first = got[0][0, 1, 0].float()  # IDS[0, 1] % 5 == 0
        if style == "qwen3":
            assert (first.abs() > weight.abs()).any() and (first.abs() < weight.abs()).any()


def test_views_of_a_fused_projection_and_tables_given(kernel_only):
    """q and k as strided views into one qkv projection (read in place); tables from rope.tables(...)."""
    rope = rotary.RoPE(D)
    qkv = torch.randn(B, S, HQ + 2 * HK, D, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q, k = qkv[:, :, :HQ].transpose(1, 2), qkv[:, :, HQ : HQ + HK].transpose(1, 2)
    wq, wk = _weights(torch.bfloat16)
    tables = rope.tables(IDS)
    got = rotary.rmsnorm_rotate(q, k, wq, wk, tables)
    want = _unfused(q, k, wq, wk, "qwen3", tables)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_fp32_weights_with_bf16_inputs():
    """An fp32 weight (autocast's master weights) with bf16 q: the fp32 product, rounded once to bf16."""
    rope = rotary.RoPE(D)
    q, k = _qk(torch.bfloat16)
    wq, wk = _weights(torch.float32)
    for style in ("qwen3", "gemma3"):
        got = rotary.rmsnorm_rotate(q, k, wq, wk, rope, style=style)
        want = _unfused(q, k, wq, wk, style, rope)
        assert all(g.dtype == torch.bfloat16 and torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("table_dtype", [torch.bfloat16, torch.float16])
def test_16_bit_tables_equal_their_fp32_copies(table_dtype, monkeypatch):
    """A bf16 model's own tables (as rotary.hf passes them): the result, and the gradients, of fp32 copies
    of them, on the CPU kernel and on the pure-torch path (widened there; the Triton kernel widens as it
    loads, checked under the interpreter below)."""
    rope = rotary.RoPE(D)
    cos16, sin16 = (t.to(table_dtype) for t in rope.cos_sin(IDS))
    narrow = rotary.RotaryTables.unchecked(cos16, sin16, False)  # as rotary.hf passes them
    wide = rotary.RotaryTables.from_tensors(cos16.float(), sin16.float(), interleaved=False, validate=False)
    q, k = _qk(torch.bfloat16)
    wq, wk = _weights(torch.bfloat16)
    for pure_torch in (False, True):
        if pure_torch:  # (plans off: a plan recorded above would replay the CPU kernel)
            monkeypatch.setattr(K, "backend", lambda rotation: None)
            monkeypatch.setattr(plans, "plannable", lambda: False)
        got = rotary.rmsnorm_rotate(q, k, wq, wk, narrow)
        want = rotary.rmsnorm_rotate(q, k, wq, wk, wide)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), pure_torch
        grads = []
        for tables in (narrow, wide):
            leaves = [t.detach().requires_grad_() for t in (q, k, wq, wk)]
            a, b = rotary.rmsnorm_rotate(*leaves, tables)
            (a.float().square().sum() + b.float().sum()).backward()
            grads.append([t.grad for t in leaves])
        assert all(torch.equal(a, b) for a, b in zip(*grads)), pure_torch


def test_mrope_positions(kernel_only):
    """M-RoPE: each frequency slot reads the temporal, height or width id; the fused op must use all three
    (a fused kernel that kept only one axis silently lost image grounding elsewhere)."""
    mrope = rotary.MRoPE(D, mrope_section=[2, 3, 3], base=1e4)
    g = torch.Generator().manual_seed(4)
    t = torch.arange(S).expand(B, S)
    ids = torch.stack([t, t + torch.randint(0, 5, (B, S), generator=g), t + torch.randint(0, 5, (B, S), generator=g)])
    q, k = _qk(torch.bfloat16)
    wq, wk = _weights(torch.bfloat16)
    got = rotary.rmsnorm_rotate(q, k, wq, wk, mrope, position_ids=ids, style="gemma3")
    want = _unfused(q, k, wq, wk, "gemma3", mrope, position_ids=ids)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    from_tables = rotary.rmsnorm_rotate(q, k, wq, wk, mrope.tables(ids), style="gemma3")  # per-token [B, S, r]
    assert all(torch.equal(a, b) for a, b in zip(from_tables, want))
    text_only = rotary.rmsnorm_rotate(q, k, wq, wk, mrope, position_ids=t.expand(3, B, S), style="gemma3")
    assert not torch.equal(text_only[0], got[0])  # the height and width ids changed the result


def test_xpos_key_tables(kernel_only):
    """Producers with separate key tables (xPos): k is rotated with its own."""
    xpos = rotary.XPos(D)
    q, k = _qk()
    wq, wk = _weights()
    got = rotary.rmsnorm_rotate(q, k, wq, wk, xpos, position_ids=IDS)
    want = _unfused(q, k, wq, wk, "qwen3", xpos, position_ids=IDS)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("dtype", DTYPES)
def test_pure_torch_path_equals_the_kernel(dtype, monkeypatch):
    """Without the compiled kernel (no C++ compiler) the composition runs: the same results."""
    rope = rotary.RoPE(D, rotary_dim=10)
    q, k = _qk(dtype)
    wq, wk = _weights(dtype)
    for style in ("qwen3", "gemma3"):
        want = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=IDS, style=style)
        with monkeypatch.context() as m:
            m.setattr(K, "load_cpu_extension", lambda: None)
            got = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=IDS, style=style)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_rstd_is_torchs_and_empty_inputs(kernel_only):
    """The kernel's 1 / sqrt(mean(x²) + eps), which the backward reuses, is torch's bit for bit."""
    rope = rotary.RoPE(D)
    q, k = _qk(torch.float32, "bshd")
    wq, wk = _weights()
    tables = rope.tables(torch.arange(S))
    rotation = rotary.kernels.contract.Rotation((q, k), (q, k), (tables.cos,) * 2, (tables.sin,) * 2, None, 0, False)
    _, rstds = K.forward(rotation, K.Norm((wq, wk), 1e-6, False))
    for x, rstd in zip((q, k), rstds):
        assert torch.equal(rstd, torch.rsqrt(x.pow(2).mean(-1) + 1e-6))
    empty_q, empty_k = torch.zeros(2, HQ, 0, D), torch.zeros(2, HK, 0, D)
    out = rotary.rmsnorm_rotate(empty_q, empty_k, wq, wk, rope)
    assert out[0].shape == empty_q.shape and out[1].shape == empty_k.shape


# backward -------------------------------------------------------------------------------------------


def _grads(fn, q, k, wq, wk, gq, gk):
    leaves = [t.detach().requires_grad_() for t in (q, k, wq, wk)]
    a, b = fn(*leaves)
    return (a, b), torch.autograd.grad((a.double() * gq).sum() + (b.double() * gk).sum(), leaves)


@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_fp32_gradients_equal_autograd_through_the_composition(style, layout):
    rope = rotary.RoPE(D, rotary_dim=12, interleaved=True)
    q, k = _qk(torch.float32, layout)
    wq, wk = _weights()
    g = torch.Generator().manual_seed(5)
    gq, gk = (
        torch.randn(q.shape, generator=g, dtype=torch.float64),
        torch.randn(k.shape, generator=g, dtype=torch.float64),
    )
    where = {"position_ids": IDS, "layout": layout}
    fused_out, fused = _grads(lambda *t: rotary.rmsnorm_rotate(*t, rope, style=style, **where), q, k, wq, wk, gq, gk)
    unfused_out, unfused = _grads(
        lambda q, k, wq, wk: _unfused(q, k, wq, wk, style, rope, **where), q, k, wq, wk, gq, gk
    )
    assert all(torch.equal(a, b) for a, b in zip(fused_out, unfused_out))
    for name, a, b in zip(("q", "k", "q_weight", "k_weight"), fused, unfused):
        # the same expression in another association (autograd's chain of ops vs one formula): fp32 rounding
        # of sums over D channels (q, k) or over B * S * H vectors (weights)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def _rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` rounded to ``dtype`` (kept in t's dtype), with the gradient of the identity, as autograd
    differentiates a cast."""
    return t + (t.to(dtype).to(t.dtype) - t).detach()


def _float64_composition(q, k, wq, wk, style, rope, dtype, **where):
    """The composition in float64, rounding to ``dtype`` where the 16-bit forward rounds: its gradient is
    the exact gradient at the values the forward used."""
    ys = []
    for x, w in ((q, wq), (k, wk)):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        ys.append(_rounded(w * _rounded(n, dtype) if style == "qwen3" else n * (1 + w), dtype))
    return rope(*ys, **where)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
def test_16_bit_gradients_are_as_close_to_float64_as_autograds(dtype, style):
    """Autograd through the composition rounds each intermediate gradient to the 16-bit dtype; the fused
    backward computes in fp32 and rounds once. Both against the float64 gradient at the same values."""
    rope = rotary.RoPE(D)
    q, k = _qk(dtype)
    wq, wk = _weights(dtype)
    g = torch.Generator().manual_seed(6)
    # output gradients of the 16-bit dtype: what reaches the outputs (and the float64 reference) in a 16-bit model
    gq, gk = (torch.randn(x.shape, generator=g).to(dtype).double() for x in (q, k))
    _, fused = _grads(lambda *t: rotary.rmsnorm_rotate(*t, rope, position_ids=IDS, style=style), q, k, wq, wk, gq, gk)
    _, unfused = _grads(lambda *t: _unfused(*t, style, rope, position_ids=IDS), q, k, wq, wk, gq, gk)
    wide = [t.double() for t in (q, k, wq, wk)]
    _, exact = _grads(lambda *t: _float64_composition(*t, style, rope, dtype, position_ids=IDS), *wide, gq, gk)
    for name, f, u, e in zip(("q", "k", "q_weight", "k_weight"), fused, unfused, exact):
        fused_error, unfused_error = (f.double() - e).abs().max(), (u.double() - e).abs().max()
        assert fused_error <= unfused_error, (name, fused_error, unfused_error)
        assert fused_error <= torch.finfo(dtype).eps * e.abs().max(), name  # rounded once, to the nearest


@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_float64(style, interleaved):
    rope = rotary.RoPE(8, rotary_dim=6, interleaved=interleaved)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 3, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 1, 8, generator=g, dtype=torch.float64, requires_grad=True)
    wq, wk = (torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    ids = torch.tensor([[0, 4, 2], [9, 9, 1]])
    fn = lambda q, k, wq, wk: rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=ids, style=style, layout="bshd")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, wq, wk))
    assert torch.autograd.gradgradcheck(fn, (q, k, wq, wk))


def test_one_output_used_and_weights_without_grad():
    rope = rotary.RoPE(D)
    q, k = (t.requires_grad_() for t in _qk())
    wq, wk = _weights()
    q_out, _ = rotary.rmsnorm_rotate(q, k, wq, wk, rope)
    q_out.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    assert k.grad is None  # k's output got no gradient: k gets none


def test_learnable_frequencies_take_the_composition():
    """Tables that require grad: the rotation's table gradient is rotary.rotate's; results as unfused."""
    rope = rotary.RoPE(D, learnable_frequencies=True)
    with torch.no_grad():
        rope.log_frequency_scale.uniform_(-0.1, 0.1, generator=torch.Generator().manual_seed(8))
    q, k = _qk()
    wq, wk = _weights()
    out = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=IDS)
    (out[0].sum() + out[1].square().sum()).backward()
    fused = rope.log_frequency_scale.grad.clone()
    rope.log_frequency_scale.grad = None
    want = _unfused(q, k, wq, wk, "qwen3", rope, position_ids=IDS)
    (want[0].sum() + want[1].square().sum()).backward()
    assert all(torch.equal(a, b) for a, b in zip(out, want))
    assert torch.equal(fused, rope.log_frequency_scale.grad) and fused.abs().sum() > 0


def test_key_tables_alone_requiring_grad_get_their_gradient():
    """xPos-style tables where only the keys' tables require grad: their gradient is the composition's
    (the fused kernel carries none, so such tables must take the composition too)."""
    tables = rotary.RoPE(D).tables(rotary.positions.arange(S))
    k_cos, k_sin = ((t * 0.9).requires_grad_() for t in (tables.cos, tables.sin))
    split = rotary.RotaryTables.unchecked(tables.cos, tables.sin, False, k_cos=k_cos, k_sin=k_sin)
    q, k = _qk()
    wq, wk = _weights()
    grads = []
    for fused in (True, False):
        out = rotary.rmsnorm_rotate(q, k, wq, wk, split) if fused else _unfused(q, k, wq, wk, "qwen3", split)
        (out[0].sum() + out[1].square().sum()).backward()
        grads.append((k_cos.grad.clone(), k_sin.grad.clone()))
        k_cos.grad = k_sin.grad = None
    assert all(torch.equal(a, b) for a, b in zip(*grads)) and grads[0][0].abs().sum() > 0


def test_torch_compile_fullgraph_equals_eager():
    rope = rotary.RoPE(D, rotary_dim=12)

    def f(q, k, wq, wk):
        a, b = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=IDS, style="gemma3")
        return (a * 2).sum() + b.square().sum(), a, b

    inputs = [t.requires_grad_() for t in (*_qk(), *_weights())]
    loss, *outs = f(*inputs)
    grads = torch.autograd.grad(loss, inputs)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss_c, *outs_c = compiled(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(outs, outs_c))
    assert all(torch.equal(a, b) for a, b in zip(grads, torch.autograd.grad(loss_c, inputs)))


# no host reads on an accelerator ---------------------------------------------------------------------


def test_reads_nothing_on_an_accelerator_and_gives_the_cpu_result():
    rope = rotary.RoPE(D, rotary_dim=12)
    mrope = rotary.MRoPE(D, mrope_section=[2, 3, 3])
    q, k = _qk(torch.bfloat16)
    wq, wk = _weights(torch.bfloat16)
    calls = {
        "offset": lambda: rotary.rmsnorm_rotate(q, k, wq, wk, rope, offset=100),
        "position_ids": lambda: rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=IDS, style="gemma3"),
        "mrope": lambda: rotary.rmsnorm_rotate(q, k, wq, wk, mrope, position_ids=IDS.expand(3, B, S)),
        "tables": lambda: rotary.rmsnorm_rotate(q, k, wq, wk, rope.tables(rotary.positions.arange(S))),
    }
    for name, call in calls.items():
        want = call()
        with accelerator_rules():
            got = call()
        assert all(torch.equal(a, b) for a, b in zip(got, want)), name
    leaves = [t.detach().requires_grad_() for t in (q, k, wq, wk)]
    with accelerator_rules():  # the backward too
        a, b = rotary.rmsnorm_rotate(*leaves, rope, position_ids=IDS)
        (a.float().sum() + b.float().sum()).backward()
    assert all(t.grad is not None for t in leaves)


# bad input ------------------------------------------------------------------------------------------


def test_bad_input_is_a_named_error():
    rope = rotary.RoPE(D)
    q, k = _qk()
    wq, wk = _weights()
    call = lambda **kw: rotary.rmsnorm_rotate(  # noqa: E731
        *kw.pop("qk", (q, k)), kw.pop("wq", wq), kw.pop("wk", wk), kw.pop("rope", rope), **kw
    )
    cases = [
        (ValueError, r"q_weight must be \[D\] = \[16\].*got shape \(15,\)", dict(wq=torch.ones(15))),
        (
            ValueError,
            r"k_weight must be \[D\] = \[16\].*got shape \(32,\) \(32 = 2 heads x 16: a norm over all heads",
            dict(wk=torch.ones(32)),
        ),
        (ValueError, r"eps must be a finite number > 0, got 0", dict(eps=0)),
        (ValueError, r"eps must be a finite number > 0, got -1e-06", dict(eps=-1e-6)),
        (ValueError, r"eps must be a finite number > 0, got nan", dict(eps=float("nan"))),
        (ValueError, r"eps must be a finite number > 0, got inf", dict(eps=float("inf"))),
        (
            TypeError,
            r"eps must be a Python number > 0 \(e.g. config.rms_norm_eps\), got a tensor",
            dict(eps=torch.tensor(1e-6)),
        ),
        (
            TypeError,
            r"q and k must share a dtype, got torch.float32 for q and torch.bfloat16 for k",
            dict(qk=(q, k.bfloat16())),
        ),
        (
            TypeError,
            r"k_weight has dtype torch.float16 but the tensor it normalises has torch.float32",
            dict(wk=wk.half()),
        ),
        (ValueError, r"style must be one of 'qwen3', 'gemma3', got 'olmo'", dict(style="olmo")),
        (ValueError, r"unknown layout 'bsdh'", dict(layout="bsdh")),
        (ValueError, r"this RoPE was built for head_dim=32", dict(rope=rotary.RoPE(32))),
        (
            ValueError,
            r"rope is RotaryTables, which already say where each token is",
            dict(rope=rope.tables(torch.arange(S)), offset=3),
        ),
        (TypeError, r"rope must be a table producer .* got Tensor", dict(rope=torch.ones(S, D))),
        (ValueError, r"need the same B, S and D", dict(qk=(q, k[:, :, :3]))),
        (ValueError, r"q must be 4-D", dict(qk=(q[0], k))),
    ]
    for error, message, kwargs in cases:
        with pytest.raises(error, match=message):
            call(**kwargs)


# the Triton kernel, under Triton's interpreter -------------------------------------------------------

#: the sizes of the two loops' factors below: every 3 of them in all their combinations (tests/covering.py)
SIZES = [
    (range(3), range(2), range(2), range(2), range(3), range(2)),
    (range(3), range(2), range(2), range(2), range(2)),
]
INTERPRETED = textwrap.dedent(
    """
    import itertools, torch
    from covering import covering
    from rotary import devices
    from rotary.kernels import norm as K
    from rotary.kernels.contract import Rotation
    from rotary.kernels.eager import rotate_torch, run_torch
    from rotary.tables import cos_sin_table

    def truncated(t):  # the interpreter casts fp32 -> bf16 by truncation (a GPU rounds to nearest even)
        return (t.float().view(torch.int32) & -65536).view(torch.float32)

    gen = torch.Generator().manual_seed(0)
    checked = 0
    for dtype, interleaved, (D, r), gemma, positions_kind, tables_kind in covering(
        (torch.float32, torch.bfloat16, torch.float64), (False, True), ((8, 8), (10, 6)), (False, True),
        ("none", "per_batch", "stacked"), ("shared", "separate_k"),
    ):
        B, S, Hq, Hk = 2, 2, 3, 1  # b and s take two values each: every offset term is exercised
        base = torch.randn(B, S, Hq + Hk + 2, D, generator=gen).to(dtype) * 3  # a fused qkv: strided views
        q, k = base[:, :, :Hq], base[:, :, Hq : Hq + Hk]
        compute = K.compute_dtype(q)
        inv = torch.rand(r // 2, generator=gen) + 0.1
        cos, sin = cos_sin_table(torch.arange(9), inv, interleaved=interleaved, dtype=compute)
        k_cos, k_sin = (cos * 0.5, sin * 0.5) if tables_kind == "separate_k" else (cos, sin)
        if positions_kind == "none":
            positions, batch_rows = None, 0
        elif positions_kind == "per_batch":
            positions, batch_rows = torch.randint(0, 9, (B, S), generator=gen), 0
        else:  # stacked per-batch tables [B * S, r], row b * S + s
            positions, batch_rows = None, S
        weights = tuple(torch.randn(D, generator=gen).to(dtype) for _ in range(2))
        rotation = Rotation((q, k), (q, k), (cos, k_cos), (sin, k_sin), positions, batch_rows, interleaved)
        outs = tuple(torch.empty_like(x) for x in (q, k))
        rstds = tuple(x.new_empty(x.shape[:3], dtype=compute) for x in (q, k))
        factors = [K.effective_weight(w, gemma, compute) for w in weights]
        v_before = base[:, :, Hq + Hk :].clone()
        # the kernel takes the weights as given (widening them and forming Gemma's 1 + w itself); the
        # composition below multiplies by the factors effective_weight forms on the other paths
        K.run_triton(rotation.replace(outs=outs), list(weights), rstds, not gemma, 1e-6)
        assert torch.equal(base, torch.cat((q, k, v_before), dim=2))  # inputs (and v beside them) untouched
        # the composition with the kernel's rstd (the sum of squares is Triton's, in its own order) is
        # the kernel's output bit for bit: every other rounding is the composition's
        rnd = truncated if dtype == torch.bfloat16 else (lambda t: t)
        for i, (x, out, rstd, w) in enumerate(zip((q, k), outs, rstds, factors)):
            n = x.to(compute) * rstd[..., None]
            if not gemma:
                n = rnd(n)
            y = rnd(w * n)
            c, s_ = rotation.cos_sin(i)
            if positions is not None:
                c, s_ = c[positions], s_[positions]
            else:
                c = c[: (B if batch_rows else 1) * S].unflatten(0, (-1, S))
                s_ = s_[: (B if batch_rows else 1) * S].unflatten(0, (-1, S))
            want = rnd(rotate_torch(y, c[:, :, None], s_[:, :, None], interleaved=interleaved, inplace=False))
            assert torch.equal(out.to(compute), want), (dtype, interleaved, D, r, gemma, positions_kind, tables_kind, i)
            # and the sum of squares is within an ulp or two of torch's
            exact = torch.rsqrt(x.to(compute).pow(2).mean(-1) + 1e-6)
            ulp = torch.finfo(compute).eps
            assert ((rstd - exact).abs() <= 2 * ulp * exact).all(), (dtype, (rstd - exact).abs().max())
        # against the pure-torch composition (fp32, fp64: bf16 rounds otherwise here): an rstd an ulp or two
        # away moves each channel by a few ulps of the vector's largest
        if dtype != torch.bfloat16:
            expected = tuple(torch.empty_like(x) for x in (q, k))
            K.run_torch(rotation.replace(outs=expected), K.Norm(weights, 1e-6, gemma), tuple(torch.empty_like(r) for r in rstds))
            for out, e in zip(outs, expected):
                bound = 4 * torch.finfo(dtype).eps * e.abs().amax(-1, keepdim=True)
                assert ((out - e).abs() <= bound).all(), (dtype, (out - e).abs().max())
        checked += 1

    # positions outside the table: NaN in the rotated channels (the caller's contract), nothing else
    devices.host_checks = lambda device: False
    x = torch.randn(2, 3, 2, 4, generator=gen)
    k = torch.randn(2, 3, 1, 4, generator=gen)
    cos, sin = cos_sin_table(torch.arange(5), torch.tensor([1.0, 0.1]))
    positions = torch.tensor([[0, 4, 5], [-1, 2, 100]])
    outside = torch.tensor([[False, False, True], [True, False, True]])
    outs = (torch.empty_like(x), torch.empty_like(k))
    rstds = (x.new_empty(x.shape[:3]), k.new_empty(k.shape[:3]))
    rotation = Rotation((x, k), outs, (cos, cos), (sin, sin), positions, 0, False)
    K.run_triton(rotation, [torch.ones(4), torch.ones(4)], rstds, True, 1e-6)
    for out in outs:
        assert torch.isnan(out[outside]).all() and not torch.isnan(out[~outside]).any()

    # a 16-bit model's own tables (rotary.hf's QK-norm path on CUDA) reach the kernel as they are, which
    # widens them as it loads them: the result is that of fp32 copies, bit for bit
    import rotary
    from rotary.tables import RotaryTables

    seen = []
    launch = K.run_triton
    K.run_triton = lambda rotation, *a: (seen.append(rotation.cos[0].dtype), launch(rotation, *a))[1]
    K.backend = lambda rotation: "triton"  # as for CUDA tensors
    narrow = 0
    for dtype, table_dtype, interleaved, r, gemma in covering(
        (torch.float32, torch.bfloat16, torch.float16), (torch.bfloat16, torch.float16), (False, True), (8, 6),
        (False, True),
    ):
        rope = rotary.RoPE(8, interleaved=interleaved, rotary_dim=r)
        cos16, sin16 = (t.to(table_dtype) for t in rope.cos_sin(torch.tensor([[4, 0, 9], [1, 1, 7]])))  # [B, S, r]
        q = (torch.randn(2, 3, 3, 8, generator=gen) * 3).to(dtype)
        k = (torch.randn(2, 1, 3, 8, generator=gen) * 3).to(dtype)
        wq, wk = (torch.randn(8, generator=gen).to(dtype) for _ in range(2))
        style = "gemma3" if gemma else "qwen3"
        seen.clear()
        got = rotary.rmsnorm_rotate(q, k, wq, wk, RotaryTables.unchecked(cos16, sin16, interleaved), style=style)
        assert seen == [table_dtype], seen  # no widened copies on the way
        wide = RotaryTables.from_tensors(cos16.float(), sin16.float(), interleaved=interleaved, validate=False)
        want = rotary.rmsnorm_rotate(q, k, wq, wk, wide, style=style)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (dtype, table_dtype, interleaved, r, gemma)
        narrow += 1
    print("checked", checked, "narrow", narrow)
    """
)


@pytest.mark.slow
def test_triton_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    stdout = run_interpreted(INTERPRETED, timeout=900)
    assert f"checked {len(covering(*SIZES[0]))} narrow {len(covering(*SIZES[1]))}" in stdout
