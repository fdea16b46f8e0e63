"""``rotary.rotate_and_cache``: RoPE with the KV-cache write, against its unfused composition (rotate,
then one indexed write per cache), bit for bit; the Triton kernel under the interpreter; bad slots."""

from __future__ import annotations

import itertools
import textwrap

import pytest
import torch

import rotary
from covering import covering
from helpers import accelerator_rules, run_interpreted
from rotary.serving import tables_from_cos_sin_cache

B, S, HQ, HK, D, T = 2, 3, 4, 2, 16, 10


def _inputs(dtype, layout="bshd", dv=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h, d: (B, S, h, d)) if layout == "bshd" else (lambda h, d: (B, h, S, d))
    return tuple(torch.randn(shape(h, d), generator=g).to(dtype) for h, d in ((HQ, D), (HK, D), (HK, dv)))


def _caches(dtype, cache_layout="bshd", batch=B, dv=D):
    shape = (lambda d: (batch, T, HK, d)) if cache_layout == "bshd" else (lambda d: (batch, HK, T, d))
    return torch.full(shape(D), 7.0, dtype=dtype), torch.full(shape(dv), 7.0, dtype=dtype)


SLOTS = torch.tensor([[4, 5, 6], [0, 1, 9]])


def _composition(q, k, v, k_cache, v_cache, slots, tables, layout, cache_layout):
    """What a user writes without the fused op: rotate, then index the caches."""
    q_rot, k_rot = rotary.rotate([q, k], tables, layout=layout, kinds=("q", "k"))
    as_bshd = (lambda t: t.transpose(1, 2)) if layout == "bhsd" else (lambda t: t)
    kc = k_cache.transpose(1, 2) if cache_layout == "bhsd" else k_cache
    vc = v_cache.transpose(1, 2) if cache_layout == "bhsd" else v_cache
    rows = torch.arange(B)[:, None].expand(B, S) if kc.shape[0] > 1 else torch.zeros_like(slots)
    kc[rows, slots] = as_bshd(k_rot)
    vc[rows, slots] = as_bshd(v)
    return q_rot, k_rot


CASES = list(
    itertools.product(
        (torch.float32, torch.bfloat16, torch.float16),
        (False, True),
        ("bshd", "bhsd"),
        ("bshd", "bhsd"),
        (16, 12),
    )
)


@pytest.mark.parametrize(("dtype", "interleaved", "layout", "cache_layout", "rotary_dim"), CASES)
def test_rotate_and_cache_equals_rotate_then_write(dtype, interleaved, layout, cache_layout, rotary_dim):
    rope = rotary.RoPE(D, interleaved=interleaved, rotary_dim=rotary_dim)
    positions = torch.tensor([[3, 4, 5], [7, 8, 9]])
    tables = rope.tables(positions)
    q, k, v = _inputs(dtype, layout)
    want_caches = _caches(dtype, cache_layout)
    want = _composition(q, k, v, *want_caches, SLOTS, tables, layout, cache_layout)
    got_caches = _caches(dtype, cache_layout)
    got = rotary.rotate_and_cache(q, k, v, *got_caches, SLOTS, tables, layout=layout, cache_layout=cache_layout)
    for g, w in zip((*got, *got_caches), (*want, *want_caches)):
        assert torch.equal(g, w)


def test_the_vllm_form_equals_the_tables_form():
    rope = rotary.RoPE(D, rotary_dim=12)
    cos, sin = rope.cos_sin(torch.arange(32))
    cos_sin_cache = torch.cat((cos[:, :6], sin[:, :6]), dim=-1)  # one value per pair, cos then sin
    positions = torch.tensor([[3, 4, 5], [7, 8, 31]])
    q, k, v = _inputs(torch.bfloat16)
    a_caches, b_caches = _caches(torch.bfloat16), _caches(torch.bfloat16)
    a = rotary.rotate_and_cache(q, k, v, *a_caches, SLOTS, rope.tables(positions))
    b = rotary.rotate_and_cache(q, k, v, *b_caches, SLOTS, positions=positions, cos_sin_cache=cos_sin_cache)
    for x, y in zip((*a, *a_caches), (*b, *b_caches)):
        assert torch.equal(x, y)


def test_packed_tokens_into_one_flat_cache_with_a_value_head_size_of_its_own():
    rope = rotary.RoPE(D)
    q, k = torch.randn(5, HQ, D), torch.randn(5, HK, D)
    v = torch.randn(5, HK, 8)
    k_cache, v_cache = torch.zeros(1, 12, HK, D), torch.zeros(1, 12, HK, 8)  # one slot axis (vLLM's flat cache)
    slots = torch.tensor([11, 0, 3, 4, 7])
    positions = torch.tensor([0, 1, 0, 1, 2])  # two packed sequences
    q_rot, k_rot = rotary.rotate_and_cache(
        q, k, v, k_cache, v_cache, slots, rope.tables(rotary.positions.from_ids(positions, packed=True))
    )
    want_q, want_k = (rope.rotate(t.unsqueeze(0), position_ids=positions, layout="bshd")[0] for t in (q, k))
    assert torch.equal(q_rot, want_q) and torch.equal(k_rot, want_k)
    assert torch.equal(k_cache[0, slots], want_k) and torch.equal(v_cache[0, slots], v)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[slots] = False
    assert (k_cache[0, untouched] == 0).all()


