"""Decoder on static caches: the same tokens as today's eager generation, nothing read per token off the CPU.

``helpers.accelerator_rules`` runs the model on CPU tensors as on an accelerator and fails on any host
read: the proof, on this machine, that ``forward``, ``decode_step`` and ``generate`` do not synchronise.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from helpers import accelerator_rules, use_static_write
from rotary.models import Decoder, DecoderConfig
from rotary.models.decoder import next_token
from rotary.nn import KVCache, StaticKVCache

CPU = torch.device("cpu")
ENCODINGS = ["rope", "alibi", "rope_relative", "xpos", "learned", "none"]


def small(position_encoding="rope", **kw) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(
        **{
            "vocab_size": 50,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "max_position": 64,
            "position_encoding": position_encoding,
            **kw,
        }
    )
    return Decoder(config).eval()


def prompt(batch=3, length=6, seed=0):
    """ids ``[batch, length]`` (ids 1 .. 49) and a mask that left-pads row 0 by 3 and row 1 by 1."""
    ids = torch.randint(1, 50, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, :3] = 0
    mask[1, :1] = 0
    return ids, mask


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_static_forward_equals_dynamic_bit_for_bit(encoding):
    model = small(encoding)
    ids, mask = prompt()
    with torch.no_grad():
        dynamic, static = model.new_cache(), model.new_cache(batch=3, max_len=12)
        expected = [model(ids, attention_mask=mask, cache=dynamic)]
        got = [model(ids, attention_mask=mask, cache=static)]
        token = expected[0][:, -1:].argmax(-1)
        full = mask
        for _ in range(5):
            full = torch.cat((full, torch.ones_like(token)), dim=1)
            expected.append(model(token, attention_mask=full, cache=dynamic))
            got.append(model(token, cache=static))  # the static cache remembers the padding
            token = expected[-1][:, -1:].argmax(-1)
    assert torch.equal(torch.cat(got, dim=1), torch.cat(expected, dim=1))
    assert torch.equal(static[1].keys[:, :, :11], dynamic[1].keys)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_generate_variants_equal_todays_generation(encoding):
    model = small(encoding)
    ids, mask = prompt()
    expected = model.generate(ids, 8, attention_mask=mask)
    assert expected.shape == (3, 14) and expected[:, :6].equal(ids)
    assert model.generate(ids, 8, attention_mask=mask, cache="static").equal(expected)
    assert model.generate(ids, 8, attention_mask=mask, use_cache=False).equal(expected)
    with accelerator_rules():  # the every-slot attention, nothing read
        monitored = model.generate(ids, 8, attention_mask=mask, cache="static")
    assert monitored.equal(expected)


def decode_logits_and_tokens(model, ids, mask, steps=5):
    """The logits of a static-cache prefill and ``steps`` decoding steps (greedy), and ``generate``'s tokens."""
    with torch.no_grad():
        cache = model.new_cache(batch=ids.shape[0], max_len=ids.shape[1] + steps)
        logits = [model(ids, attention_mask=mask, cache=cache)[:, -1].float()]
        for _ in range(steps):
            logits.append(model.decode_step(logits[-1].argmax(-1, keepdim=True), cache))
    return logits, model.generate(ids, steps + 1, attention_mask=mask, cache="static")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotation", ["full", "partial"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("every_slot", [False, True])
def test_static_decoding_rotates_and_caches_in_one_call_bit_for_bit(
    dtype, rotation, interleaved, every_slot, monkeypatch
):
    """Every layer hands q, k and v to one rotate_and_cache call, and the logits and tokens are those of
    rotating, then copying k and v into the cache (GQA: 4 query heads, 2 KV heads), on the CPU's
    filled-slot path and on the every-slot path of accelerators."""
    scaling = {"rope_type": "default", "partial_rotary_factor": 0.5} if rotation == "partial" else None
    model = small(rope_interleaved=interleaved, rope_scaling=scaling).to(dtype)
    ids, mask = prompt()
    results = {}
    for path in ("rotate_then_copy", "fused"):
        calls = use_static_write(monkeypatch, path)
        if every_slot:
            with accelerator_rules():
                results[path] = decode_logits_and_tokens(model, ids, mask)
        else:
            results[path] = decode_logits_and_tokens(model, ids, mask)
        assert len(calls) == 2 * (6 + 6)  # 2 layers x (prefill + 5 steps, and generate's prefill + 5 steps)
    (logits, tokens), (want_logits, want_tokens) = results["fused"], results["rotate_then_copy"]
    for got, want in zip(logits, want_logits):
        assert torch.equal(got, want)
    assert tokens.equal(want_tokens)
    if not every_slot:  # and the CPU's static path is still the dynamic cache's, bit for bit
        assert tokens.equal(model.generate(ids, 6, attention_mask=mask))


