"""apply_rotary and its in-place forms (functional.py). The interfaces users of other kernels already
write, each equal to the 4-D path:
flash-attn's ``seqlen_offsets`` and packed ``qkv`` / ``kv`` in-place calls, and vLLM's flat
``[tokens, H * D]`` layout with per-token positions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import rotary
from rotary import reference
from strategies import positions_strategy, tensors
from variant_checks import assert_close, expect, largest_angle, valid_ids

D = 16


@pytest.fixture
def tables():
    rope = rotary.RoPE(D, rotary_dim=12)
    return rope, *rope.cos_sin(torch.arange(40))


@pytest.mark.parametrize("interleaved", [False, True])
def test_seqlen_offsets_shift_each_sequence(interleaved, gen):
    rope = rotary.RoPE(D, interleaved=interleaved)
    cos, sin = rope.cos_sin(torch.arange(40))
    x = torch.randn(3, 2, 5, D, generator=gen)  # bhsd
    offsets = torch.tensor([0, 7, 30])
    got = rotary.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    for b, o in enumerate(offsets.tolist()):  # flash-attn's meaning: rows o .. o + S - 1 of the tables
        assert torch.equal(
            got[b], rotary.apply_rotary(x[b : b + 1], cos[o : o + 5], sin[o : o + 5], interleaved=interleaved)[0]
        )
    same = rotary.apply_rotary(x, cos, sin, interleaved=interleaved, seqlen_offsets=7)
    assert torch.equal(same, rope.rotate(x, offset=7))


def test_seqlen_offsets_with_cu_seqlens(tables, gen):
    rope, cos, sin = tables
    packed = torch.randn(4 + 6, 3, D, generator=gen)
    cu = torch.tensor([0, 4, 10])
    got = rotary.apply_rotary(packed, cos, sin, cu_seqlens=cu, seqlen_offsets=torch.tensor([2, 11]))
    assert torch.equal(got[:4], rope.rotate(packed[:4].unsqueeze(0), offset=2, layout="bshd")[0])
    assert torch.equal(got[4:], rope.rotate(packed[4:].unsqueeze(0), offset=11, layout="bshd")[0])


@pytest.mark.parametrize("layout_kind", ["stacked", "gqa"])
def test_qkv_in_place_equals_the_4d_path(layout_kind, tables, gen):
    rope, cos, sin = tables
    B, S, H = 2, 5, 4
    if layout_kind == "stacked":
        qkv = torch.randn(B, S, 3, H, D, generator=gen)
        q, k, v = qkv[:, :, 0].clone(), qkv[:, :, 1].clone(), qkv[:, :, 2].clone()
        kwargs = {}
    else:  # GQA: 4 q heads, 2 k heads, 2 v heads side by side
        qkv = torch.randn(B, S, H + 4, D, generator=gen)
        q, k, v = qkv[:, :, :H].clone(), qkv[:, :, H : H + 2].clone(), qkv[:, :, H + 2 :].clone()
        kwargs = {"num_heads_q": H}
    want_q, want_k = rope(q, k, layout="bshd", offset=3)
    out = rotary.apply_rotary_qkv_(qkv, cos, sin, seqlen_offsets=3, **kwargs)
    assert out is qkv
    got_q = qkv[:, :, 0] if layout_kind == "stacked" else qkv[:, :, :H]
    got_k = qkv[:, :, 1] if layout_kind == "stacked" else qkv[:, :, H : H + 2]
    got_v = qkv[:, :, 2] if layout_kind == "stacked" else qkv[:, :, H + 2 :]
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k) and torch.equal(got_v, v)


def test_qkv_with_key_tables_and_packed_sequences(tables, gen):
    rope, cos, sin = tables
    qkv = torch.randn(7, 3, 2, D, generator=gen)
    before = qkv.clone()
    cu = torch.tensor([0, 3, 7])
    rotary.apply_rotary_qkv_(qkv, cos, sin, cos_k=cos * 0.5, sin_k=sin * 0.5, cu_seqlens=cu, validate=False)
    assert torch.equal(qkv[:, 0], rope.rotate(before[:, 0], cu_seqlens=cu))
    want_k = rotary.apply_rotary(before[:, 1], cos * 0.5, sin * 0.5, cu_seqlens=cu, validate=False)
    assert torch.equal(qkv[:, 1], want_k) and torch.equal(qkv[:, 2], before[:, 2])


def test_kv_rotates_keys_only(tables, gen):
    rope, cos, sin = tables
    kv = torch.randn(2, 4, 2, 3, D, generator=gen)
    before = kv.clone()
    rotary.apply_rotary_kv_(kv, cos, sin, seqlen_offsets=torch.tensor([0, 9]))
    assert torch.equal(kv[1, :, 0], rope.rotate(before[1:, :, 0], offset=9, layout="bshd")[0])
    assert torch.equal(kv[:, :, 1], before[:, :, 1])


def test_vllm_flat_layout(tables, gen):
    rope, cos, sin = tables
    T, Hq, Hk = 6, 4, 2
    positions = torch.tensor([0, 1, 2, 9, 10, 33])
    query, key = torch.randn(T, Hq * D, generator=gen), torch.randn(T, Hk * D, generator=gen)
    q_out, k_out = rope(query, key, position_ids=positions)
    assert q_out.shape == query.shape and k_out.shape == key.shape
    want_q = rope.rotate(query.view(1, T, Hq, D), position_ids=positions, layout="bshd")[0].reshape(T, Hq * D)
    assert torch.equal(q_out, want_q)
    assert torch.equal(rotary.apply_rotary(key, cos, sin, position_ids=positions, head_dim=D), k_out)
    rope(query, key, position_ids=positions, inplace=True)
    assert torch.equal(query, q_out) and torch.equal(key, k_out)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=torch.tensor([1, 2, 3])),
            r"seqlen_offsets must be .*\[2\]",
        ),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=-1),
            "seqlen_offsets must be an int >= 0",
        ),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=torch.tensor([0, -4])),
            "rows must index the cos/sin table",  # a negative position has no row in a table you made
        ),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(2, 1, 3, D), c, s, seqlen_offsets=38),
            "reach position 40 but the cos/sin tables have only 40 rows",
        ),
        (
            lambda c, s: rotary.apply_rotary(
                torch.randn(2, 1, 3, D), c, s, seqlen_offsets=1, position_ids=torch.arange(3)
            ),
            "position_ids and seqlen_offsets each give positions; pass one",
        ),
        (lambda c, s: rotary.apply_rotary(torch.randn(5, 3 * D), c, s, position_ids=torch.arange(5)), "pass head_dim"),
        (
            lambda c, s: rotary.apply_rotary(torch.randn(5, 30), c, s, position_ids=torch.arange(5), head_dim=D),
            r"H \* D a multiple of head_dim=16; got shape \(5, 30\)",
        ),
        (lambda c, s: rotary.apply_rotary_qkv_(torch.randn(2, 3, 4, 2, D), c, s), r"\[B, S, 3, H, D\]"),
        (lambda c, s: rotary.apply_rotary_qkv_(torch.randn(2, 3, 5, D), c, s, num_heads_q=2), "Hq \\+ 2 \\* Hk"),
        (lambda c, s: rotary.apply_rotary_qkv_(torch.randn(2, 3, 3, 2, D), c, s, cos_k=c), "both cos_k and sin_k"),
        (lambda c, s: rotary.apply_rotary_kv_(torch.randn(2, 3, 3, 2, D), c, s), r"\[B, S, 2, H, D\]"),
        (
            lambda c, s: rotary.RoPE(D)(torch.randn(5, 30), torch.randn(5, 32), position_ids=torch.arange(5)),
            "multiple of head_dim=16; got shape \\(5, 30\\)",
        ),
    ],
)
def test_interface_errors(call, match, tables):
    _, cos, sin = tables
    with pytest.raises((ValueError, TypeError), match=match):
        call(cos, sin)


def raw_tables_verdict(x, cos, positions, ids_ok, interleaved, validate, sin=None) -> bool | None:
    """Whether ``apply_rotary(x, cos, sin, ...)`` (``sin`` defaults to ``cos``) must accept (True) or refuse (False) an
    arbitrary table, from its documented contract (its docstring, docs/core.md "Tables you made" and "Guarantees",
    ``check_tables``); None for values within a factor of 2 of a documented tolerance, which the property tests do not
    draw (:func:`rotation_rows_verdict`)."""
    batch, _, seq_len, width = x.shape
    if validate not in (True, False, "full", "sync"):
        return False
    if cos.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return False  # integer and bool tables hold no rotation
    r = cos.shape[-1] if cos.dim() else 0
    if r == 0 or r % 2 or r > width:
        return False  # r even, 0 < r <= head_dim
    if positions is None:  # the tokens' rows [S, r] or [B, S, r] (B: 1 or x's)
        if cos.dim() not in (2, 3) or cos.shape[-2] != seq_len or (cos.dim() == 3 and cos.shape[0] not in (1, batch)):
            return False
    elif not ids_ok or cos.dim() != 2 or (positions.numel() and int(positions.max()) >= cos.shape[0]):
        return False  # a table [T, r] holding every position read (a row past T is refused unvalidated too)
    if not validate or not cos.numel():
        return True  # validate=False checks no values; an empty table has none
    # the values of the rows validate reads (docs/core.md, "Guarantees"): every row with "full"; otherwise 4 rows
    # evenly spaced, the first and the last included, over the tokens' rows (positions None: the table's rows,
    # [B, S, r] read as B * S rows) or over the rows the positions read, in their order
    flat_cos, flat_sin = (t.double().reshape(-1, r) for t in (cos, cos if sin is None else sin))
    if validate == "full":
        read = slice(None)
    else:
        index = torch.arange(flat_cos.shape[0]) if positions is None else positions.reshape(-1).long()
        read = index[evenly_spaced(index.numel(), 4)]
    return rotation_rows_verdict(flat_cos[read], flat_sin[read], interleaved, cos.dtype)


def evenly_spaced(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)``, the first and the last included (all ``n`` when ``n <= k``)."""
    return list(range(n)) if n <= k else [round(i * (n - 1) / (k - 1)) for i in range(k)]


