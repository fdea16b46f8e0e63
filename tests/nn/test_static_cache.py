"""StaticKVCache: the same results as KVCache with static shapes, nothing read on the host off the CPU.

On the CPU (eager) attention reads the filled slots through KVCache's own code, so the two caches agree
bit for bit. Where the host must not read (accelerators, proven here with ``helpers.accelerator_rules``)
and under ``torch.compile``, attention reads every slot under a mask: the same tokens and cached keys,
with outputs that differ from KVCache's only by the order in which SDPA sums over the longer key axis.
"""

from __future__ import annotations

import pytest
import torch

import rotary
from helpers import HostReadError, accelerator_rules, use_static_write
from rotary.errors import InputError
from rotary.nn import KVCache, RotaryAttention, StaticKVCache, padding_position_ids

CPU = torch.device("cpu")


def layer(position_bias=None, num_kv_heads=2, causal=True, seed=0) -> RotaryAttention:
    torch.manual_seed(seed)
    attn = RotaryAttention(32, 4, num_kv_heads=num_kv_heads, causal=causal, position_bias=position_bias).eval()
    if position_bias == "relative":
        torch.nn.init.normal_(attn.position_bias.bias)  # zero-initialised; make it matter
    return attn


def padded_batch(prompt=5, steps=4, seed=1):
    """x ``[2, prompt + steps, 32]`` with row 0 left-padded by 2 in the prompt, its prompt mask and positions."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, prompt + steps, 32, generator=gen)
    mask = torch.ones(2, prompt, dtype=torch.long)
    mask[0, :2] = 0
    return x, mask, padding_position_ids(mask)


def decode(attn, cache, x, mask, positions, prompt):
    """Prefill ``prompt`` tokens, then one call per remaining token; the concatenated outputs."""
    static = isinstance(cache, StaticKVCache)
    outs = [attn(x[:, :prompt], attention_mask=mask, position_ids=positions, cache=cache)]
    full_mask = mask
    for i in range(prompt, x.shape[1]):
        full_mask = torch.cat((full_mask, torch.ones(2, 1, dtype=mask.dtype)), dim=1)
        # KVCache takes the mask over past + new tokens, StaticKVCache remembers the padding itself
        outs.append(attn(x[:, i : i + 1], attention_mask=None if static else full_mask, cache=cache))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("position_bias", [None, "alibi", "relative"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_static_equals_dynamic_bit_for_bit(position_bias, num_kv_heads, causal):
    attn = layer(position_bias, num_kv_heads, causal)
    x, mask, positions = padded_batch()
    with torch.no_grad():
        dynamic, static = KVCache(), StaticKVCache(2, num_kv_heads, 16, 8)
        expected = decode(attn, dynamic, x, mask, positions, 5)
        got = decode(attn, static, x, mask, positions, 5)
    assert torch.equal(got, expected)
    filled = dynamic.length
    assert int(static.filled) == filled == 9
    assert torch.equal(static.keys[:, :, :filled], dynamic.keys)
    assert torch.equal(static.values[:, :, :filled], dynamic.values)
    assert torch.equal(static.positions[:, :filled], dynamic.positions)
    assert static.valid[:, :filled].tolist() == [[False, False] + [True] * 7, [True] * 9]


#: the layer's position encoding -> RotaryAttention's keyword arguments
ROTATIONS = {
    "rope": lambda: dict(rope=rotary.RoPE(8)),
    "interleaved partial": lambda: dict(rope=rotary.RoPE(8, interleaved=True, rotary_dim=4)),
    "rotary_value": lambda: dict(rotary_value=True),
    "xpos": lambda: dict(rope=rotary.XPos(8)),
    "none": lambda: dict(rope=False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads", [4, 1])
@pytest.mark.parametrize("rotation", list(ROTATIONS))
def test_rotation_and_cache_write_are_one_rotate_and_cache_call(dtype, num_kv_heads, rotation, monkeypatch):
    """With a rope, a static-cache call rotates q and k and writes k and v in one rotate_and_cache call,
    with the outputs and cache of rotating, then copying; without one, it copies."""
    torch.manual_seed(0)
    kwargs = ROTATIONS[rotation]()
    attn = RotaryAttention(32, 4, num_kv_heads=num_kv_heads, causal=True, **kwargs).eval().to(dtype)
    x, mask, positions = padded_batch()
    x = x.to(dtype)
    results = {}
    for path in ("rotate_then_copy", "fused"):
        calls = use_static_write(monkeypatch, path)
        with torch.no_grad():
            cache = StaticKVCache(2, num_kv_heads, 16, 8, dtype=dtype)
            results[path] = (decode(attn, cache, x, mask, positions, 5), cache.keys, cache.values)
        assert len(calls) == (0 if rotation == "none" else 5)  # the prefill and 4 steps
    for got, want in zip(results["fused"], results["rotate_then_copy"]):
        assert torch.equal(got, want)


@pytest.mark.parametrize("position_bias", [None, "alibi"])
@pytest.mark.parametrize("causal", [True, False])
def test_every_slot_path_under_accelerator_rules(position_bias, causal):
    """Nothing read on the host (HostReadError otherwise); the same cache content as KVCache, and outputs
    within fp32 rounding of it (attention over 16 slots instead of the filled ones)."""
    attn = layer(position_bias, 2, causal)
    x, mask, positions = padded_batch()
    with torch.no_grad():
        dynamic = KVCache()
        expected = decode(attn, dynamic, x, mask, positions, 5)
        static = StaticKVCache(2, 2, 16, 8)
        with accelerator_rules():
            got = decode(attn, static, x, mask, positions, 5)
            plain = attn(x)  # and without a cache, and with a growing one
            grown = decode(attn, KVCache(), x, mask, positions, 5)
    torch.testing.assert_close(got, expected)
    assert torch.equal(grown, expected) and torch.equal(plain, attn(x))
    assert torch.equal(static.keys[:, :, :9], dynamic.keys) and torch.equal(static.positions[:, :9], dynamic.positions)


def test_whole_buffer_path_reads_the_same_slots_as_the_cpu_path():
    """The CPU (filled slots only) and the accelerator path (every slot, masked) see the same keys: stale
    data in unfilled slots and in a reset cache's old slots changes nothing."""
    attn = layer("alibi")
    x, mask, positions = padded_batch()
    with torch.no_grad():
        static = StaticKVCache(2, 2, 16, 8)
        static._keys.normal_()  # garbage everywhere before the first write
        static._values.normal_()
        first = decode(attn, static, x, mask, positions, 5)
        static.reset()
        with accelerator_rules():
            again = decode(attn, static, x, mask, positions, 5)
    torch.testing.assert_close(again, first)
    assert torch.isfinite(again).all()