def test_in_place_and_m_rope_tables():
    mrope = rotary.MRoPE(D, mrope_section=[2, 3, 3])
    ids = torch.stack(
        [torch.arange(S).expand(B, S), torch.arange(S).flip(0).expand(B, S), torch.ones(B, S, dtype=torch.long)]
    )
    tables = mrope.tables(ids)  # per-token [B, S, r]
    q, k, v = _inputs(torch.float32)
    want_caches = _caches(torch.float32)
    want = _composition(q, k, v, *want_caches, SLOTS, tables, "bshd", "bshd")
    got_caches = _caches(torch.float32)
    qi, ki = q.clone(), k.clone()
    got = rotary.rotate_and_cache(qi, ki, v, *got_caches, SLOTS, tables, inplace=True)
    assert got[0] is qi and got[1] is ki
    for g, w in zip((*got, *got_caches), (*want, *want_caches)):
        assert torch.equal(g, w)


def test_gradients_flow_to_q_and_k_as_through_rotate():
    rope = rotary.RoPE(D)
    tables = rope.tables(torch.arange(S))
    q, k, v = (t.requires_grad_() for t in _inputs(torch.float32))
    q_rot, k_rot = rotary.rotate_and_cache(q, k, v, *_caches(torch.float32), SLOTS, tables)
    (q_rot.square().sum() + k_rot.sum()).backward()
    q2, k2 = (t.detach().clone().requires_grad_() for t in (q, k))
    a, b = rotary.rotate([q2, k2], tables, layout="bshd", kinds=("q", "k"))
    (a.square().sum() + b.sum()).backward()
    assert torch.equal(q.grad, q2.grad) and torch.equal(k.grad, k2.grad)


def test_compiled_equals_eager():
    rope = rotary.RoPE(D).prepare(64)
    positions = torch.tensor([[3, 4, 5], [7, 8, 9]])

    def step(q, k, v, kc, vc, slots, pos):
        return rotary.rotate_and_cache(q, k, v, kc, vc, slots, rope.tables(pos))

    q, k, v = _inputs(torch.float32)
    want_caches, got_caches = _caches(torch.float32), _caches(torch.float32)
    want = step(q, k, v, *want_caches, SLOTS, positions)
    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, *got_caches, SLOTS, positions)
    for g, w in zip((*got, *got_caches), (*want, *want_caches)):
        assert torch.equal(g, w)


def test_bad_slots_are_named_on_the_cpu_and_skipped_on_an_accelerator():
    rope = rotary.RoPE(D)
    tables = rope.tables(torch.arange(S))
    q, k, v = _inputs(torch.float32)
    bad = torch.tensor([[4, 5, 6], [0, 1, T]])
    with pytest.raises(ValueError, match=rf"slots must be in 0 .. {T - 1}.*got 0 .. {T}"):
        rotary.rotate_and_cache(q, k, v, *_caches(torch.float32), bad, tables)
    caches = _caches(torch.float32)
    with accelerator_rules():  # nothing read, nothing raised: the bad slot's token is not written (the contract)
        rotary.rotate_and_cache(q, k, v, *caches, bad, tables)
    want = _caches(torch.float32)
    _composition(q, k, v, *want, torch.tensor([[4, 5, 6], [0, 1, 9]]), tables, "bshd", "bshd")
    assert torch.equal(caches[0][:, :9], want[0][:, :9]) and torch.equal(caches[0][1, 9], torch.full((HK, D), 7.0))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(k_cache=torch.zeros(B, T, HK + 1, D)), r"k_cache \(2, 10, 3, 16\).*does not fit"),
        (dict(slots=torch.zeros(B, S + 1, dtype=torch.long)), r"slots must be an int64 tensor \[2, 3\]"),
        (dict(tables=None), "pass tables .* or positions with cos_sin_cache"),
        (dict(v=torch.zeros(B, S, HK + 1, D)), "v must have k's batch, length and heads"),
        (dict(k_cache=torch.zeros(B, T, HK, D, dtype=torch.float64)), "k_cache must have the dtype and device of k"),
    ],
)
def test_mismatched_arguments_are_named(change, match):
    q, k, v = _inputs(torch.float32)
    kc, vc = _caches(torch.float32)
    args = dict(q=q, k=k, v=v, k_cache=kc, v_cache=vc, slots=SLOTS, tables=rotary.RoPE(D).tables(torch.arange(S)))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        rotary.rotate_and_cache(**args)