def rotation_rows_verdict(cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, dtype: torch.dtype) -> bool | None:
    """Whether float64 rows ``[N, r]`` pass the documented checks of a table's values (docs/core.md, "Guarantees"):
    finite, not all zero, the two channels of each pair within ``rtol`` of the largest value, cos²+sin² constant
    within ``10 rtol`` of its largest value; ``rtol`` 1e-5, or half an ulp for bf16/fp16 tables. None within a factor
    of 2 of either bound: the documented bound is a tolerance, not a cut to the bit, and such draws are not drawn."""
    if not cos.numel():
        return True
    if not bool(torch.isfinite(cos).all() and torch.isfinite(sin).all()):
        return False
    norm = cos * cos + sin * sin
    top = float(norm.max())
    if top == 0:
        return False
    rtol = 1e-5 if dtype in (torch.float32, torch.float64) else torch.finfo(dtype).eps / 2
    largest = max(float(cos.abs().max()), float(sin.abs().max()))
    (ca, cb), (sa, sb) = ((t[:, 0::2], t[:, 1::2]) if interleaved else t.chunk(2, -1) for t in (cos, sin))
    mismatch = max(float((ca - cb).abs().max()), float((sa - sb).abs().max()))
    spread = float(norm.max() - norm.min())  # within [1, 2] times the largest distance from any one value
    pairs, constant = mismatch / (rtol * largest), spread / (10 * rtol * top)
    if 0.5 < pairs <= 2 or 0.5 < constant <= 2:
        return None
    return pairs <= 0.5 and constant <= 0.5


