"""rotary.positions: every way positions enter, validated once, with the bound tables are sized from."""

from __future__ import annotations

import pytest
import torch

import rotary
from rotary import positions as P


def test_arange_needs_no_device_read_and_knows_its_slice():
    p = P.arange(5, offset=7)
    assert p.ids.tolist() == [7, 8, 9, 10, 11] and p.bound == 12 and p.start == 7 and p.exact
    assert p.batch is None and p.seq_len == 5


def test_from_ids_bound_is_exact_and_batch_is_checked():
    p = P.from_ids(torch.tensor([[3, 9, 1], [0, 0, 2]]), batch=2, seq_len=3)
    assert p.bound == 10 and p.exact and p.batch == 2 and p.ids.dtype == torch.int64
    assert (
        P.from_ids(torch.tensor([[0, 1, 2]], dtype=torch.int32), batch=4).ids.dtype == torch.int64
    )  # [1, S] broadcasts


def test_left_padding_from_mask_is_an_upper_bound():
    p = P.from_attention_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]))
    assert p.ids.tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert p.bound == 4 and not p.exact


def test_cu_seqlens_restart_at_zero():
    p = P.from_cu_seqlens(torch.tensor([0, 3, 3, 7]), 7)
    assert p.ids.tolist() == [0, 1, 2, 0, 1, 2, 3] and p.bound == 4 and p.packed and p.exact
    generous = P.from_cu_seqlens(torch.tensor([0, 3, 7]), 7, max_seqlen=10)
    assert generous.bound == 10 and not generous.exact


def test_continuation_after_a_left_padded_cache():
    cached = P.from_ids(torch.tensor([[0, 0, 1], [0, 1, 2]]))
    nxt = P.continuation(cached, 2)
    assert nxt.ids.tolist() == [[2, 3], [3, 4]] and nxt.bound == 5


def test_grid_is_row_major():
    g = P.grid(2, 3, 4)
    assert g.ids.shape == (24, 3) and g.axes == 3 and g.bound == 4
    assert g.ids[5].tolist() == [0, 1, 1] and g.ids[-1].tolist() == [1, 2, 3]
    assert P.from_ids(g.ids, axes=3).axes == 3