def test_no_host_read_on_an_accelerator():
    rope = rotary.RoPE(D).prepare(64)
    q, k, v = _inputs(torch.bfloat16)
    positions = torch.tensor([[3, 4, 5], [7, 8, 9]])
    want_caches, got_caches = _caches(torch.bfloat16), _caches(torch.bfloat16)
    want = rotary.rotate_and_cache(q, k, v, *want_caches, SLOTS, rope.tables(positions))
    with accelerator_rules():
        got = rotary.rotate_and_cache(q, k, v, *got_caches, SLOTS, rope.tables(positions))
    for g, w in zip((*got, *got_caches), (*want, *want_caches)):
        assert torch.equal(g, w)


#: the sizes of TRITON's and VLLM_FORM's loops' factors: every 3 of them in all their combinations (tests/covering.py)
SIZES = [(range(2),) * 6, (range(2), range(2), range(2), range(3), range(2))]
TRITON = textwrap.dedent(
    """
    import itertools, torch, rotary
    from covering import covering
    import rotary.kernels.eager
    from rotary import devices
    from rotary.kernels import triton as tk
    from rotary.rotation import plan

    def bf16_truncated(t):  # the interpreter casts fp32 -> bf16 by truncation (a GPU rounds to nearest)
        return (t.float().view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)

    B, S, HQ, HK, D, T = 2, 3, 3, 2, 8, 6
    checked = 0
    for dtype, interleaved, r, positions_kind, inplace, shared in covering(
        (torch.float32, torch.bfloat16), (False, True), (8, 6), ("rows", "tokens"), (False, True), (False, True),
    ):
        g = torch.Generator().manual_seed(checked)
        rope = rotary.RoPE(D, interleaved=interleaved, rotary_dim=r)
        ids = torch.tensor([[0, 5, 2], [7, 1, 3]])
        tables = rope.tables(ids) if positions_kind == "rows" else rope.tables(rotary.positions.arange(S, offset=2))
        base = torch.randn(B, S, HQ + 2 * HK, D, generator=g).to(dtype)
        q, k, v = base[:, :, :HQ], base[:, :, HQ:HQ + HK], base[:, :, HQ + HK:] * 1
        v = torch.randn(B, S, HK, 5, generator=g).to(dtype)  # values of another head size
        slots = torch.tensor([[0, 1, 2], [5, -1, 6]])  # -1 and 6 are outside the cache of 6 rows
        bc = 1 if shared else B
        kc, vc = torch.zeros(bc, T, HK, D, dtype=dtype), torch.zeros(bc, T, HK, 5, dtype=dtype)
        rotation, _ = plan([q, k], tables, layout="bshd", kinds=("q", "k"), names=("q", "k"))
        wide = tuple(x.float() for x in rotation.xs)
        expected = tuple(torch.empty_like(x) for x in wide)
        rotary.kernels.eager.run_torch(rotation.replace(xs=wide, outs=expected))
        want_q, want_k = (bf16_truncated(t) if dtype == torch.bfloat16 else t for t in expected)
        outs = (q.clone(), k.clone()) if inplace else (torch.empty_like(q), torch.empty_like(k))
        if inplace:
            rotation = rotation.replace(xs=outs)
        tk.rotate_and_cache_triton(rotation.replace(outs=outs), v, kc, vc, slots)
        assert torch.equal(outs[0], want_q) and torch.equal(outs[1], want_k), (dtype, interleaved, r, positions_kind, inplace)
        rows = torch.arange(B)[:, None].expand(B, S) if bc > 1 else torch.zeros(B, S, dtype=torch.long)
        good = (slots >= 0) & (slots < T)
        assert torch.equal(kc[rows[good], slots[good]], want_k[good]) and torch.equal(vc[rows[good], slots[good]], v[good])
        written = torch.zeros(bc, T, dtype=torch.bool)
        written[rows[good], slots[good]] = True
        assert (kc[~written] == 0).all() and (vc[~written] == 0).all()
        checked += 1
    print("checked", checked)
    """
)


@pytest.mark.slow
def test_triton_rotate_and_cache_under_the_interpreter():
    pytest.importorskip("triton")
    stdout = run_interpreted(TRITON)
    assert f"checked {len(covering(*SIZES[0]))}" in stdout