@settings(max_examples=120, deadline=None)
@given(
    x=st.one_of(
        tensors(rank=4, max_size=4, dtype=torch.float32), tensors(rank=4, max_size=3, dtype=torch.float32, last=4)
    ),
    cos=tensors(max_size=6),
    made=st.booleans(),
    interleaved=st.booleans(),
    validate=st.sampled_from([True, False, "full", "maybe"]),
    positions=positions_strategy(),
    data=st.data(),
)
def test_apply_rotary_with_arbitrary_tables_never_crashes_inside(x, cos, made, interleaved, validate, positions, data):
    check_apply_rotary(x, cos, made, interleaved, validate, positions, data)


def _table(shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


X, STEP = torch.randn(2, 3, 4, 8), torch.randn(1, 2, 3, 4)


@pytest.mark.parametrize(
    "x, cos, interleaved, validate, positions, fits",
    [  # arbitrary tables that fit, which the derandomized draws above seldom make: accepted unvalidated
        (X, _table((4, 6), torch.float16), False, False, None, True),
        (X, _table((1, 4, 8), torch.bfloat16), True, False, None, True),
        (X, _table((2, 4, 2), torch.float32), False, False, None, True),
        (X[..., :5], _table((7, 4), torch.float64), False, False, torch.tensor([0, 6, 2, 3]), True),
        (STEP, _table((5, 2), torch.float16), True, False, torch.tensor([[4, 4, 0]], dtype=torch.int32), True),
        # an empty table has no values to check
        (X[:, :, :0], _table((0, 8), torch.float32), False, True, None, True),
        (X[:, :, :0], _table((2, 0, 4), torch.bfloat16), True, "full", None, True),
        # and some that do not: integer tables, a row past the table, r > D, validated random values
        (X, _table((4, 8), torch.int64), False, False, None, False),
        (X, _table((3, 8), torch.float32), False, False, torch.tensor([0, 1, 2, 3]), False),
        (X, _table((4, 10), torch.float32), False, False, None, False),
        (X, _table((4, 8), torch.float16), False, True, None, False),
    ],
)
def test_apply_rotary_with_arbitrary_tables_that_fit(x, cos, interleaved, validate, positions, fits):
    assert raw_tables_verdict(x, cos, positions, True, interleaved, validate) is fits
    check_apply_rotary(x, cos, False, interleaved, validate, positions, None)


def rotate_by_tables(x, cos, sin, interleaved):
    """``x [B, H, S, D]`` turned by the given rows ``cos``/``sin`` ``[B, S, r]``, in float64 (NumPy's formula for a
    pair (a, b): (a cos - b sin, b cos + a sin)); the channels past ``r`` pass through."""
    r = cos.shape[-1]
    out = x.double().clone()
    c, s_ = cos.double()[:, None], sin.double()[:, None]
    pairs = (out[..., 0:r:2], out[..., 1:r:2]) if interleaved else (out[..., : r // 2], out[..., r // 2 : r])
    a, b = (p.clone() for p in pairs)
    (ca, cb), (sa, sb) = ((t[..., 0::2], t[..., 1::2]) if interleaved else t.chunk(2, -1) for t in (c, s_))
    pairs[0].copy_(a * ca - b * sa)
    pairs[1].copy_(b * cb + a * sb)
    return out


@settings(max_examples=80, deadline=None)
@given(
    batch=st.integers(1, 2),
    seq_len=st.integers(1, 9),
    by_position=st.booleans(),
    corrupt=st.sets(st.integers(0, 11), max_size=3),
    how=st.sampled_from(["scaled", "channel", "nan", "zero"]),
    interleaved=st.booleans(),
    validate=st.sampled_from([True, True, "full", False]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    data=st.data(),
)
def test_apply_rotary_checks_the_rows_it_documents(
    batch, seq_len, by_position, corrupt, how, interleaved, validate, dtype, data
):
    """Real tables with some rows spoiled (scaled, one channel moved, a NaN, zeros): ``validate=True`` checks 4 rows
    evenly spaced over the rows the tokens read, "full" every row, False none (docs/core.md, "Guarantees"). A call
    is refused exactly when a checked row fails, and otherwise turns each token by its rows as given."""
    cos, sin = (t.clone() for t in rotary.RoPE(8, interleaved=interleaved).cos_sin(torch.arange(12)))
    for row in corrupt:
        if how == "scaled":
            cos[row], sin[row] = 1.5 * cos[row], 1.5 * sin[row]
        elif how == "channel":
            cos[row, 1] += 0.5
        elif how == "nan":
            sin[row, 2] = float("nan")
        else:
            cos[row], sin[row] = 0.0, 0.0
    cos, sin = cos.to(dtype), sin.to(dtype)
    x = torch.randn(batch, 2, seq_len, 8, generator=torch.Generator().manual_seed(seq_len))
    if by_position:  # tables [T, r] and the rows each token reads
        ids = st.lists(st.integers(0, 11), min_size=seq_len, max_size=seq_len)
        positions = torch.tensor(data.draw(st.lists(ids, min_size=batch, max_size=batch)))
        given = cos, sin
        rows = positions
    else:  # the tokens' own rows [B, S, r]
        start = data.draw(st.integers(0, 12 - seq_len))
        given = tuple(t[start : start + seq_len].expand(batch, seq_len, 8).contiguous() for t in (cos, sin))
        positions, rows = None, torch.arange(start, start + seq_len).expand(batch, seq_len)
    valid = raw_tables_verdict(x, given[0], positions, True, interleaved, validate, sin=given[1])
    assume(valid is not None)
    kwargs = {} if positions is None else {"position_ids": positions}
    out = expect(valid, rotary.apply_rotary, x, *given, interleaved=interleaved, validate=validate, **kwargs)
    if valid:  # (a row whose pair channels disagree, a NaN in one, is no rotation: its token's result is not defined)
        want = rotate_by_tables(x, cos.float()[rows], sin.float()[rows], interleaved)
        spoiled = sorted(corrupt) if how in ("channel", "nan") else []
        defined = ~torch.isin(rows, torch.tensor(spoiled, dtype=torch.long))
        defined = defined[:, None, :, None].expand_as(want)
        torch.testing.assert_close(out.double()[defined], want[defined], rtol=0, atol=1e-5, equal_nan=True)


def check_apply_rotary(x, cos, made, interleaved, validate, positions, data):
    """One call of :func:`test_apply_rotary_with_arbitrary_tables_never_crashes_inside` (``data``: None unless
    ``made``)."""
    batch, _, seq_len, width = x.shape
    if made:  # positions of x's tokens (or none) for the rotation tables
        ids = st.lists(st.integers(0, 60), min_size=seq_len, max_size=seq_len).map(lambda v: torch.tensor(v).long())
        positions = data.draw(st.one_of(st.none(), ids))
    # positions as apply_rotary documents them (docs/core.md, "Tables you made"): None (cos/sin are the rows of
    # x's tokens), or int64/int32 [S] / [1 or B, S], >= 0, rows of tables [T, r]
    ids_ok = positions is None or (
        valid_ids(positions)
        and positions.shape[-1] == seq_len
        and (positions.dim() == 1 or positions.shape[0] in (1, batch))
    )
    rows = seq_len if positions is None else int(positions.max()) + 1 if ids_ok and positions.numel() else 1
    # half the draws pass rotation tables RoPE makes for x's width and pairing (where x has channels to rotate and
    # the table is small), the others the arbitrary tensor drawn, as both cos and sin
    made = made and width > 0 and width % 2 == 0 and ids_ok and rows <= 4096
    if made:
        rope = rotary.RoPE(width, interleaved=interleaved)
        cos, sin = rope.cos_sin(torch.arange(rows))
        valid = validate in (True, False, "full")
    else:
        sin = cos
        valid = raw_tables_verdict(x, cos, positions, ids_ok, interleaved, validate)
    kwargs = dict(interleaved=interleaved, validate=validate)
    if positions is not None:
        kwargs["position_ids"] = positions
    if valid is None:  # values within a factor of 2 of a documented tolerance: not drawn
        assume(False)
    out = expect(valid, rotary.apply_rotary, x, cos, sin, **kwargs)
    if not valid:
        return
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.isfinite(out).all()  # finite x and finite tables
    r = cos.shape[-1]
    assert torch.equal(out[..., r:], x[..., r:])  # the channels past r pass through
    if made:  # the float64 reference rotation at each token's position
        ids = (torch.arange(seq_len) if positions is None else positions.long()).expand(batch, seq_len)
        want = torch.empty(x.shape, dtype=torch.float64)
        for b in range(batch):
            want[b] = reference.rotate_complex(x[b], ids[b], rope.inv_freq, interleaved=interleaved)
        assert_close(out, want, x, largest_angle(ids[..., None].double(), rope.inv_freq[None]))
