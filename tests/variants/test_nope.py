"""NoPE layers and Llama 4's NoPE query temperature (variants/nope.py): the helpers and the temperature
tables are right or a named error for arbitrary arguments."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.variants import default_no_rope_layers, nope_temperature, rope_layer_flags
from variant_checks import EPS64, call


@settings(max_examples=40, deadline=None)
@given(
    head_dim=st.sampled_from([8, 8, 6, 0, 7, "8"]),
    floor_scale=st.sampled_from([8192, 4, 0, 4.0]),
    positions=st.one_of(
        st.lists(st.integers(0, 2**40), min_size=0, max_size=4).map(torch.tensor),
        st.lists(st.integers(-3, 20), min_size=1, max_size=4).map(torch.tensor),
        st.just(torch.tensor([1.0, 2.0])),
        st.just(torch.arange(6).reshape(2, 3)),
        st.just(torch.zeros(2, 2, 2, dtype=torch.int64)),
    ),
)
def test_nope_temperature_tables_are_right_or_a_named_error(head_dim, floor_scale, positions):
    module, err = call(rotary.variants.NoPETemperature, head_dim, floor_scale=floor_scale)
    if err is not None:
        return
    tables, err = call(module.tables, positions)
    if err is not None:
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
    tau, err = call(nope_temperature, positions, floor_scale=floor_scale, attn_scale=attn_scale)
    if err is not None:
        return
    assert isinstance(positions, torch.Tensor) and not positions.is_floating_point() and positions.dtype != torch.bool
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
    got, err = call(rope_layer_flags, flags, num_layers)
    if err is None:
        assert isinstance(num_layers, int) and not isinstance(num_layers, bool) and num_layers >= 0
        want = [True] * num_layers if flags is None else [int(v) == 1 for v in flags]
        assert got == want and len(got) == num_layers
        if flags is not None:
            assert all(type(v) is int and v in (0, 1) for v in flags), f"flags {flags!r} accepted"
    layers, err = call(default_no_rope_layers, num_layers, interval)
    if err is None:
        assert layers == [0 if (i + 1) % interval == 0 else 1 for i in range(num_layers)]
        assert rope_layer_flags(layers, num_layers) == [v == 1 for v in layers]