def test_q_k_and_v_of_different_ranks_are_named():
    # packed q with 4-D k (and the other way round) was a bare "not enough values to unpack"
    rope, positions = rotary.RoPE(D), torch.arange(5)
    caches = torch.zeros(1, T, HK, D), torch.zeros(1, T, HK, D)
    q3, k3, v3 = torch.zeros(5, HQ, D), torch.zeros(5, HK, D), torch.zeros(5, HK, D)
    tables = rope.tables(rotary.positions.from_ids(positions, packed=True))
    for (q, k, v), dims in (
        ((q3, k3[None], v3), "3, 4, 3"),
        ((q3[None], k3, v3), "4, 3, 3"),
        ((q3, k3, v3[None]), "3, 3, 4"),
    ):
        with pytest.raises(rotary.InputError, match=rf"q, k and v must all be 4-D .* or all 3-D .* got {dims}-D"):
            rotary.rotate_and_cache(q, k, v, *caches, positions, tables)


def test_values_on_another_device_or_not_floating_are_named():
    q, k, v = _inputs(torch.float32)
    tables = rotary.RoPE(D).tables(torch.arange(S))
    k_cache, v_cache = _caches(torch.float32)
    # v on the meta device was written as nothing at all, silently
    with pytest.raises(rotary.InputError, match=r"v is on meta but k on cpu"):
        rotary.rotate_and_cache(q, k, v.to("meta"), k_cache, v_cache, SLOTS, tables)
    assert (v_cache == 7).all()
    with pytest.raises(rotary.InputTypeError, match=r"v must be floating point .* got torch.int64"):
        rotary.rotate_and_cache(q, k, v.long(), k_cache, v_cache.long(), SLOTS, tables)
    # the message named k's dtype as v's
    with pytest.raises(rotary.InputError, match=r"v_cache must have the dtype and device of v \(torch.float64, cpu\)"):
        rotary.rotate_and_cache(q, k, v.double(), k_cache, v_cache, SLOTS, tables)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64, torch.int16, torch.uint8])
