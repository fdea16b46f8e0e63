"""The GPU hot path, where a GPU is present: no host synchronisation (``torch.cuda.set_sync_debug_mode``),
CUDA-graph capture with replay equal to eager, ``torch.compile(mode="reduce-overhead")``, and bad
device values as the documented contract (nothing raised, nothing to poll). Skipped without CUDA (CI has none);
run on a GPU machine with
``python -m pytest -q tests/test_cuda.py`` (docs/benchmarks.md says where it was run last).

The same rule is proven on the CPU in ``tests/test_no_sync.py`` (every hot path as on an accelerator,
failing on any host read).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import rotary

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"), pytest.mark.cuda]

B, S, HQ, HK, D = 2, 16, 8, 2, 64
CUDA = torch.device("cuda")


def _inputs(dtype=torch.bfloat16, layout="bhsd", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    return (
        torch.randn(shape(HQ), generator=g, device="cuda").to(dtype),
        torch.randn(shape(HK), generator=g, device="cuda").to(dtype),
    )


def _calls(
    device: torch.device,
) -> dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]], str]]:
    """name -> (call(q, k) -> outputs, layout of q and k), with every tensor the calls hold on ``device``."""
    rope = rotary.RoPE(D).to(device).prepare(4096, device=device)
    rope_i = rotary.RoPE(D, interleaved=True, rotary_dim=48).prepare(4096, device=device)
    ids = torch.arange(S, device=device).expand(B, S) + torch.tensor([[0], [100]], device=device)
    cos, sin = (t.to(device) for t in rope.cos_sin(torch.arange(4096)))
    cos_s, sin_s = cos[:S].clone(), sin[:S].clone()
    offsets = torch.tensor([3, 7], device=device)
    return {
        "rope(q, k)": (lambda q, k: rope(q, k), "bhsd"),
        "rope(q, k, offset)": (lambda q, k: rope(q, k, offset=1234), "bhsd"),
        "rope(q, k, position_ids)": (lambda q, k: rope(q, k, position_ids=ids), "bhsd"),
        "rope interleaved partial, bshd, position_ids": (
            lambda q, k: rope_i(q, k, position_ids=ids, layout="bshd"),
            "bshd",
        ),
        "rope(q, k, inplace)": (lambda q, k: rope(q, k, inplace=True), "bhsd"),
        "apply_rotary, caller tables": (lambda q, k: (rotary.apply_rotary(q, cos_s, sin_s),), "bhsd"),
        "apply_rotary, position_ids": (lambda q, k: (rotary.apply_rotary(q, cos, sin, position_ids=ids),), "bhsd"),
        "apply_rotary, seqlen_offsets": (
            lambda q, k: (rotary.apply_rotary(q, cos, sin, layout="bshd", seqlen_offsets=offsets),),
            "bshd",
        ),
    }


NAMES = [
    "rope(q, k)",
    "rope(q, k, offset)",
    "rope(q, k, position_ids)",
    "rope interleaved partial, bshd, position_ids",
    "rope(q, k, inplace)",
    "apply_rotary, caller tables",
    "apply_rotary, position_ids",
    "apply_rotary, seqlen_offsets",
]  # the keys of _calls(device), which needs a GPU to build for CUDA


@pytest.mark.parametrize("name", NAMES)
def test_hot_path_equals_the_cpu_and_never_synchronises(name):
    call, layout = _calls(CUDA)[name]
    q, k = _inputs(torch.float32, layout)
    want = _calls(torch.device("cpu"))[name][0](q.cpu().clone(), k.cpu().clone())
    call(q.clone(), k.clone())  # warm-up: Triton compiles, tables and flags are made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = call(q.clone(), k.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for g, w in zip(got, want):
        # fp32 on both: the GPU rounds the same products, FMA may contract: within 2 ulp of each other
        torch.testing.assert_close(g.cpu(), w, rtol=3e-7, atol=3e-7)


@pytest.mark.parametrize("name", NAMES)
def test_hot_path_is_captured_in_a_cuda_graph_and_replays_like_eager(name):
    call, layout = _calls(CUDA)[name]
    q, k = _inputs(torch.bfloat16, layout)
    static_q, static_k = q.clone(), k.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture wants
        for _ in range(2):
            call(static_q.clone(), static_k.clone())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    work_q, work_k = static_q.clone(), static_k.clone()
    with torch.cuda.graph(graph):
        outs = call(work_q, work_k)
    for seed in (1, 2):
        new_q, new_k = _inputs(torch.bfloat16, layout, seed=seed)
        work_q.copy_(new_q)
        work_k.copy_(new_k)
        graph.replay()
        want = call(new_q.clone(), new_k.clone())
        for g, w in zip(outs, want):
            assert torch.equal(g, w), name


def test_reduce_overhead_compile_of_rope_with_device_position_ids():
    rope = rotary.RoPE(D).to(CUDA).prepare(4096, device=CUDA)
    ids = torch.arange(S, device=CUDA).expand(B, S).contiguous()
    compiled = torch.compile(lambda q, k, i: rope(q, k, position_ids=i), mode="reduce-overhead", fullgraph=True)
    for seed in range(4):  # cudagraph trees record after warm-up runs
        q, k = _inputs(torch.bfloat16, seed=seed)
        got = compiled(q, k, ids + seed)
        want = rope(q, k, position_ids=ids + seed)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    skips = torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)
    assert skips == 0, dict(torch._dynamo.utils.counters["inductor"])


def test_dynamic_fullgraph_compile_on_cuda():
    rope = rotary.RoPE(D).to(CUDA)
    compiled = torch.compile(lambda q, k: rope(q, k), dynamic=True, fullgraph=True)
    for length in (16, 40):
        q = torch.randn(B, HQ, length, D, device=CUDA)
        k = torch.randn(B, HK, length, D, device=CUDA)
        for g, w in zip(compiled(q, k), rope(q, k)):
            torch.testing.assert_close(g, w)


def test_a_position_past_the_table_is_computed_on_the_gpu_as_on_the_cpu():
    rope = rotary.RoPE(D, max_position=64).to(CUDA).prepare(64, device=CUDA)
    q, k = _inputs(torch.float32)
    ids = torch.arange(S, device=CUDA).expand(B, S).clone()
    for far in (10**6, -3, 2**31 + 7):  # past the 64 prepared rows, or negative: the GPU never reads the ids
        ids[1, -1] = far
        got = rope(q, k, position_ids=ids)
        want = rotary.RoPE(D)(q.cpu(), k.cpu(), position_ids=ids.cpu())
        for g, w in zip(got, want):
            assert not torch.isnan(g).any()
            torch.testing.assert_close(g.cpu(), w, atol=2e-6, rtol=0)


def test_growing_tables_during_capture_is_a_named_error():
    rope = rotary.RoPE(D, max_position=64).to(CUDA).prepare(64, device=CUDA)
    q, k = _inputs(torch.bfloat16)
    rope(q, k)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=r"cannot grow while a CUDA graph is being captured.*prepare\(4016"):
        with torch.cuda.graph(graph):
            rope(q, k, offset=4000)


def test_bad_caller_tables_are_the_caller_s_contract_and_named_with_validate_sync():
    q, _ = _inputs(torch.float32)
    cos, sin = (t.to(CUDA) for t in rotary.RoPE(D).cos_sin(torch.arange(S)))
    rotary.apply_rotary(q, cos, sin, interleaved=True)  # laid out for the half pairing: not read, not raised
    with pytest.raises(ValueError, match="laid out for the half"):
        rotary.apply_rotary(q, cos, sin, interleaved=True, validate="sync")


def test_training_step_gradients_equal_the_cpu():
    rope = rotary.RoPE(D).to(CUDA)
    q, k = _inputs(torch.float32)
    grads = []
    for device in ("cpu", "cuda"):
        ql, kl = q.to(device).requires_grad_(), k.to(device).requires_grad_()
        qr, kr = rope.to(device)(ql * 1, kl * 1, inplace=True)
        (qr.square().sum() + (kr * 2).sum()).backward()
        grads.append((ql.grad.cpu(), kl.grad.cpu()))
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_learnable_frequency_gradients_equal_the_cpu(interleaved, dtype):
    """The table gradients' Triton kernel (heads in blocks, summed per token) against the CPU: the
    frequencies' gradient and q's, for a model's 32 q / 8 k heads over more than one head block."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, 32, S, 128, generator=g).to(dtype)
    k = torch.randn(B, 8, S, 128, generator=g).to(dtype)
    ids = torch.arange(S).expand(B, S) + torch.tensor([[0], [100]])
    grads = []
    for device in ("cpu", "cuda"):
        rope = rotary.RoPE(128, interleaved=interleaved, learnable_frequencies=True).to(device)
        with torch.no_grad():
            rope.log_frequency_scale.copy_(torch.linspace(-0.2, 0.2, 64))
        ql = q.to(device).requires_grad_()
        qr, kr = rope(ql, k.to(device), position_ids=ids.to(device))
        (qr.float().square().sum() + (kr.float() * 2).sum()).backward()
        grads.append((rope.log_frequency_scale.grad.cpu(), ql.grad.float().cpu()))
    (alpha_cpu, q_cpu), (alpha_gpu, q_gpu) = grads
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # sums over 32 + 8 heads and 2 x 16 tokens, in other orders
    torch.testing.assert_close(alpha_gpu, alpha_cpu, rtol=tol, atol=tol * alpha_cpu.abs().max().item())
    torch.testing.assert_close(q_gpu, q_cpu, rtol=tol, atol=tol)