def test_sampling_is_multinomial_and_equal_across_caches():
    model = small()
    ids, mask = prompt()
    kwargs = dict(attention_mask=mask, temperature=0.8, top_k=10)
    dynamic = model.generate(ids, 8, generator=torch.Generator().manual_seed(3), **kwargs)
    static = model.generate(ids, 8, cache="static", generator=torch.Generator().manual_seed(3), **kwargs)
    assert static.equal(dynamic)
    assert not dynamic.equal(model.generate(ids, 8, generator=torch.Generator().manual_seed(4), **kwargs))
    # next_token draws what torch.multinomial draws from the same generator, without its host check
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    probs = ((logits - logits.max(-1, keepdim=True).values) / 0.7).softmax(-1)
    for seed in range(10):
        drawn = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))
        assert next_token(logits, temperature=0.7, generator=torch.Generator().manual_seed(seed)).equal(drawn)


def test_top_k_keeps_the_k_most_likely():
    logits = torch.arange(10.0).repeat(64, 1)
    drawn = next_token(logits, temperature=5.0, top_k=3, generator=torch.Generator().manual_seed(0))
    assert set(drawn.flatten().tolist()) <= {7, 8, 9} and len(set(drawn.flatten().tolist())) > 1


def test_eos_rows_emit_the_pad_id_on_the_device():
    model = small()
    ids, mask = prompt()
    free = model.generate(ids, 8, attention_mask=mask)
    eos = int(free[0, 8])  # the third new token of row 0
    for cache in ("dynamic", "static"):
        with accelerator_rules():
            out = model.generate(ids, 8, attention_mask=mask, cache=cache, eos_token_id=eos, pad_token_id=0)
        for row in range(3):
            new, reference = out[row, 6:].tolist(), free[row, 6:].tolist()
            if eos in reference:
                stop = reference.index(eos)
                assert new == reference[: stop + 1] + [0] * (7 - stop)
            else:
                assert new == reference
    assert out[0, 8] == eos and (out[0, 9:] == 0).all()


def test_no_host_read_per_token_off_the_cpu():
    """forward (plain, padded, both caches), decode_step and generate read nothing under accelerator_rules;
    nothing is left to poll: no flag is read back at the end."""
    model = small()
    ids, mask = prompt()
    with torch.no_grad(), accelerator_rules():
        model(ids)
        model(ids, attention_mask=mask)
        dynamic = model.new_cache()
        model(ids, attention_mask=mask, cache=dynamic)
        model(ids[:, :1], attention_mask=torch.cat((mask, torch.ones(3, 1, dtype=torch.long)), dim=1), cache=dynamic)
        static = model.new_cache(batch=3, max_len=8)
        model(ids, attention_mask=mask, cache=static)
        step = model.decode_step(ids[:, :1], static)
        for cache in ("dynamic", "static"):
            model.generate(ids, 6, attention_mask=mask, cache=cache)
            model.generate(
                ids, 6, attention_mask=mask, cache=cache, temperature=1.0, generator=torch.Generator().manual_seed(0)
            )
    assert step.shape == (3, 50) and step.dtype == torch.float32


def test_out_of_vocabulary_ids_off_the_cpu_are_embedded_as_zero():
    model = small()
    ids, _ = prompt()
    ids = ids.clamp(2, 47)
    bad = ids.clone()
    bad[0, 2], bad[2, 4] = 50 + 7, -3  # clamped to 49 and 0
    with torch.no_grad(), accelerator_rules():  # nothing read: the documented contract, never a read past the table
        got = model(bad)
    # the same as a model whose rows 0 and 49 are zero, fed the clamped ids
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.embed_tokens.weight[[0, 49]] = 0.0
        expected = zeroed(bad.clamp(0, 49))
    assert torch.equal(got, expected)
    assert not torch.equal(got, model(bad.clamp(0, 49)).detach())
    with pytest.raises(ValueError, match="input_ids hold id -3"):
        model(bad)  # the CPU: at once


def test_generate_prompt_checks_are_named_on_the_cpu_and_the_contract_off_it():
    model = small()
    ids, mask = prompt()
    right = mask.flip(1)  # padding after the tokens
    bad = ids.clone()
    bad[1, 3] = 99
    with accelerator_rules():  # nothing read, nothing raised or left to poll
        assert model.generate(ids, 3, attention_mask=right, cache="static").shape == (3, 9)
        assert model.generate(bad, 3).shape == (3, 9)
    with pytest.raises(ValueError, match="input_ids hold id 99"):
        model.generate(bad, 3)
    with pytest.raises(ValueError, match=r"generate needs left padding, but row\(s\) \[0, 1\]"):
        model.generate(ids, 3, attention_mask=right)


