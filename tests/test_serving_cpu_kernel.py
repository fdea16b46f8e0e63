"""``rotary.rotate_and_cache`` on the CPU through the extension's one-pass kernel ``rope_cache``: bit for bit what
the general path (rotate, then one indexed write per cache) gives for the same call without the kernel; the
checks it makes before writing anything, with the general path's errors; and that the calls it should take
reach it (its calls are counted)."""

from __future__ import annotations

import functools
import itertools
import re

import pytest
import torch

import rotary
from covering import covering
from rotary import serving
from rotary.kernels.extension import load_cpu_extension

EXT = load_cpu_extension()
pytestmark = pytest.mark.skipif(EXT is None, reason="needs the compiled CPU extension")

B, S, HQ, HK, D, T, P = 3, 4, 4, 2, 16, 12, 40  # T: cache rows; P: rows of cos_sin_cache
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


class Kernel:
    """The extension, with the status of every ``rope_cache`` call recorded."""

    def __init__(self) -> None:
        self.statuses: list[list[int]] = []

    def rope_cache(self, *args):
        status, outs = EXT.rope_cache(*args)
        self.statuses.append(list(status))
        return status, outs

    def rope_cache_plan(self, *args):  # a recorded plan's call (rotary.plans): rope_cache when its signature holds
        status, outs = EXT.rope_cache_plan(*args)
        if list(status) != [-1]:  # (-1: another signature, nothing called)
            self.statuses.append(list(status))
        return status, outs

    def cache_signature(self, *args):
        return EXT.cache_signature(*args)


@pytest.fixture
def kernel(monkeypatch) -> Kernel:
    counted = Kernel()
    monkeypatch.setattr(serving, "load_cpu_extension", lambda: counted)
    return counted


