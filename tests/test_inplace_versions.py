"""In-place writes by rotary's kernels move the tensors' version counters, as torch's own in-place ops do.

A kernel writes through a tensor's memory, which autograd does not see. Without the version bump, a
backward that saved the tensor before an in-place rotation under ``torch.no_grad()`` (or a cache write)
silently used the new values; with it, autograd raises its usual "modified by an inplace operation"
error. Checked for every in-place entry point on the CPU, and for the CUDA branches (the decoding fast
path, the fused cache write, vLLM's form) under Triton's interpreter.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

import rotary
from helpers import run_interpreted

ROPE = rotary.RoPE(8)
IDS = torch.tensor([[0, 1, 2]])


def _saved_then_written(write):
    """q saved for a backward, then ``write(q, k)`` under no_grad; the backward's error, or None."""
    x = torch.randn(1, 2, 3, 8, requires_grad=True)
    q, k = x * 1, x[:, :1] * 1
    loss = (q * q).sum()  # saves q
    with torch.no_grad():
        write(q, k)
    try:
        loss.backward()
    except RuntimeError as error:
        return str(error)
    return None


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda q, k: ROPE(q, k, inplace=True), id="rope, a recorded plan"),
        pytest.param(lambda q, k: ROPE(q, k, position_ids=IDS, inplace=True), id="rope with position ids"),
        pytest.param(lambda q, k: rotary.rotate([q, k], ROPE.tables(torch.arange(3)), inplace=True), id="rotate"),
        pytest.param(
            lambda q, k: rotary.apply_rotary(q, *ROPE.cos_sin(torch.arange(3)), inplace=True), id="apply_rotary"
        ),
        pytest.param(lambda q, k: ROPE.rotate(q, inplace=True), id="RoPE.rotate"),
    ],
)
def test_an_in_place_rotation_under_no_grad_invalidates_what_a_backward_saved(write):
    error = _saved_then_written(write)
    assert error is not None and "modified by an inplace operation" in error


def test_writing_a_kv_cache_invalidates_what_a_backward_saved_of_it():
    k_cache, v_cache = torch.zeros(1, 4, 1, 8, requires_grad=True), torch.zeros(1, 4, 1, 8)
    cache = k_cache * 1  # a non-leaf cache a backward reads
    loss = (cache * cache).sum()
    q, k, v = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    with torch.no_grad():
        rotary.rotate_and_cache(q, k, v, cache, v_cache, torch.tensor([[2]]), ROPE.tables(torch.tensor([[2]])))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


CUDA_BRANCHES = textwrap.dedent(
    """
    import torch, rotary
    from rotary import devices, serving

    devices.host_checks = lambda device: False  # as on an accelerator
    serving._fused_kernel_device = lambda q: True  # the CUDA branches, run by Triton's interpreter
    rope = rotary.RoPE(8)
    cos, sin = rope.cos_sin(torch.arange(16))
    cache_form = torch.cat((cos[:, :4], sin[:, :4]), dim=-1)

    def check(name, write, caches=False):
        x = torch.randn(1, 3, 2, 8, requires_grad=True)
        q, k = x * 1, x[:, :, :1] * 1
        k_cache = torch.zeros(1, 6, 1, 8, requires_grad=True) * 1
        saved = k_cache if caches else q
        loss = (saved * saved).sum()
        with torch.no_grad():
            write(q, k, k_cache)
        try:
            loss.backward()
        except RuntimeError as error:
            assert "modified by an inplace operation" in str(error), (name, error)
            print("raised", name)
            return
        raise AssertionError(name + ": the backward used the written values")

    slots = torch.tensor([[0, 1, 2]])
    v = torch.randn(1, 3, 1, 8)
    check("fused cache write, in place", lambda q, k, c: rotary.rotate_and_cache(
        q, k, v, c, torch.zeros(1, 6, 1, 8), slots, rope.tables(slots), inplace=True))
    check("fused cache write, the cache", lambda q, k, c: rotary.rotate_and_cache(
        q, k, v, c, torch.zeros(1, 6, 1, 8), slots, rope.tables(slots)), caches=True)
    check("vLLM form, the cache", lambda q, k, c: rotary.rotate_and_cache(
        q, k, v, c, torch.zeros(1, 6, 1, 8), slots, positions=slots, cos_sin_cache=cache_form), caches=True)
    check("vLLM form, in place", lambda q, k, c: rotary.rotate_and_cache(
        q, k, v, c, torch.zeros(1, 6, 1, 8), slots, positions=slots, cos_sin_cache=cache_form, inplace=True))
    """
)


@pytest.mark.slow
def test_the_cuda_branches_move_the_versions_too():
    pytest.importorskip("triton")
    stdout = run_interpreted(CUDA_BRANCHES)
    assert stdout.count("raised ") == 4, stdout


@pytest.mark.parametrize("form", ["tables", "cos_sin_cache"])
def test_the_cpu_kernel_s_cache_write_invalidates_what_a_backward_saved_of_the_cache(form, monkeypatch):
    # a cache that needs no gradient, read by a backward (the gradient of w needs it): the one-pass C++
    # kernel writes it through its memory
    from rotary import serving

    taken = []
    real = serving._cpu_kernel
    monkeypatch.setattr(serving, "_cpu_kernel", lambda *a: (taken.append(1), real(*a))[1])
    if real(*(torch.zeros(1),) * 6) is None:
        pytest.skip("the CPU extension is not built here")
    k_cache, v_cache = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 1, 8)
    w = torch.randn(1, 4, 1, 8, requires_grad=True)
    loss = (w * k_cache).sum()  # saves k_cache
    q, k, v = torch.randn(1, 1, 2, 8), torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    slots = torch.tensor([[2]])
    if form == "tables":
        rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, ROPE.tables(slots))
    else:
        cos, sin = ROPE.cos_sin(torch.arange(8))
        cache_form = torch.cat((cos[:, :4], sin[:, :4]), dim=-1)
        rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, positions=slots, cos_sin_cache=cache_form)
    assert taken and k_cache[0, 2].abs().sum() > 0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