def test_learned_positions_past_the_table_off_the_cpu_are_nan():
    model = small("learned")  # max_position 64
    ids = torch.randint(1, 50, (1, 4))
    with torch.no_grad(), accelerator_rules():
        inside = model(ids, position_ids=torch.tensor([[60, 61, 62, 63]]))
        outside = model(ids, position_ids=torch.tensor([[62, 63, 64, 65]]))
    assert torch.isfinite(inside).all()
    assert torch.isnan(outside[:, 2:]).all()  # (and, through attention, every token beside them)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "learned"])
def test_forward_and_decoding_step_have_no_graph_breaks(encoding):
    model = small(encoding)
    ids, mask = prompt()
    with torch.no_grad():
        for kwargs in ({}, dict(attention_mask=mask)):
            explanation = torch._dynamo.explain(model)(ids, **kwargs)
            assert explanation.graph_break_count == 0, explanation.break_reasons
        cache = model.new_cache(batch=3, max_len=10)
        explanation = torch._dynamo.explain(model)(ids, attention_mask=mask, cache=cache)  # static prefill
        assert explanation.graph_break_count == 0, explanation.break_reasons
        explanation = torch._dynamo.explain(model.decode_step)(ids[:, :1], cache)
        assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("interleaved", [False, True])
def test_the_fused_decoding_step_compiles_without_graph_breaks(interleaved, monkeypatch):
    """torch.compile(fullgraph=True) of a decoding step on static caches, partial rotary, both pairings:
    one graph, through rotate_and_cache."""
    model = small(rope_interleaved=interleaved, rope_scaling={"rope_type": "default", "partial_rotary_factor": 0.5})
    ids, mask = prompt()
    with torch.no_grad():
        cache = model.new_cache(batch=3, max_len=10)
        model(ids, attention_mask=mask, cache=cache)
        calls = use_static_write(monkeypatch, "fused")
        explanation = torch._dynamo.explain(model.decode_step)(ids[:, :1], cache)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert calls, "the traced step did not go through rotate_and_cache"


@pytest.mark.slow
def test_compiled_generation_equals_eager_and_is_reused():
    model = small()
    ids, mask = prompt()
    expected = model.generate(ids, 10, attention_mask=mask)
    assert model.generate(ids, 10, attention_mask=mask, capture="compile").equal(expected)
    held = model._captured
    step, caches = held.step, held.caches
    # another length in the same 64-slot bucket: the same caches and compiled step, reset
    shorter = model.generate(ids, 4, attention_mask=mask, capture="compile")
    assert shorter.equal(expected[:, :10])
    assert held.step is step and held.caches is caches
    sampled = dict(temperature=0.9, top_k=8)
    assert model.generate(ids, 6, capture="compile", generator=torch.Generator().manual_seed(1), **sampled).equal(
        model.generate(ids, 6, generator=torch.Generator().manual_seed(1), **sampled)
    )
    model.release_captured()
    assert held.step is None and held.caches == []


def test_captured_state_is_not_copied():
    model = small()
    model._captured.key, model._captured.step = ("x",), print
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin._captured.key is None and twin._captured.step is None
    assert model._captured.key == ("x",)


def test_new_cache():
    model = small()
    dynamic = model.new_cache()
    assert len(dynamic) == 2 and all(type(c) is KVCache for c in dynamic)
    static = model.new_cache(batch=3, max_len=7, dtype=torch.float64)
    assert all(isinstance(c, StaticKVCache) for c in static) and len({id(c) for c in static}) == 2
    assert static[0].keys.shape == (3, 2, 7, 8) and static[0].keys.dtype == torch.float64
    with pytest.raises(ValueError, match="pass batch=B as well"):
        model.new_cache(max_len=7)
    with pytest.raises(ValueError, match="pass max_len too"):
        model.new_cache(batch=3)


