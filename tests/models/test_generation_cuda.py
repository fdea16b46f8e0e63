"""On CUDA (skipped elsewhere): attention and decoding without host synchronisation, captured in CUDA graphs.

A tiny fp32 model, so the whole file takes seconds of GPU time plus two torch.compile runs:

- every hot call under ``torch.cuda.set_sync_debug_mode("error")`` (a synchronisation raises);
- one decoding step recorded in a ``torch.cuda.CUDAGraph``: replays give the eager step's tokens;
- the step compiled with ``torch.compile(mode="reduce-overhead")``: the same;
- ``generate(capture="cuda_graph" | "compile")``: today's eager greedy tokens;
- bad input on CUDA: the documented contract (ids outside the vocabulary embedded as 0, tokens past a
  static cache NaN), never a crash and nothing to poll.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from rotary.models import Decoder, DecoderConfig
from rotary.nn import KVCache, StaticKVCache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

CUDA = torch.device("cuda")
PROMPT, SLOTS = 8, 64  # the static caches below: 64 slots, as generate(capture=...) makes for these prompts


def tiny() -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, max_position=256)
    model = Decoder(config).to(CUDA).eval()
    model.rope.prepare(256, device=CUDA)  # tables sized before any capture (they cannot grow inside one)
    return model


def prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """ids ``[2, 8]`` on CUDA, row 0 left-padded by 3."""
    ids = torch.randint(1, 64, (2, PROMPT), generator=torch.Generator().manual_seed(0)).to(CUDA)
    mask = torch.ones(2, PROMPT, dtype=torch.long, device=CUDA)
    mask[0, :3] = 0
    return ids, mask


@contextlib.contextmanager
def no_sync():
    """A synchronising CUDA call inside raises (``torch.cuda.set_sync_debug_mode("error")``)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_no_host_synchronisation():
    model = tiny()
    ids, mask = prompt()
    attn = model.layers[0].attn
    x = torch.randn(2, PROMPT, 64, device=CUDA)
    generated = []

    @torch.no_grad()
    def run() -> None:
        attn(x, attention_mask=mask)
        grown = KVCache()
        attn(x, cache=grown)
        attn(x[:, :1], cache=grown)
        static = StaticKVCache(2, 2, SLOTS, 16, device=CUDA)
        attn(x, attention_mask=mask, cache=static)
        attn(x[:, :1], cache=static)
        model(ids)
        model(ids, attention_mask=mask)
        caches = model.new_cache(batch=2, max_len=SLOTS)
        model(ids, attention_mask=mask, cache=caches)
        model.decode_step(ids[:, :1], caches)
        for cache in ("dynamic", "static"):
            generated.append(model.generate(ids, 4, attention_mask=mask, cache=cache))
            sampler = torch.Generator(device=CUDA).manual_seed(0)
            generated.append(
                model.generate(ids, 4, attention_mask=mask, cache=cache, temperature=1.0, generator=sampler)
            )

    run()  # warm-up: kernel compilation, library handles
    with no_sync():
        run()
    assert torch.equal(generated[4], generated[6]) and torch.equal(generated[5], generated[7])  # dynamic vs static


def test_decode_step_in_a_cuda_graph_replays_the_eager_step():
    model = tiny()
    ids, mask = prompt()
    captured, eager = model.new_cache(batch=2, max_len=SLOTS), model.new_cache(batch=2, max_len=SLOTS)
    token = torch.zeros(2, 1, dtype=torch.int64, device=CUDA)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture
            for _ in range(2):
                model.decode_step(token, captured)
        torch.cuda.current_stream().wait_stream(side)
        for cache in captured:
            cache.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = model.decode_step(token, captured)
        first = model(ids, attention_mask=mask, cache=captured)[:, -1]
        torch.testing.assert_close(first, model(ids, attention_mask=mask, cache=eager)[:, -1])
        following = first.argmax(-1, keepdim=True)
        for _ in range(6):
            token.copy_(following)
            graph.replay()
            expected = model.decode_step(following, eager)
            torch.testing.assert_close(logits, expected)
            assert torch.equal(logits.argmax(-1), expected.argmax(-1))
            following = expected.argmax(-1, keepdim=True)
    assert int(captured[0].filled) == int(eager[0].filled) == PROMPT + 6
    torch.testing.assert_close(captured[1].keys, eager[1].keys)


def test_reduce_overhead_compile_of_the_step():
    model = tiny()
    ids, mask = prompt()
    compiled = torch.compile(model.decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)
    caches, eager = model.new_cache(batch=2, max_len=SLOTS), model.new_cache(batch=2, max_len=SLOTS)
    with torch.no_grad():
        following = model(ids, attention_mask=mask, cache=caches)[:, -1:].argmax(-1)
        model(ids, attention_mask=mask, cache=eager)
        for _ in range(6):  # warm-up, recording, then replays
            torch.compiler.cudagraph_mark_step_begin()
            got = compiled(following, caches).clone()
            expected = model.decode_step(following, eager)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            assert torch.equal(got.argmax(-1), expected.argmax(-1))
            following = expected.argmax(-1, keepdim=True)
    assert int(caches[0].filled) == PROMPT + 6


def test_generate_with_capture_equals_eager_generation():
    model = tiny()
    ids, mask = prompt()
    expected = model.generate(ids, 12, attention_mask=mask)
    for capture in ("cuda_graph", "compile"):
        for _ in range(2):  # the second call reuses the captured step
            assert model.generate(ids, 12, attention_mask=mask, capture=capture).equal(expected), capture
    model.release_captured()


def test_bad_input_on_cuda_is_the_documented_contract_not_a_crash():
    model = tiny()
    ids, _ = prompt()
    bad = ids.clone()
    bad[1, 2] = 1000
    with torch.no_grad():
        logits = model(bad)
    assert torch.isfinite(logits).all()
    attn = model.layers[0].attn
    cache = StaticKVCache(2, 2, 4, 16, device=CUDA)
    with torch.no_grad():
        attn(torch.randn(2, 3, 64, device=CUDA), cache=cache)
        out = attn(torch.randn(2, 3, 64, device=CUDA), cache=cache)
    assert torch.isfinite(out[:, 0]).all() and torch.isnan(out[:, 1:]).all()