def general(call):
    """``call()`` as if the extension were not loaded: the general path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serving, "load_cpu_extension", lambda: None)
        return call()


@functools.cache
def _rope(r: int, interleaved: bool) -> rotary.RoPE:
    """One RoPE per rotated width and pairing, shared by the calls (each new one would build its table cache)."""
    return rotary.RoPE(D, rotary_dim=r, interleaved=interleaved)


def _cos_sin_cache(r: int, interleaved: bool, dtype=torch.float32) -> torch.Tensor:
    cos, sin = _rope(r, interleaved).cos_sin(torch.arange(P))
    half = slice(None, None, 2) if interleaved else slice(None, r // 2)
    return torch.cat((cos[:, half], sin[:, half]), dim=-1).to(dtype)


def _tables_and_kwargs(form: str, r: int, interleaved: bool, positions: torch.Tensor) -> dict:
    """The keyword arguments giving the tables of ``positions`` ``[B, S]`` in one of the forms a caller uses."""
    rope = _rope(r, interleaved)
    if form == "rows [B, S]":
        return dict(tables=rope.tables(positions))
    if form == "rows [S]":
        return dict(tables=rope.tables(positions[0]))
    if form == "shared [S, r]":
        return dict(tables=rope.tables(rotary.positions.arange(S, offset=5)))
    if form == "per token [B, S, r]":
        cos, sin = rope.tables(positions).gather()
        return dict(tables=rotary.RotaryTables.from_tensors(cos, sin, interleaved=interleaved))
    if form == "per token [1, S, r]":
        cos, sin = rope.tables(positions[:1]).gather()
        return dict(tables=rotary.RotaryTables.from_tensors(cos, sin, interleaved=interleaved))
    if form == "cos_sin_cache":
        return dict(positions=positions, cos_sin_cache=_cos_sin_cache(r, interleaved), interleaved=interleaved)
    if form == "cos_sin_cache, positions [S]":
        return dict(positions=positions[0], cos_sin_cache=_cos_sin_cache(r, interleaved), interleaved=interleaved)
    if form == "cos_sin_cache bf16":  # gathered and widened by tables_from_cos_sin_cache: the kernel's tables form
        cache = _cos_sin_cache(r, interleaved, torch.bfloat16)
        return dict(positions=positions, cos_sin_cache=cache, interleaved=interleaved)
    raise AssertionError(form)


FORMS = (
    "rows [B, S]",
    "rows [S]",
    "shared [S, r]",
    "per token [B, S, r]",
    "per token [1, S, r]",
    "cos_sin_cache",
    "cos_sin_cache, positions [S]",
    "cos_sin_cache bf16",
)


def _inputs(dtype, layout, dv, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h, d: (B, S, h, d)) if layout == "bshd" else (lambda h, d: (B, h, S, d))
    return [torch.randn(shape(h, d), generator=g).to(dtype) for h, d in ((HQ, D), (HK, D), (HK, dv))]


def _caches(dtype, cache_layout, batch, dv):
    shape = (lambda d: (batch, T, HK, d)) if cache_layout == "bshd" else (lambda d: (batch, HK, T, d))
    return [torch.full(shape(D), 7.0, dtype=dtype), torch.full(shape(dv), -3.0, dtype=dtype)]


def _slots(kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "per sequence":  # distinct within each sequence, in no order (the kernel sorts these)
        return torch.stack([torch.randperm(T, generator=g)[:S] for _ in range(B)])
    if kind == "expanded [S]":  # a StaticKVCache's slots: stride 0 over the batch
        return torch.tensor([6, 2, 9, 3]).expand(B, S)
    if kind == "one cache row":  # Bc = 1: distinct over every token
        return torch.randperm(T, generator=g)[: B * S].view(B, S)
    raise AssertionError(kind)


def _caller(slots: torch.Tensor, **kwargs):
    """``rotate_and_cache`` of the tensors it is given, with ``slots`` and ``kwargs``."""
    return lambda q, k, v, k_cache, v_cache: rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, **kwargs)


def _both(call, kernel: Kernel, *tensors: torch.Tensor):
    """``call(*copies)`` on the kernel and on the general path, each with its own copies of ``tensors`` (written
    in place): ``(results, copies)`` of each, and the kernel's statuses."""
    mine = [t.clone() for t in tensors]
    theirs = [t.clone() for t in tensors]
    kernel.statuses.clear()
    got = call(*mine)
    statuses = list(kernel.statuses)
    want = general(lambda: call(*theirs))
    return (got, mine), (want, theirs), statuses