def test_positions_continue_each_row_on_the_device():
    cache = StaticKVCache(2, 1, 8, 4)
    kv = torch.zeros(2, 1, 3, 4)
    with accelerator_rules():
        empty = cache.next_positions(2)  # nothing read: the empty cache starts at 0
        cache.update(
            kv, kv, torch.tensor([[0, 0, 1], [4, 5, 6]]), valid=torch.tensor([[False, True, True], [True] * 3])
        )
        after = cache.next_positions(2)
        padded = cache.next_positions(2, torch.tensor([[0, 1], [1, 1]]))
    assert empty.bound is None and empty.ids.tolist() == [[0, 1], [0, 1]]
    assert after.ids.tolist() == [[2, 3], [7, 8]]
    # padding-skipping: valid tokens so far (2 and 3) + cumsum(mask) - 1
    assert padded.ids.tolist() == [[1, 2], [3, 4]]
    # on the CPU the exact bound comes for free
    assert cache.next_positions(2).bound == 9


def test_reset_keeps_the_buffers():
    attn = layer()
    x, mask, positions = padded_batch()
    cache = StaticKVCache(2, 2, 16, 8)
    pointers = [t.data_ptr() for t in (cache._keys, cache._values, cache._positions, cache._valid, cache.filled)]
    with torch.no_grad():
        first = decode(attn, cache, x, mask, positions, 5)
        cache.reset()
        assert int(cache.filled) == 0 and not cache.valid.any()
        second = decode(attn, cache, x, mask, positions, 5)
    assert torch.equal(first, second)
    assert pointers == [
        t.data_ptr() for t in (cache._keys, cache._values, cache._positions, cache._valid, cache.filled)
    ]