def test_generate_errors():
    model = small()
    ids, _ = prompt()
    with pytest.raises(ValueError, match="cache must be 'dynamic' .* or 'static'"):
        model.generate(ids, 2, cache="paged")
    with pytest.raises(ValueError, match="capture must be None, 'compile' or 'cuda_graph'"):
        model.generate(ids, 2, capture="graph")
    with pytest.raises(ValueError, match="capture='compile' needs static shapes: use cache='static'"):
        model.generate(ids, 2, cache="dynamic", capture="compile")
    with pytest.raises(ValueError, match="use_cache=False .* cannot go with a static cache"):
        model.generate(ids, 2, cache="static", use_cache=False)
    with pytest.raises(
        ValueError, match="needs the model and input_ids on a CUDA device, got cpu; use capture='compile'"
    ):
        model.generate(ids, 2, capture="cuda_graph")
    with pytest.raises(ValueError, match="eos_token_id=50 is not a token id of this model"):
        model.generate(ids, 2, eos_token_id=50)
    with pytest.raises(TypeError, match="decode_step needs static caches"):
        model.decode_step(ids[:, :1], model.new_cache())
    with pytest.raises(TypeError, match="cache mixes KVCache and StaticKVCache"):
        model(ids, cache=[KVCache(), model.new_cache(batch=3, max_len=8)[1]])
    with pytest.raises(ValueError, match=r"attention_mask covers the new tokens only: \[B, S\] = \[3, 6\]"):
        model(ids, attention_mask=torch.ones(3, 9, dtype=torch.long), cache=model.new_cache(batch=3, max_len=9))


@pytest.mark.parametrize("encoding", ["rope", "alibi", "none"])
def test_the_layers_of_one_cache_group_share_the_step_mask_and_slots(encoding, monkeypatch):
    """Off the host path, the layers of a model whose static caches come from one new_cache call work out
    the new tokens' slots and the attention mask once per forward (StaticStep), with logits and caches
    equal bit for bit to every layer doing it alone."""
    from rotary.nn import attention as attention_module
    from rotary.nn.cache import StaticStep

    model = small(encoding, num_layers=4)
    ids, mask = prompt()
    masks, slots = [], []
    build_mask, next_slots = attention_module.RotaryAttention._static_mask, StaticKVCache._next_slots
    monkeypatch.setattr(attention_module.RotaryAttention, "_static_mask", lambda *a: masks.append(1) or build_mask(*a))
    monkeypatch.setattr(
        StaticKVCache, "_next_slots", lambda self, n, step=None: slots.append(step) or next_slots(self, n, step)
    )

    def decode(grouped: bool):
        cache = model.new_cache(batch=3, max_len=10)
        if not grouped:
            for c in cache:
                c.group = None
        masks.clear()
        with torch.no_grad(), accelerator_rules():
            prefill = model(ids, attention_mask=mask, cache=cache)
            step_masks = len(masks)
            logits = model.decode_step(prefill[:, -1:].argmax(-1), cache)
        return prefill, logits, cache, step_masks, len(masks) - step_masks

    grouped, alone = decode(True), decode(False)
    assert grouped[3] == grouped[4] == 1 and alone[3] == alone[4] == 4  # masks built per forward
    assert torch.equal(grouped[0], alone[0]) and torch.equal(grouped[1], alone[1])
    for a, b in zip(grouped[2], alone[2]):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) and torch.equal(a.valid, b.valid)
        assert torch.equal(a.positions, b.positions) and int(a.filled) == int(b.filled) == 7
    assert StaticStep.of(grouped[2]) is not None and StaticStep.of(alone[2]) is None


def test_sharing_the_step_saves_kernels_per_layer():
    """The op count of one decoding step off the host path (each op a kernel launch on a GPU, where a
    decoding step is launch-bound): at least 15 fewer per layer after the first with a cache group."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view
            return func(*args, **(kwargs or {}))

    model = small(num_layers=6)
    ids, _ = prompt()
    counts = []
    for grouped in (True, False):
        cache = model.new_cache(batch=3, max_len=10)
        for c in cache:
            c.group = c.group if grouped else None
        with torch.no_grad(), accelerator_rules():
            model(ids, cache=cache)
            with Count() as count:
                model.decode_step(ids[:, -1:], cache)
        counts.append(count.ops)
    assert counts[1] - counts[0] >= 15 * 5, counts


def test_a_cache_written_alone_leaves_its_group():
    """A layer's cache of a group rewritten alone (here to the same fill, with other padding) is no longer
    the group's: the model's layers no longer share a mask over it, and the logits are those of every layer
    reading its own cache (the fill-only check would not see it)."""
    model = small()
    ids, mask = prompt()

    def decode(grouped: bool):
        cache = model.new_cache(batch=3, max_len=10)
        for c in cache:
            c.group = c.group if grouped else None
        with torch.no_grad(), accelerator_rules():
            model(ids, cache=cache)  # no padding
            cache[1].reset()
            x = torch.randn(3, 6, 32, generator=torch.Generator().manual_seed(1))
            model.layers[1].attn(x, cache=cache[1], attention_mask=mask)  # 6 tokens again, left-padded
            logits = model.decode_step(ids[:, -1:], cache)
        return logits, cache

    (grouped, cache), (alone, _) = decode(True), decode(False)
    assert torch.equal(grouped, alone)
    from rotary.nn.cache import StaticStep

    assert cache[1].group is None and StaticStep.of(cache) is None  # the group is no more: no shared step