def test_positions_of_a_non_index_dtype_are_refused(dtype):
    # bool positions were read as 0 and 1, complex ones lost their imaginary part (a warning at most)
    cos, sin = rotary.RoPE(D).cos_sin(torch.arange(32))
    cos_sin_cache = torch.cat((cos[:, : D // 2], sin[:, : D // 2]), dim=-1)
    q, k, v = _inputs(torch.float32)
    caches = _caches(torch.float32)
    positions = torch.tensor([[3, 4, 5], [7, 8, 9]]).to(dtype)
    with pytest.raises(rotary.InputTypeError, match=rf"positions must be int64 or int32, got {dtype}"):
        rotary.rotate_and_cache(q, k, v, *caches, SLOTS, positions=positions, cos_sin_cache=cos_sin_cache)
    assert (caches[0] == 7).all()


def test_a_pairing_that_the_tables_do_not_have_is_named():
    # interleaved=True with half-pairing tables was ignored: the heads were rotated as half pairs
    q, k, v = _inputs(torch.float32)
    caches = _caches(torch.float32)
    with pytest.raises(rotary.InputError, match=r"interleaved=True, but these tables were built for the half pairing"):
        rotary.rotate_and_cache(q, k, v, *caches, SLOTS, rotary.RoPE(D).tables(torch.arange(S)), interleaved=True)
    with pytest.raises(rotary.InputTypeError, match=r"interleaved must be True or False, got 'yes'"):
        rotary.rotate_and_cache(q, k, v, *caches, SLOTS, rotary.RoPE(D).tables(torch.arange(S)), interleaved="yes")
    assert (caches[0] == 7).all()
    tables = rotary.RoPE(D, interleaved=True).tables(torch.arange(S))  # the tables' own pairing: both spellings work
    a, b = _caches(torch.float32), _caches(torch.float32)
    x = rotary.rotate_and_cache(q, k, v, *a, SLOTS, tables, interleaved=True)
    y = rotary.rotate_and_cache(q, k, v, *b, SLOTS, tables)
    assert all(torch.equal(s, t) for s, t in zip((*x, *a), (*y, *b)))


def test_caches_that_share_memory_with_each_other_or_with_k_and_v_are_refused():
    # each was silently wrong: one cache's rows overwrote the other's, or a write changed k / v before it was read
    q, k, v = _inputs(torch.float32)
    tables = rotary.RoPE(D).tables(torch.arange(S))
    one = torch.full((B, T, HK, D), 7.0)
    with pytest.raises(rotary.InputError, match=r"k_cache and v_cache share memory"):
        rotary.rotate_and_cache(q, k, v, one, one, SLOTS, tables)
    with pytest.raises(rotary.InputError, match=r"k_cache and v_cache share memory"):
        wide = torch.full((B, T, HK, D + D // 2), 7.0)  # two views of one buffer, half a head in common
        rotary.rotate_and_cache(q, k, v, wide[..., :D], wide[..., D // 2 :], SLOTS, tables)
    k_cache, v_cache = _caches(torch.float32)
    with pytest.raises(rotary.InputError, match=r"v and v_cache share memory"):
        rotary.rotate_and_cache(q, k, v_cache[:, 2 : 2 + S], k_cache, v_cache, SLOTS, tables)
    with pytest.raises(rotary.InputError, match=r"k and k_cache share memory"):
        rotary.rotate_and_cache(q, k_cache[:, :S], v, k_cache, v_cache, SLOTS, tables)
    buffer = torch.full((B, T, HQ, D), 7.0)  # q read from the rows the values go to
    with pytest.raises(rotary.InputError, match=r"q and v_cache share memory"):
        rotary.rotate_and_cache(buffer[:, :S], k, v, k_cache, buffer[:, :, :HK], SLOTS, tables)
    expanded = torch.full((1, T, HK, D), 7.0).expand(B, T, HK, D)  # one row of memory for both sequences
    with pytest.raises(rotary.InputError, match=r"k_cache .* overlapping memory"):
        rotary.rotate_and_cache(q, k, v, expanded, v_cache, SLOTS, tables)
    assert (k_cache == 7).all() and (v_cache == 7).all() and (one == 7).all() and (buffer == 7).all()
    base = torch.randn(B, S, HQ + 2 * HK, D)  # q, k and v sliced from one qkv projection share no element: fine
    qs, ks, vs = base[:, :, :HQ], base[:, :, HQ : HQ + HK], base[:, :, HQ + HK :]
    rotary.rotate_and_cache(qs, ks, vs, k_cache, v_cache, SLOTS, tables, inplace=True)
    assert torch.equal(v_cache[0, 4], vs[0, 0])


def test_a_cache_that_requires_grad_is_named():
    # a leaf cache that requires grad was a bare torch RuntimeError ("a leaf Variable that requires grad ...")
    q, k, v = _inputs(torch.float32)
    k_cache, v_cache = _caches(torch.float32)
    with pytest.raises(rotary.InputError, match=r"v_cache is a leaf tensor that requires grad.*torch.no_grad"):
        rotary.rotate_and_cache(
            q, k, v, k_cache, v_cache.requires_grad_(), SLOTS, rotary.RoPE(D).tables(torch.arange(S))
        )
    with torch.no_grad():
        rotary.rotate_and_cache(q, k, v, k_cache, v_cache, SLOTS, rotary.RoPE(D).tables(torch.arange(S)))
    assert torch.equal(v_cache[1, 9], v[1, 2])


def test_two_tokens_written_to_one_cache_row_are_named_on_the_cpu():
    # the later token's keys and values silently replaced the earlier one's (on CUDA: either, by a race)
    q, k, v = _inputs(torch.float32)
    tables = rotary.RoPE(D).tables(torch.arange(S))
    caches = _caches(torch.float32)
    with pytest.raises(rotary.InputError, match=r"slots write cache row \(batch 1, slot 2\) more than once"):
        rotary.rotate_and_cache(q, k, v, *caches, torch.tensor([[2, 5, 3], [2, 1, 2]]), tables)
    assert (caches[0] == 7).all()
    shared = _caches(torch.float32, batch=1)  # one batch row of cache for both sequences: slots must differ across them
    with pytest.raises(rotary.InputError, match=r"slots write cache row \(batch 0, slot 4\) more than once"):
        rotary.rotate_and_cache(q, k, v, *shared, torch.tensor([[4, 5, 6], [0, 1, 4]]), tables)
    rotary.rotate_and_cache(
        q, k, v, *caches, torch.tensor([[4, 5, 6], [4, 5, 6]]), tables
    )  # the same slot in two rows: fine
    assert torch.equal(caches[1][:, 4:7], v)


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_vllm_form_compiles_in_one_graph_and_equals_eager(table_dtype):
    # fullgraph compilation failed: flagging outside positions made the flags tensor under a lock (a graph break)
    rope = rotary.RoPE(D, interleaved=True)
    cos, sin = rope.cos_sin(torch.arange(32))
    cos_sin_cache = torch.cat((cos[:, ::2], sin[:, ::2]), dim=-1).to(table_dtype)
    positions = torch.tensor([[3, 4, 5], [7, 8, 31]])

    def step(q, k, v, kc, vc, slots, pos, table):
        return rotary.rotate_and_cache(q, k, v, kc, vc, slots, positions=pos, cos_sin_cache=table, interleaved=True)

    q, k, v = _inputs(torch.bfloat16)
    want_caches, got_caches = _caches(torch.bfloat16), _caches(torch.bfloat16)
    want = step(q, k, v, *want_caches, SLOTS, positions, cos_sin_cache)
    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager", fullgraph=True)(
        q, k, v, *got_caches, SLOTS, positions, cos_sin_cache
    )
    for g, w in zip((*got, *got_caches), (*want, *want_caches)):
        assert torch.equal(g, w)


def test_compiled_and_eager_raise_the_same_error_for_bad_slots_positions_and_cos_sin_cache_rows():
    # compiled, a bad slot, position or NaN row raised torch's RuntimeError from an assertion in the graph, where
    # eager raised rotary's InputError naming the value; now both raise the same error with the same message
    rope = rotary.RoPE(D)
    cos, sin = rope.cos_sin(torch.arange(32))
    cos_sin_cache = torch.cat((cos[:, : D // 2], sin[:, : D // 2]), dim=-1)

    def step(q, k, v, kc, vc, slots, pos, table):
        return rotary.rotate_and_cache(q, k, v, kc, vc, slots, positions=pos, cos_sin_cache=table)

    def step_with_tables(q, k, v, kc, vc, slots, pos, table):
        return rotary.rotate_and_cache(q, k, v, kc, vc, slots, rope.tables(pos))

    def outcome(f, *args):
        try:
            return f(*args)
        except Exception as error:  # noqa: BLE001  (the type and message are compared)
            return type(error), str(error)

    rope.prepare(64)
    q, k, v = _inputs(torch.float32)
    positions = torch.tensor([[3, 4, 5], [7, 8, 9]])
    nan_row = cos_sin_cache.clone()
    nan_row[8, 1] = float("nan")
    cases = [  # (slots, positions, cos_sin_cache): one bad value each, and good input last
        (torch.tensor([[4, 5, 6], [0, 1, T]]), positions, cos_sin_cache),
        (torch.tensor([[4, 5, 4], [0, 1, 2]]), positions, cos_sin_cache),
        (SLOTS, torch.tensor([[3, 4, 5], [7, 8, 32]]), cos_sin_cache),
        (SLOTS, torch.tensor([[3, 4, 5], [7, -1, 9]]), cos_sin_cache),
        (SLOTS, positions, nan_row),
        (SLOTS, positions, cos_sin_cache),
    ]
    torch._dynamo.reset()
    for f in (step, step_with_tables):
        compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
        for i, (slots, pos, table) in enumerate(cases):
            if f is step_with_tables and (pos.min() < 0 or pos.max() >= 32 or table is nan_row):
                continue  # a RoPE's tables take any position, and have no NaN row
            want_caches, got_caches = _caches(torch.float32), _caches(torch.float32)
            want = outcome(f, q, k, v, *want_caches, slots, pos, table)
            got = outcome(compiled, q, k, v, *got_caches, slots, pos, table)
            if i < len(cases) - 1:  # rotary's InputError, named
                assert isinstance(want[0], type) and issubclass(want[0], ValueError), (f.__name__, i, want)
            for a, b in zip(got, want):
                assert a == b if not isinstance(a, torch.Tensor) else torch.equal(a, b), (f.__name__, i, got, want)
            assert all(torch.equal(a, b) for a, b in zip(got_caches, want_caches))


@pytest.mark.parametrize("shared", [False, True])
def test_a_bad_slot_on_an_accelerator_keeps_every_good_token_s_write(shared):
    # the bad token was clamped to row 0 and rewrote what row 0 held, racing the good token that writes row 0
    tables = rotary.RoPE(D).tables(torch.arange(S))
    q, k, v = _inputs(torch.float32)
    slots = torch.tensor([[4, 5, 6], [0, 1, -1]]) if not shared else torch.tensor([[4, 5, 0], [-1, 1, T]])
    caches = _caches(torch.float32, batch=1 if shared else B)
    with accelerator_rules():
        _, k_rot = rotary.rotate_and_cache(q, k, v, *caches, slots, tables)  # nothing raised: the contract
    good = (slots >= 0) & (slots < T)
    rows = torch.zeros_like(slots) if shared else torch.arange(B)[:, None].expand(B, S)
    assert torch.equal(caches[0][rows[good], slots[good]], k_rot[good])
    assert torch.equal(caches[1][rows[good], slots[good]], v[good])
    written = torch.zeros(caches[0].shape[:2], dtype=torch.bool)
    written[rows[good], slots[good]] = True
    assert (caches[0][~written] == 7).all() and (caches[1][~written] == 7).all()


@pytest.mark.parametrize("cache_layout", ["bshd", "bhsd"])
def test_slots_shared_by_every_sequence_write_what_their_copy_writes(cache_layout):
    """Slots ``[S]`` expanded over the batch (a StaticKVCache's write) take the one-index_copy_ path on the
    CPU: the caches equal those written with the same slots materialised per sequence."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(3, 2, h, 16, generator=g) for h in (4, 2, 2))
    rope = rotary.RoPE(16)
    slots = torch.tensor([5, 6])
    tables = rope.tables(slots)
    shape = (3, 9, 2, 16) if cache_layout == "bshd" else (3, 2, 9, 16)
    caches = [torch.zeros(shape) for _ in range(4)]
    expanded = slots.expand(3, -1)
    assert expanded.stride(0) == 0
    got = rotary.rotate_and_cache(q, k, v, caches[0], caches[1], expanded, tables, cache_layout=cache_layout)
    want = rotary.rotate_and_cache(
        q, k, v, caches[2], caches[3], expanded.contiguous(), tables, cache_layout=cache_layout
    )
    for a, b in zip((*got, caches[0], caches[1]), (*want, caches[2], caches[3])):
        assert torch.equal(a, b)
    assert caches[0].abs().sum() > 0


def _cos_sin_cache(rows=32):
    cos, sin = rotary.RoPE(D).cos_sin(torch.arange(rows))
    return torch.cat((cos[:, : D // 2], sin[:, : D // 2]), dim=-1)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_row_of_cos_sin_cache_is_named_on_the_cpu_and_the_contract_on_an_accelerator(bad):
    # a NaN or inf in the caller's cos_sin_cache: named on the CPU; on an accelerator nothing is read, and the
    # tokens that read it (only those) are not finite
    cos_sin_cache = _cos_sin_cache()
    cos_sin_cache[8, D // 2 + 1] = bad  # a sin value of position 8
    cos_sin_cache[30, 0] = bad  # a row no token reads: not checked (only the gathered rows are)
    q, k, v = _inputs(torch.float32)
    positions = torch.tensor([[3, 4, 5], [7, 8, 9]])
    caches = _caches(torch.float32)
    with pytest.raises(
        rotary.InputError, match=r"cos_sin_cache row 8 \(the position of token \(1, 1\)\) holds NaN or inf"
    ):
        rotary.rotate_and_cache(q, k, v, *caches, SLOTS, positions=positions, cos_sin_cache=cos_sin_cache)
    assert (caches[0] == 7).all() and (caches[1] == 7).all()  # nothing written
    with pytest.raises(rotary.InputError, match=r"cos_sin_cache row 8 \(the position of token 4\)"):
        tables_from_cos_sin_cache(cos_sin_cache, positions.flatten())
    good = torch.tensor([[3, 4, 5], [7, 6, 9]])
    want = rotary.rotate_and_cache(q, k, v, *_caches(torch.float32), SLOTS, rotary.RoPE(D).tables(good))
    got = rotary.rotate_and_cache(q, k, v, *_caches(torch.float32), SLOTS, positions=good, cos_sin_cache=cos_sin_cache)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    with accelerator_rules():  # nothing read, nothing raised: the token of row 8 is not finite
        q_rot, k_rot = rotary.rotate_and_cache(
            q, k, v, *_caches(torch.float32), SLOTS, positions=positions, cos_sin_cache=cos_sin_cache
        )
    assert (
        not torch.isfinite(q_rot[1, 1]).all() and torch.isfinite(q_rot[0]).all() and torch.isfinite(k_rot[1, 0]).all()
    )
    with accelerator_rules():
        got = rotary.rotate_and_cache(
            q, k, v, *_caches(torch.float32), SLOTS, positions=good, cos_sin_cache=cos_sin_cache
        )
    assert all(torch.equal(g, w) for g, w in zip(got, want))  # the good rows: the same result as on the CPU


def test_finite_cos_sin_cache_rows_whose_sum_overflows_are_not_refused():
    """The CPU check sums the gathered rows (NaN and inf survive a sum) and looks closer only when the sum
    is not finite: large finite values (the caller's table, used as given) overflow the sum, not the check."""
    cos_sin_cache = torch.full((16, D), 3e38)
    q, k, v = _inputs(torch.float32)
    tables = tables_from_cos_sin_cache(cos_sin_cache, torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert torch.equal(tables.cos, torch.full((B, S, D), 3e38))


def test_a_non_finite_cos_sin_cache_row_fails_when_the_compiled_graph_runs():
    cos_sin_cache = _cos_sin_cache()
    cos_sin_cache[8, 0] = float("nan")

    def step(q, k, v, kc, vc, slots, pos):
        return rotary.rotate_and_cache(q, k, v, kc, vc, slots, positions=pos, cos_sin_cache=cos_sin_cache)

    q, k, v = _inputs(torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    caches = _caches(torch.float32)
    compiled(q, k, v, *caches, SLOTS, torch.tensor([[3, 4, 5], [7, 6, 9]]))
    assert torch.isfinite(caches[0]).all()
    with pytest.raises(ValueError, match=r"cos_sin_cache row 8 \(the position of token \(1, 1\)\) holds NaN or inf"):
        compiled(q, k, v, *_caches(torch.float32), SLOTS, torch.tensor([[3, 4, 5], [7, 8, 9]]))  # eager's error


VLLM_FORM = textwrap.dedent(
    """
    import itertools, torch, rotary
    from covering import covering
    from rotary import devices, serving
    from rotary.kernels import triton as tk

    # on CUDA, vLLM's form goes to the kernel as it is: the kernel reads the tokens' rows of the
    # cos_sin_cache halves at the positions, checks them, and no table is gathered first. Against the path
    # that gathers the tables (tables_from_cos_sin_cache, then the same kernel): bit for bit
    devices.host_checks = lambda device: False  # as on an accelerator: nothing read on the host
    serving._fused_kernel_device = lambda q: True  # the CUDA branch, run by Triton's interpreter
    launches = []
    real = tk.rotate_and_cache_triton
    tk.rotate_and_cache_triton = lambda *a, **kw: (launches.append(kw.get("pair_tables", False)), real(*a, **kw))[1]
    D, HQ, HK, T = 8, 3, 2, 6
    checked = 0
    for cache_dtype, interleaved, r, (packed, layout), inplace in covering(
        (torch.float32, torch.bfloat16), (False, True), (8, 6), ((False, "bshd"), (True, "bshd"), (False, "bhsd")),
        (False, True),
    ):
        g = torch.Generator().manual_seed(checked)
        rope = rotary.RoPE(D, interleaved=interleaved, rotary_dim=r)
        cos, sin = rope.cos_sin(torch.arange(16))
        pairs = slice(None, None, 2) if interleaved else slice(None, r // 2)
        cache_form = torch.cat((cos[:, pairs], sin[:, pairs]), dim=-1).to(cache_dtype)  # [16, r]
        if packed:
            q, k, v = (torch.randn(5, h, D, generator=g) for h in (HQ, HK, HK))
            positions, slots = torch.tensor([0, 15, 3, 4, 9]), torch.tensor([0, 1, 2, 3, 5])
        else:
            shape = (lambda h: (2, 3, h, D)) if layout == "bshd" else (lambda h: (2, h, 3, D))
            q, k, v = (torch.randn(shape(h), generator=g) for h in (HQ, HK, HK))
            positions, slots = torch.tensor([[0, 15, 3], [4, 9, 9]]), torch.tensor([[0, 1, 2], [3, 5, 4]])
        bc = 1 if packed else 2
        results = []
        for direct in (True, False):
            kc, vc = torch.zeros(bc, T, HK, D), torch.zeros(bc, T, HK, D)
            if layout == "bhsd" and not packed:
                kc, vc = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
            qi, ki = (q.clone(), k.clone()) if inplace else (q, k)
            launches.clear()
            if direct:
                out = rotary.rotate_and_cache(qi, ki, v, kc, vc, slots, positions=positions, cos_sin_cache=cache_form,
                                              interleaved=interleaved, inplace=inplace, layout=layout, cache_layout=layout)
            else:  # the tables gathered first, then the kernel
                tables = serving.tables_from_cos_sin_cache(cache_form, positions, interleaved=interleaved)
                out = rotary.rotate_and_cache(qi, ki, v, kc, vc, slots, tables, inplace=inplace, layout=layout, cache_layout=layout)
            assert launches == [direct], (launches, direct)
            if inplace:
                assert out[0] is qi and out[1] is ki
            results.append((*out, kc, vc))
        for a, b in zip(*results):
            assert torch.equal(a, b), (cache_dtype, interleaved, r, packed, inplace, layout, (a - b).abs().max())
        checked += 1

    # the caller's contract, nothing raised: positions outside the cache (NaN for those tokens), NaN/inf rows
    # (not finite for those tokens), bad slots (not written)
    rope = rotary.RoPE(D)
    cos, sin = rope.cos_sin(torch.arange(16))
    cache_form = torch.cat((cos[:, :4], sin[:, :4]), dim=-1)
    cache_form[9, 5] = float("inf")
    q, k, v = (torch.randn(2, 3, h, D) for h in (HQ, HK, HK))
    positions, slots = torch.tensor([[0, 16, 3], [4, 9, -1]]), torch.tensor([[0, 1, 2], [3, 7, 4]])
    kc, vc = torch.zeros(2, T, HK, D), torch.zeros(2, T, HK, D)
    q_rot, k_rot = rotary.rotate_and_cache(q, k, v, kc, vc, slots, positions=positions, cos_sin_cache=cache_form)
    nan_tokens = torch.tensor([[False, True, False], [False, False, True]])
    assert torch.isnan(q_rot[nan_tokens]).all() and torch.isfinite(q_rot[0, [0, 2]]).all()
    assert not torch.isfinite(q_rot[1, 1]).all()  # the inf row
    assert (vc[1].abs().sum(-1).sum(-1) != 0).sum() == 2  # tokens (1, 0) and (1, 2) wrote; slot 7 did not
    print("vllm form ok", checked)
    """
)


@pytest.mark.slow
def test_the_vllm_form_goes_to_the_cuda_kernel_as_it_is():
    pytest.importorskip("triton")
    stdout = run_interpreted(VLLM_FORM)
    assert f"vllm form ok {len(covering(*SIZES[1]))}" in stdout