@pytest.mark.parametrize(
    "ids, kwargs, exc, match",
    [
        (torch.arange(4.0), {}, TypeError, "integer dtype.*float32"),
        (torch.ones(4, dtype=torch.bool), {}, TypeError, "integer dtype.*bool"),
        (torch.arange(4, dtype=torch.uint8), {}, TypeError, "uint8.*boolean mask"),
        (torch.arange(4, dtype=torch.int16), {}, TypeError, "int64 or int32, got torch.int16"),
        ([0, 1, 2], {}, TypeError, "must be an integer tensor, got list"),
        (torch.tensor([0, -3, 1]), {}, ValueError, "must be >= 0, got a minimum of -3"),
        (torch.zeros(1, 1, 4, dtype=torch.long), {}, ValueError, r"\[S\] or \[B, S\].*\(1, 1, 4\)"),
        (torch.zeros(2, 4, dtype=torch.long), {"packed": True}, ValueError, r"must be \[T\]"),
        (torch.zeros(4, 2, dtype=torch.long), {"axes": 3}, ValueError, r"\[S, 3\] or \[B, S, 3\]"),
        (torch.arange(5), {"seq_len": 4}, ValueError, "cover S=5 positions but the input has S=4"),
        (torch.zeros(3, 4, dtype=torch.long), {"batch": 2}, ValueError, "have batch 3 but the input has batch 2"),
    ],
)
def test_bad_position_ids(ids, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        P.from_ids(ids, **kwargs)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: P.arange(-1), ValueError, "seq_len must be an int >= 0"),
        (lambda: P.arange(3, offset=1.5), ValueError, "offset must be an int >= 0, got 1.5"),
        (lambda: P.arange(3, offset=True), ValueError, "offset must be an int"),
        (lambda: P.from_cu_seqlens(torch.tensor([0.0, 3.0]), 3), TypeError, "integer tensor"),
        (lambda: P.from_cu_seqlens(torch.tensor([1, 3]), 3), ValueError, "start at 0"),
        (lambda: P.from_cu_seqlens(torch.tensor([0, 4]), 3), ValueError, "end at the 3 packed tokens"),
        (lambda: P.from_cu_seqlens(torch.tensor([0, 3]), 3, max_seqlen=2), ValueError, "max_seqlen=2"),
        (lambda: P.from_attention_mask(torch.zeros(2, 3)), ValueError, "additive float masks are not accepted"),
        (lambda: P.from_attention_mask(torch.full((1, 3), 2)), ValueError, "only 0 and 1"),
        (lambda: P.grid(), ValueError, "at least one size"),
        (lambda: P.grid(2, 0), ValueError, "grid size 1 must be a positive int"),
        (lambda: P.continuation(P.from_ids(torch.zeros(1, 0, dtype=torch.long)), 2), ValueError, "at least one cached"),
    ],
)
def test_bad_position_sources(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_grid_of_one_axis_is_plain_1d_positions():
    p = P.grid(5)
    assert p.ids.tolist() == [0, 1, 2, 3, 4] and p.axes == 1 and p.seq_len == 5 and p.batch is None


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        # the positions-beside-an-offset mistake: start says 0 .. 2, the ids say 5 .. 7
        (dict(ids=torch.tensor([5, 6, 7]), bound=8, start=0), ValueError, "start=0 says the ids are 0 .. 2"),
        # a bound that is too small: tables sized from it would not reach the last id
        (dict(ids=torch.tensor([0, 9]), bound=4), ValueError, "an id is 9 but bound=4"),
        # an exact bound that is only an upper bound: length-dependent scaling would use the wrong length
        (dict(ids=torch.tensor([0, 1, 2]), bound=100), ValueError, r"exact=True says bound is max\(ids\) \+ 1 = 3"),
        (dict(ids=torch.tensor([-1, 0]), bound=1), ValueError, "must be >= 0, got a minimum of -1"),
        (dict(ids=torch.tensor([0.0, 1.0]), bound=2), TypeError, "integer dtype"),
        (dict(ids=torch.zeros(2, 3, 4, dtype=torch.long), bound=1), ValueError, r"must be \[S\] or \[B, S\]"),
        (dict(ids=torch.zeros(4, 2, dtype=torch.long), bound=1, axes=3), ValueError, r"\[S, 3\] or \[B, S, 3\]"),
        (dict(ids=torch.arange(3), bound=3, packed="yes"), TypeError, "Positions.packed must be True or False"),
        (dict(ids=torch.arange(3), bound=-1), ValueError, "Positions.bound"),
        (dict(ids=torch.arange(6).view(2, 3), bound=6, start=0), ValueError, "start is for shared 1-D ids"),
    ],
)
def test_positions_made_by_hand_are_checked_against_their_claims(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        P.Positions(**kwargs)


def test_positions_made_by_hand_that_hold_their_claims_rotate_like_the_factories():
    import rotary

    rope = rotary.RoPE(16, scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4})
    q = torch.randn(1, 2, 3, 16, generator=torch.Generator().manual_seed(0))
    by_hand = P.Positions(torch.tensor([5, 6, 7]), 8, start=5)
    upper = P.Positions(torch.tensor([5, 6, 7]), 100, exact=False)
    expected = rope(q, q, position_ids=torch.tensor([5, 6, 7]))[0]
    assert torch.equal(rope(q, q, position_ids=by_hand)[0], expected)
    assert torch.equal(by_hand.ids, P.arange(3, offset=5).ids) and by_hand != P.arange(3, offset=5)  # identity
    assert upper.bound == 100 and not upper.exact


def test_unchecked_positions_skip_the_checks_and_the_device_read(monkeypatch):
    monkeypatch.setattr(torch, "aminmax", lambda *a, **k: pytest.fail("unchecked positions read the device"))
    p = P.Positions.unchecked(torch.tensor([3, 4]), 5, exact=True)
    assert p.ids.tolist() == [3, 4] and p.bound == 5


def test_positions_past_two_to_the_53_are_refused():
    assert P.MAX_POSITION == 2**53
    with pytest.raises(ValueError, match="2\\*\\*53"):
        P.arange(4, offset=2**53)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        P.from_ids(torch.tensor([0, 2**60]))
    with pytest.raises(ValueError, match="2\\*\\*53"):
        P.Positions(torch.tensor([2**62]), None)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        rotary.RoPE(8)(torch.randn(1, 1, 2, 8), torch.randn(1, 1, 2, 8), offset=2**63 - 8)
    P.arange(1, offset=2**53)  # the largest is fine


def test_continuation_needs_positions():
    with pytest.raises(TypeError, match="previous must be Positions"):
        P.continuation(torch.arange(3), 2)


def test_compiled_and_eager_name_the_same_negative_id():
    # compiled, a negative id was torch's RuntimeError from an assertion in the graph where eager raised
    # rotary's InputError; now an op in the graph (rotary::checked_ids) raises eager's error, and with several
    # negative ids both name the smallest
    def integer(ids):
        return P.integer_positions(ids) * 2

    def outcome(f, ids):
        try:
            return f(ids).tolist()
        except Exception as error:  # noqa: BLE001  (the type and message are compared)
            return type(error), str(error)

    torch._dynamo.reset()
    compiled = torch.compile(integer, backend="eager", fullgraph=True, dynamic=True)
    several, good = torch.tensor([[3, -2, 5, -7]]), torch.tensor([[0, 4, 9]])
    want = (rotary.errors.InputError, "position_ids must be >= 0, got a minimum of -7")
    assert outcome(integer, several) == outcome(compiled, several) == want
    assert outcome(compiled, good) == outcome(integer, good) == [[0, 8, 18]]