def _assert_equal(got, want):
    (g_out, g_in), (w_out, w_in) = got, want
    for a, b in zip((*g_out, *g_in), (*w_out, *w_in)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


#: the factors of a call besides its dtype, pairing and tables' form: layout, cache layout, rotated width, in
#: place, slots, value width (96 combinations)
CALLS = (
    ("bshd", "bhsd"),
    ("bshd", "bhsd"),
    (D, 10),
    (False, True),
    ("per sequence", "expanded [S]", "one cache row"),
    (D, 8),
)
#: each test (one dtype, pairing and form) runs the rows of CALLS' product that hold every combination of any 3
#: of its factors (tests/covering.py: 18 of 96; the whole product under make fuzz), each with the seed of its place
#: in the product
COVERING = [(list(itertools.product(*CALLS)).index(row), row) for row in covering(*CALLS)]


@pytest.mark.parametrize(("dtype", "interleaved", "form"), list(itertools.product(DTYPES, (False, True), FORMS)))
def test_the_kernel_gives_the_general_path_s_result_bit_for_bit(kernel, dtype, interleaved, form):
    """Each call (of the covering rows of CALLS) takes the kernel once, and gives the general path's outputs, q,
    k and caches bit for bit: q and k themselves in place, else unchanged."""
    for seed, (layout, cache_layout, r, inplace, slot_kind, dv) in COVERING:
        positions = torch.randint(0, P, (B, S), generator=torch.Generator().manual_seed(seed))
        kwargs = _tables_and_kwargs(form, r, interleaved, positions)
        slots = _slots(slot_kind, seed)
        batch = 1 if slot_kind == "one cache row" else B
        call = _caller(slots, layout=layout, cache_layout=cache_layout, inplace=inplace, **kwargs)
        got, want, statuses = _both(
            call, kernel, *_inputs(dtype, layout, dv, seed), *_caches(dtype, cache_layout, batch, dv)
        )
        assert statuses == [[]], (layout, cache_layout, r, inplace, slot_kind, dv)  # taken, once, and done
        _assert_equal(got, want)
        if inplace:
            assert got[0][0] is got[1][0] and got[0][1] is got[1][1]  # q and k themselves
        else:  # q and k unchanged
            assert torch.equal(got[1][0], want[1][0]) and not torch.equal(got[0][0], got[1][0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["cos_sin_cache", "rows [T]"])
def test_packed_tokens_into_a_flat_cache(kernel, dtype, form):
    g = torch.Generator().manual_seed(1)
    tokens = 7
    q, k, v = (torch.randn(tokens, h, d, generator=g).to(dtype) for h, d in ((HQ, D), (HK, D), (HK, 6)))
    caches = (torch.zeros(1, 20, HK, D, dtype=dtype), torch.zeros(1, 20, HK, 6, dtype=dtype))
    slots = torch.tensor([19, 0, 3, 4, 7, 8, 12])
    ids = torch.tensor([0, 1, 2, 0, 1, 0, 5])  # three packed sequences
    if form == "cos_sin_cache":
        kwargs = dict(positions=ids, cos_sin_cache=_cos_sin_cache(12, True), interleaved=True)
    else:
        kwargs = dict(tables=rotary.RoPE(D, rotary_dim=12).tables(rotary.positions.from_ids(ids, packed=True)))
    got, want, statuses = _both(lambda *t: rotary.rotate_and_cache(*t, slots, **kwargs), kernel, q, k, v, *caches)
    assert statuses == [[]]
    _assert_equal(got, want)
    assert got[0][0].shape == (tokens, HQ, D)


def test_q_k_and_v_sliced_from_one_projection_in_place(kernel):
    """q and k in place from one qkv buffer: their memory interleaves, so the kernel leaves the exact check of
    shared elements to the caller (status 5), which finds none and calls again."""
    qkv = torch.randn(B, S, HQ + 2 * HK, D)
    tables = rotary.RoPE(D).tables(torch.arange(S))
    slots = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])

    def call(buffer, k_cache, v_cache):
        q, k, v = buffer[:, :, :HQ], buffer[:, :, HQ : HQ + HK], buffer[:, :, HQ + HK :]
        out = rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, tables, inplace=True)
        assert out[0] is q and out[1] is k
        return ()

    got, want, statuses = _both(call, kernel, qkv, *_caches(torch.float32, "bshd", B, D))
    assert statuses == [[5], []]
    _assert_equal(got, want)