def _serving_inputs(dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, 1, HQ, D, generator=g, device=CUDA).to(dtype)
    k = torch.randn(B, 1, HK, D, generator=g, device=CUDA).to(dtype)
    v = torch.randn(B, 1, HK, D, generator=g, device=CUDA).to(dtype)
    return q, k, v


def _composition(q, k, v, k_cache, v_cache, slots, tables):
    q_rot, k_rot = rotary.rotate([q, k], tables, layout="bshd", kinds=("q", "k"))
    rows = torch.arange(B, device=CUDA)[:, None]
    k_cache[rows, slots] = k_rot
    v_cache[rows, slots] = v
    return q_rot, k_rot


def test_rotate_and_cache_fused_equals_the_composition_eager_compiled_and_captured():
    rope = rotary.RoPE(D).to(CUDA).prepare(4096, device=CUDA)
    slots = torch.tensor([[5], [9]], device=CUDA)
    tables = rope.tables(slots)
    q, k, v = _serving_inputs()
    want_caches = [torch.zeros(B, 16, HK, D, device=CUDA, dtype=torch.bfloat16) for _ in range(2)]
    want = _composition(q, k, v, *want_caches, slots, tables)

    def step(q, k, v, kc, vc, s):
        return rotary.rotate_and_cache(q, k, v, kc, vc, s, rope.tables(s))

    for name, fn in (("eager", step), ("compiled", torch.compile(step, fullgraph=True))):
        caches = [torch.zeros_like(c) for c in want_caches]
        got = fn(q, k, v, *caches, slots)
        for g, w in zip((*got, *caches), (*want, *want_caches)):
            assert torch.equal(g, w), name
    caches = [torch.zeros_like(c) for c in want_caches]
    step(q, k, v, *caches, slots)  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(q, k, v, *caches, slots)
    for c in caches:
        c.zero_()
    graph.replay()
    for g, w in zip((*outs, *caches), (*want, *want_caches)):
        assert torch.equal(g, w), "captured"


def test_rotate_and_cache_skips_a_slot_outside_the_cache():
    rope = rotary.RoPE(D).to(CUDA)
    slots = torch.tensor([[5], [16]], device=CUDA)  # the cache holds 16 rows
    q, k, v = _serving_inputs(torch.float32)
    caches = [torch.zeros(B, 16, HK, D, device=CUDA) for _ in range(2)]
    rotary.rotate_and_cache(q, k, v, *caches, slots, rope.tables(torch.tensor([[5], [7]], device=CUDA)))
    assert caches[0][0, 5].abs().sum() > 0 and caches[0][1].abs().sum() == 0 and caches[1][1].abs().sum() == 0