def test_writing_past_the_end_on_the_cpu_is_an_error_naming_the_fix():
    attn = layer()
    x = torch.randn(2, 6, 32)
    cache = StaticKVCache(2, 2, 4, 8)
    with torch.no_grad():
        attn(x[:, :3], cache=cache)
        with pytest.raises(
            InputError, match=r"has 4 slots and 3 are filled: 2 more token\(s\) do not fit; build it with max_len >= 5"
        ):
            attn(x[:, 3:5], cache=cache)
    assert int(cache.filled) == 3  # the failed call wrote nothing


def test_writing_past_the_end_off_the_cpu_is_nan_and_named_on_the_cpu():
    attn = layer()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        reference = StaticKVCache(2, 2, 8, 8)
        expected = torch.cat([attn(x[:, :3], cache=reference), attn(x[:, 3:6], cache=reference)], dim=1)
        cache = StaticKVCache(2, 2, 4, 8)
        with accelerator_rules():
            got = torch.cat([attn(x[:, :3], cache=cache), attn(x[:, 3:6], cache=cache)], dim=1)
    # the token that fit is right (the two that did not went to the spill slot, never read); the others are NaN
    torch.testing.assert_close(got[:, :4], expected[:, :4])
    assert torch.isnan(got[:, 4:]).all()
    assert torch.equal(cache.keys, reference.keys[:, :, :4])
    cache = StaticKVCache(2, 2, 4, 8)
    with torch.no_grad(), pytest.raises(InputError, match="do not fit"):  # the CPU reads the fill: named at once
        attn(x[:, :3], cache=cache), attn(x[:, 3:6], cache=cache)


def test_a_mask_value_is_named_on_the_cpu_and_the_contract_off_it():
    attn = layer()
    x = torch.randn(2, 3, 32)
    mask = torch.tensor([[1, 2, 1], [1, 1, 1]])
    with torch.no_grad(), accelerator_rules():  # nothing read: a nonzero value attends (the documented contract)
        got = attn(x, attention_mask=mask, cache=StaticKVCache(2, 2, 4, 8))
        want = attn(x, attention_mask=mask != 0, cache=StaticKVCache(2, 2, 4, 8))
    assert torch.equal(got, want)
    with torch.no_grad(), pytest.raises(InputError, match="must hold only 0 and 1"):
        attn(x, attention_mask=mask, cache=StaticKVCache(2, 2, 4, 8))


def test_accelerator_rules_catch_a_host_read():
    """The proof above is only as good as this: a read inside the context fails."""
    cache = StaticKVCache(1, 1, 4, 4)
    with pytest.raises(HostReadError), accelerator_rules():
        int(cache.filled)


def test_errors():
    attn = layer()
    x = torch.randn(2, 3, 32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="built for a batch of 3 but hidden_states has batch 2"):
            attn(x, cache=StaticKVCache(3, 2, 8, 8))
        with pytest.raises(ValueError, match="do not fit this StaticKVCache .* 4 KV heads"):
            attn(x, cache=StaticKVCache(2, 4, 8, 8))
        with pytest.raises(ValueError, match=r"holds torch.float64 on cpu; build it with dtype=torch.float32"):
            attn(x, cache=StaticKVCache(2, 2, 8, 8, dtype=torch.float64))
        with pytest.raises(ValueError, match=r"attention_mask covers the new tokens only: \[B, S\] = \[2, 3\]"):
            attn(x, attention_mask=torch.ones(2, 5, dtype=torch.long), cache=StaticKVCache(2, 2, 8, 8))
        shared = StaticKVCache(2, 2, 8, 8)
        attn(x, cache=shared)
        with pytest.raises(ValueError, match="already holds another layer's keys"):
            layer(seed=1)(x, cache=shared)
    with pytest.raises(RuntimeError, match="carries no gradient.*torch.no_grad"):
        attn(x, cache=StaticKVCache(2, 2, 8, 8))
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        StaticKVCache(2, 2, 0, 8)
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        StaticKVCache(2, 2, 8, 8, dtype=torch.int64)
    with pytest.raises(TypeError, match="cache must be a rotary.nn.KVCache or StaticKVCache"):
        attn(x, cache=[KVCache()])