def _error(call, kernel: Kernel, *tensors: torch.Tensor) -> tuple[str, list[list[int]], list[torch.Tensor]]:
    """The message of the InputError ``call(*copies)`` raises on the kernel, which must be the general path's, the
    kernel's statuses, and the copies (to show that nothing was written)."""
    mine = [t.clone() for t in tensors]
    kernel.statuses.clear()
    with pytest.raises(rotary.InputError) as raised:
        call(*mine)
    statuses = list(kernel.statuses)
    with pytest.raises(rotary.InputError) as expected:
        general(lambda: call(*[t.clone() for t in tensors]))
    assert str(raised.value) == str(expected.value)
    for before, after in zip(tensors, mine):  # nothing written: not the caches, nor q and k in place
        assert torch.equal(before, after)
    return str(raised.value), statuses


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize(
    ("slots", "batch", "code", "match"),
    [
        (
            torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, T]]),
            B,
            3,
            rf"slots must be in 0 .. {T - 1} .* got 0 .. {T}",
        ),
        (torch.tensor([[0, 1, 2, 3], [4, -1, 6, 7], [8, 9, 10, 11]]), B, 3, r"got -1 .. 11"),
        (torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 11, 10, 11]]), B, 4, r"\(batch 2, slot 11\) more than once"),
        (torch.tensor([[3, 2, 3, 2], [4, 5, 6, 7], [8, 9, 10, 11]]), B, 4, r"\(batch 0, slot 2\) more than once"),
        (torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 1]]), 1, 4, r"\(batch 0, slot 1\) more than once"),
        (torch.tensor([5, 6, 5, 7]).expand(B, S), B, 4, r"\(batch 0, slot 5\) more than once"),
    ],
)
def test_bad_slots_raise_the_general_path_s_error_and_write_nothing(kernel, slots, batch, code, match, inplace):
    tables = rotary.RoPE(D).tables(torch.arange(S))

    def call(q, k, v, k_cache, v_cache):
        return rotary.rotate_and_cache(q, k, v, k_cache, v_cache, slots, tables, inplace=inplace)

    message, statuses = _error(
        call, kernel, *_inputs(torch.float32, "bshd", D, 0), *_caches(torch.float32, "bshd", batch, D)
    )
    assert statuses[0][0] == code
    assert re.search(match, message)


@pytest.mark.parametrize(
    ("change", "code", "match"),
    [
        (
            dict(positions=torch.tensor([[1, 2, 3, 4], [5, 6, 7, P], [0, 0, 0, 0]])),
            1,
            rf"positions must be in 0 .. {P - 1} .* got 0 .. {P}",
        ),
        (dict(positions=torch.tensor([[1, 2, 3, 4], [5, -2, 7, 8], [0, 0, 0, 0]])), 1, r"got -2 .. 8"),
        (dict(nan_row=6), 2, r"cos_sin_cache row 6 \(the position of token \(1, 1\)\) holds NaN or inf"),
        (dict(nan_row=6, inf=True), 2, r"cos_sin_cache row 6 \(the position of token \(1, 1\)\) holds NaN or inf"),
        (dict(nan_row=6, positions_1d=True), 2, r"cos_sin_cache row 6 \(the position of token 1\) holds NaN or inf"),
    ],
)
def test_bad_positions_or_cos_sin_cache_rows_raise_the_general_path_s_error_and_write_nothing(
    kernel, change, code, match
):
    positions = change.get("positions", torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 0, 0]]))
    cos_sin_cache = _cos_sin_cache(D, False)
    if "nan_row" in change:
        cos_sin_cache[change["nan_row"], 3] = float("inf") if change.get("inf") else float("nan")
        cos_sin_cache[30, 0] = float("nan")  # a row no token reads: not checked
        positions = torch.tensor([5, 6, 7, 8]) if change.get("positions_1d") else positions
    slots = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])

    def call(q, k, v, k_cache, v_cache):
        return rotary.rotate_and_cache(
            q, k, v, k_cache, v_cache, slots, positions=positions, cos_sin_cache=cos_sin_cache
        )

    message, statuses = _error(
        call, kernel, *_inputs(torch.float32, "bshd", D, 0), *_caches(torch.float32, "bshd", B, D)
    )
    assert statuses == [[code, *statuses[0][1:]]] and len(statuses[0]) == 3
    assert re.search(match, message)


def test_caches_sharing_memory_are_refused_as_on_the_general_path(kernel):
    q, k, v = _inputs(torch.float32, "bshd", D, 0)
    k_cache, v_cache = _caches(torch.float32, "bshd", B, D)
    tables = rotary.RoPE(D).tables(torch.arange(S))
    slots = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    for args, match in (
        ((q, k, v_cache[:, 2 : 2 + S], k_cache, v_cache), "v and v_cache share memory"),
        ((q, k, v, k_cache, k_cache), "k_cache and v_cache share memory"),
        ((q, k, v, k_cache[:1].expand(B, T, HK, D), v_cache), "k_cache .* overlapping memory"),
    ):
        kernel.statuses.clear()
        with pytest.raises(rotary.InputError, match=match):
            rotary.rotate_and_cache(*args, slots, tables)
        assert kernel.statuses == [[5]]
    assert (k_cache == 7).all() and (v_cache == -3).all()


