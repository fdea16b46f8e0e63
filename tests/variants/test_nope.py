"""NoPE layers and Llama 4's NoPE query temperature (variants/nope.py): for arbitrary arguments, the
helpers and the temperature tables are right when the arguments meet the documented contract (decided
by each test, without calling rotary) and a named error when they do not."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.variants import default_no_rope_layers, nope_temperature, rope_layer_flags
from variant_checks import EPS64, expect, is_int, is_number, valid_ids


@settings(max_examples=40, deadline=None)
@given(
    # weighted to valid layers (three in four) and positions, so that the temperatures are checked in most draws
    head_dim=st.sampled_from([8, 6, 2, 8, 6, 0, 7, "8"]),
    floor_scale=st.sampled_from([8192, 4, 1, 8192, 4, 1, 0, 4.0]),
    positions=st.one_of(
        st.lists(st.integers(0, 2**40), min_size=0, max_size=4).map(torch.tensor),
        st.lists(st.lists(st.integers(0, 20000), min_size=3, max_size=3), min_size=1, max_size=2).map(torch.tensor),
        st.lists(st.integers(-3, 20), min_size=1, max_size=4).map(torch.tensor),
        st.just(torch.tensor([1.0, 2.0])),
        st.just(torch.arange(6).reshape(2, 3)),
        st.just(torch.zeros(2, 2, 2, dtype=torch.int64)),
    ),
)
def test_nope_temperature_tables_are_right_or_a_named_error(head_dim, floor_scale, positions):
    # head_dim an even int > 0, floor_scale an int > 0; positions [S] or [B, S] (positions.from_ids)
    valid = is_int(head_dim) and head_dim > 0 and head_dim % 2 == 0 and is_int(floor_scale) and floor_scale > 0
    module = expect(valid, rotary.variants.NoPETemperature, head_dim, floor_scale=floor_scale)
    if not valid:
        return
    tables = expect(valid_ids(positions), module.tables, positions)
    if tables is None:
        return
    tau = torch.tensor(
        [1.0 + 0.1 * math.log1p((n + 1) // floor_scale) for n in positions.reshape(-1).tolist()], dtype=torch.float64
    ).reshape(positions.shape)
    assert torch.allclose(
        tables.cos.double(), tau.unsqueeze(-1).expand(*positions.shape, head_dim), rtol=2**-23, atol=0
    )
    assert not tables.sin.any() and bool((tables.k_cos == 1).all()) and not tables.k_sin.any()


@settings(max_examples=80, deadline=None)
@given(
    positions=st.one_of(
        st.lists(st.integers(0, 2**40), min_size=0, max_size=5).map(torch.tensor),
        st.lists(st.integers(-20000, 2**62), min_size=1, max_size=4).map(torch.tensor),
        st.lists(st.integers(0, 100), min_size=1, max_size=4).map(lambda v: torch.tensor(v, dtype=torch.int32)),
        st.just(torch.tensor([1.5, 8191.0])),
        st.just(torch.tensor([True, False])),
        st.just(torch.tensor([2**63 - 1])),
        st.just([0, 8191]),
        st.just(8191),
    ),
    floor_scale=st.sampled_from([8192, 8192, 1, 3, 0, -8192, 8192.0, True, "8192"]),
    attn_scale=st.sampled_from([0.1, 0.1, 0.0, 1.0, 1e300, -0.1, math.nan, math.inf, True, "0.1"]),
)
def test_nope_temperature_is_right_or_a_named_error(positions, floor_scale, attn_scale):
    # positions of any shape (integer_positions), floor_scale an int > 0, attn_scale a finite number >= 0
    scale_ok = is_number(attn_scale) and attn_scale >= 0
    valid = valid_ids(positions, ranks=None, top=None) and is_int(floor_scale) and floor_scale > 0 and scale_ok
    tau = expect(valid, nope_temperature, positions, floor_scale=floor_scale, attn_scale=attn_scale)
    if not valid:
        return
    assert tau.dtype == torch.float64 and tau.shape == positions.shape and bool(torch.isfinite(tau).all())
    for n, t in zip(positions.tolist(), tau.tolist()):
        assert n >= 0
        want = 1.0 + attn_scale * math.log1p((n + 1) // floor_scale)
        assert abs(t - want) <= 4 * EPS64 * abs(want)


@settings(max_examples=80, deadline=None)
@given(
    flags=st.one_of(
        st.none(),
        st.lists(st.sampled_from([0, 1]), min_size=0, max_size=6),
        st.lists(st.sampled_from([0, 1, 1, True, 2, -1, 0.0, 1.0, "1", None]), min_size=1, max_size=5),
        st.sampled_from(["1101", 1, (1, 0), torch.tensor([1, 0]), {0: 1}]),
    ),
    num_layers=st.sampled_from([0, 1, 3, 4, 6, -1, 2.0, True, "4", None]),
    interval=st.sampled_from([4, 4, 1, 2, 0, -4, 4.0, True, "4"]),
)
def test_nope_layer_helpers_are_right_or_a_named_error(flags, num_layers, interval):
    # num_layers an int >= 0; flags None or a list/tuple of num_layers ints, each 0 or 1; interval an int > 0
    layers_ok = is_int(num_layers) and num_layers >= 0
    flags_ok = flags is None or (
        isinstance(flags, (list, tuple)) and len(flags) == num_layers and all(is_int(v) and v in (0, 1) for v in flags)
    )
    got = expect(layers_ok and flags_ok, rope_layer_flags, flags, num_layers)
    if got is not None:
        want = [True] * num_layers if flags is None else [v == 1 for v in flags]
        assert got == want and len(got) == num_layers
    layers = expect(layers_ok and is_int(interval) and interval > 0, default_no_rope_layers, num_layers, interval)
    if layers is not None:
        assert layers == [0 if (i + 1) % interval == 0 else 1 for i in range(num_layers)]
        assert rope_layer_flags(layers, num_layers) == [v == 1 for v in layers]