def test_compiles_without_graph_breaks():
    attn = layer("alibi")
    x, mask, positions = padded_batch()
    cache = StaticKVCache(2, 2, 16, 8)
    with torch.no_grad():
        attn(x[:, :5], attention_mask=mask, position_ids=positions, cache=cache)
        for args, kwargs in (
            ((x[:, 5:6],), {}),
            ((x[:, 5:7],), dict(attention_mask=torch.ones(2, 2, dtype=torch.long))),
        ):
            explanation = torch._dynamo.explain(attn)(*args, cache=cache, **kwargs)
            assert explanation.graph_break_count == 0, explanation.break_reasons


def test_rope_producer_is_shared_and_tables_fit():
    """A layer with a RoPE of 4 rows decodes past them on the CPU (tables grow from the bound it reads)."""
    torch.manual_seed(4)
    small = RotaryAttention(16, 2, causal=True, rope=rotary.RoPE(8, max_position=4)).eval()
    x = torch.randn(1, 12, 16)
    with torch.no_grad():
        cache = StaticKVCache(1, 2, 12, 8)
        steps = torch.cat([small(x[:, i : i + 1], cache=cache) for i in range(12)], dim=1)
        dynamic = KVCache()
        expected = torch.cat([small(x[:, i : i + 1], cache=dynamic) for i in range(12)], dim=1)
    assert torch.equal(steps, expected)


def test_the_meta_device_gives_shapes_and_reads_nothing():
    """A cache built on the meta device (shape inference) answers every call with meta tensors of the right
    shapes: nothing is read (meta tensors have no values) and nothing is flagged."""
    cache = StaticKVCache(2, 1, 8, 4, value_dim=6, device="meta")
    rope = rotary.RoPE(4)
    q, k, v = (torch.zeros(2, h, 3, d, device="meta") for h, d in ((2, 4), (1, 4), (1, 6)))
    ids = torch.arange(3, device="meta")
    with torch.no_grad():
        entries = cache.update(k, v, ids, valid=torch.ones(2, 3, dtype=torch.bool, device="meta"))
        q_rot, again = cache.rotate_and_update(q, k, v, rope.tables(ids), ids)
        mask = torch.ones(2, 2, dtype=torch.bool, device="meta")
        nexts = [cache.next_positions(2), cache.next_positions(2, mask), cache.token_indices(2)]
        cache.reset()
    for got, shape in (
        (entries.keys, (2, 1, 8, 4)),
        (entries.values, (2, 1, 8, 6)),
        (entries.positions, (2, 8)),
        (entries.valid, (2, 8)),
        (entries.overflow, (3,)),
        (again.start, ()),
        (q_rot, (2, 2, 3, 4)),
        (cache.valid, (2, 8)),
        (cache.filled, ()),
        *((p.ids, (2, 2) if i < 2 else (2,)) for i, p in enumerate(nexts)),
    ):
        assert got.is_meta and tuple(got.shape) == shape


def test_a_layer_and_a_decoder_on_the_meta_device_decode_into_meta_caches():
    """Shape inference through attention on the meta device (q and k rotated in place: separate tensors,
    though every meta storage has address 0)."""
    from helpers import small_lm

    with torch.device("meta"):
        attn = RotaryAttention(32, 4, num_kv_heads=2, causal=True).eval()
        lm = small_lm()
    cache = StaticKVCache(2, 2, 16, 8, device="meta")
    x = torch.zeros(2, 5, 32, device="meta")
    ids = torch.zeros(2, 5, dtype=torch.long, device="meta")
    with torch.no_grad():
        outs = [attn(x, cache=cache), attn(x[:, :1], cache=cache)]
        caches = lm.new_cache(batch=2, max_len=16)
        logits = [lm(ids, cache=caches), lm.decode_step(ids[:, :1], caches)]
    assert [tuple(o.shape) for o in outs] == [(2, 5, 32), (2, 1, 32)] and all(o.is_meta for o in outs)
    assert [tuple(o.shape) for o in logits] == [(2, 5, 50), (2, 50)] and all(o.is_meta for o in logits)
    assert all(c.keys.is_meta for c in caches)