def test_what_the_kernel_does_not_take_runs_the_general_path(kernel):
    """Autograd, per-head tables, int32 slots, strided channels, an fp64 table for fp32 inputs: the kernel says
    it did nothing (status 0) and the general path gives its result."""
    q, k, v = _inputs(torch.float32, "bshd", D, 0)
    slots = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    tables = rotary.RoPE(D).tables(torch.arange(S))
    wide = torch.randn(B, S, HQ, 2 * D)[..., ::2]  # channels two elements apart
    cases = [
        dict(q=q.clone().requires_grad_()),
        dict(slots=slots.int()),
        dict(q=wide),
        dict(tables=rotary.RoPE(D).tables(torch.arange(S), dtype=torch.float64)),
    ]
    for change in cases:
        args = dict(q=q, k=k, v=v, slots=slots, tables=tables) | change
        kernel.statuses.clear()
        got_caches, want_caches = _caches(torch.float32, "bshd", B, D), _caches(torch.float32, "bshd", B, D)
        got = rotary.rotate_and_cache(**args, k_cache=got_caches[0], v_cache=got_caches[1])
        assert kernel.statuses == [[0]], change.keys()
        want = general(
            functools.partial(rotary.rotate_and_cache, **args, k_cache=want_caches[0], v_cache=want_caches[1])
        )
        for a, b in zip((*got, *got_caches), (*want, *want_caches)):
            assert torch.equal(a, b)


def test_a_static_cache_decoding_step_takes_the_kernel(kernel):
    rope = rotary.RoPE(D)
    cache = rotary.nn.StaticKVCache(B, HK, 8, D)
    q, k = torch.randn(B, HQ, 1, D), torch.randn(B, HK, 1, D)
    positions = torch.tensor([3])
    cache.rotate_and_update(q, k, k * 2, rope.tables(positions), positions)
    assert kernel.statuses == [[]]


@pytest.mark.parametrize("inplace", [False, True])
def test_values_given_as_the_keys_themselves(kernel, inplace):
    """In place, the general path rotates every key before it writes v: v given as k itself is written rotated.
    The kernel, which copies a token's values after rotating its keys, leaves that call to the general path."""
    tables = rotary.RoPE(D).tables(torch.arange(S))
    slots = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])

    def call(q, k, k_cache, v_cache):
        return rotary.rotate_and_cache(q, k, k, k_cache, v_cache, slots, tables, inplace=inplace)

    q, k, _ = _inputs(torch.float32, "bshd", D, 0)
    got, want, statuses = _both(call, kernel, q, k, *_caches(torch.float32, "bshd", B, D))
    assert statuses == ([[5]] if inplace else [[]])
    _assert_equal(got, want)
    assert torch.equal(got[1][3][0, :S], got[0][1][0] if inplace else k[0])  # v_cache: the keys rotated in place


@pytest.mark.parametrize(("dtype", "value_dtype"), [(torch.bfloat16, torch.float32), (torch.float32, torch.float16)])
def test_values_of_a_dtype_of_their_own(kernel, dtype, value_dtype):
    q, k, _ = _inputs(dtype, "bhsd", D, 3)
    v = torch.randn(B, HK, S, 6).to(value_dtype)
    caches = (torch.zeros(B, HK, T, D, dtype=dtype), torch.zeros(B, HK, T, 6, dtype=value_dtype))
    call = _caller(
        _slots("expanded [S]", 0), tables=rotary.RoPE(D).tables(torch.arange(S)), layout="bhsd", cache_layout="bhsd"
    )
    got, want, statuses = _both(call, kernel, q, k, v, *caches)
    assert statuses == [[]]
    _assert_equal(got, want)
    assert torch.equal(got[1][4][:, :, [6, 2, 9, 3]], v)
