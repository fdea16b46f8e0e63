"""rotary.rmsnorm_rotate on a GPU: the Triton kernel against the composition (torch's RMSNorm on the GPU, then
rotary's rotation), forward and backward, bf16 and fp32; no host synchronisation; positions outside the table
computed. Skipped without CUDA; run on a GPU machine with
``python -m pytest -q -m cuda tests/test_rmsnorm_rotate_cuda.py`` (a few seconds, most of it Triton compiling).

The kernel sums the squares in Triton's order and torch's CUDA ``rsqrt`` is not correctly rounded either,
so the two differ by a few fp32 ulps of each vector's largest channel; in bf16 that moves a rounding now
and then, by one bf16 ulp. The CPU tests (tests/test_rmsnorm_rotate.py) check the same kernel bit for bit
under Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

import rotary
from rotary.kernels import norm as K
from rotary.qk_norm import rms_norm

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"), pytest.mark.cuda]

B, S, HQ, HK, D = 2, 16, 8, 2, 128
CUDA = torch.device("cuda")


@pytest.fixture
def triton_only(monkeypatch):
    pytest.importorskip("triton")

    run_torch = K.run_torch

    def fail(rotation, *args, **kwargs):  # CPU tensors (the comparisons on the CPU) may take it
        if rotation.xs[0].is_cuda:
            pytest.fail("rmsnorm_rotate took the pure-torch path instead of the Triton kernel")
        return run_torch(rotation, *args, **kwargs)

    monkeypatch.setattr(K, "run_torch", fail)


def _inputs(dtype, seed=0, layout="bhsd"):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    q = (torch.randn(shape(HQ), generator=g, device=CUDA) * 3).to(dtype)
    k = (torch.randn(shape(HK), generator=g, device=CUDA) * 3).to(dtype)
    wq = torch.randn(D, generator=g, device=CUDA).to(dtype)
    wk = torch.randn(D, generator=g, device=CUDA).to(dtype)
    return q, k, wq, wk


def _unfused(q, k, wq, wk, rope, style, **where):
    return rope(rms_norm(q, wq, style=style), rms_norm(k, wk, style=style), **where)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """Within a few fp32 ulps of each vector's largest channel (fp32); for bf16, one bf16 ulp of it, and
    almost every channel equal."""
    scale = want.float().abs().amax(-1, keepdim=True)
    diff = (got.float() - want.float()).abs()
    if dtype == torch.float32:
        assert (diff <= 16 * torch.finfo(torch.float32).eps * scale).all(), diff.max()
    else:
        assert (diff <= 2**-7 * scale).all(), diff.max()
        assert (diff > 0).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("style", ["qwen3", "gemma3"])
def test_forward_equals_the_composition(dtype, style, triton_only):
    rope = rotary.RoPE(D).to(CUDA)
    rope_partial = rotary.RoPE(D, rotary_dim=64, interleaved=True).to(CUDA)
    q, k, wq, wk = _inputs(dtype)
    ids = (torch.arange(S, device=CUDA) + torch.tensor([[0], [100]], device=CUDA)).expand(B, S)
    for r, where in ((rope, {}), (rope, {"position_ids": ids}), (rope_partial, {"offset": 7})):
        got = rotary.rmsnorm_rotate(q, k, wq, wk, r, style=style, **where)
        want = _unfused(q, k, wq, wk, r, style, **where)
        for g, w in zip(got, want):
            assert g.dtype == dtype and g.shape == w.shape
            _close(g, w, dtype)
    cpu = rotary.rmsnorm_rotate(*(t.cpu() for t in (q, k, wq, wk)), rotary.RoPE(D), style=style, position_ids=ids.cpu())
    for g, w in zip(rotary.rmsnorm_rotate(q, k, wq, wk, rope, style=style, position_ids=ids), cpu):
        _close(g.cpu(), w, dtype)


def test_mrope_tables_on_the_gpu(triton_only):
    mrope = rotary.MRoPE(D, mrope_section=[16, 24, 24], base=1e6)
    q, k, wq, wk = _inputs(torch.bfloat16, layout="bshd")
    t = torch.arange(S, device=CUDA).expand(B, S)
    ids = torch.stack([t, t // 4, t % 4])
    got = rotary.rmsnorm_rotate(q, k, wq, wk, mrope, position_ids=ids, layout="bshd")
    want = _unfused(q, k, wq, wk, mrope, "qwen3", position_ids=ids, layout="bshd")
    for g, w in zip(got, want):
        _close(g, w, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backward_equals_the_composition(dtype, triton_only):
    rope = rotary.RoPE(D, rotary_dim=96).to(CUDA)
    inputs = _inputs(dtype, seed=1)
    g = torch.Generator(device="cuda").manual_seed(2)
    gq = torch.randn(inputs[0].shape, generator=g, device=CUDA).to(dtype)
    gk = torch.randn(inputs[1].shape, generator=g, device=CUDA).to(dtype)

    def grads(fn, wide=False):
        leaves = [(t.double() if wide else t).detach().requires_grad_() for t in inputs]
        a, b = fn(*leaves)
        return torch.autograd.grad((a * gq.to(a.dtype)).sum() + (b * gk.to(b.dtype)).sum(), leaves)

    fused = grads(lambda *t: rotary.rmsnorm_rotate(*t, rope, style="gemma3"))
    unfused = grads(lambda *t: _unfused(*t, rope, "gemma3"))
    exact = grads(lambda *t: _unfused(*t, rope, "gemma3"), wide=True)  # float64: the torch path on the GPU
    for name, f, u, e in zip(("q", "k", "q_weight", "k_weight"), fused, unfused, exact):
        assert f.dtype == dtype
        if dtype == torch.float32:  # sums over D (q, k) or B * S * H vectors (weights) in another order
            torch.testing.assert_close(f, u, rtol=1e-4, atol=1e-4 * u.abs().max().item(), msg=name)
        else:  # autograd rounds every intermediate to bf16, the fused backward once: no further from float64
            fused_error, unfused_error = (f.double() - e).abs().max(), (u.double() - e).abs().max()
            assert fused_error <= max(unfused_error, torch.finfo(dtype).eps * e.abs().max()), name


def test_no_host_synchronisation_and_a_cuda_graph(triton_only):
    rope = rotary.RoPE(D).to(CUDA).prepare(4096, device=CUDA)
    q, k, wq, wk = _inputs(torch.bfloat16)
    ids = torch.arange(S, device=CUDA).expand(B, S) + 10
    want = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=ids)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=ids)  # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            out = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, want))


def test_positions_past_the_table_are_computed(triton_only):
    rope = rotary.RoPE(D, max_position=64).to(CUDA).prepare(64, device=CUDA)
    q, k, wq, wk = _inputs(torch.float32)
    ids = torch.arange(S, device=CUDA).expand(B, S).clone()
    ids[1, 3] = 1000
    out = rotary.rmsnorm_rotate(q, k, wq, wk, rope, position_ids=ids)
    want = rotary.rmsnorm_rotate(q.cpu(), k.cpu(), wq.cpu(), wk.cpu(), rotary.RoPE(D), position_ids=ids.cpu())
    for g, w in zip(out, want):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-5)
