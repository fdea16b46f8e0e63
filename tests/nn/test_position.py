"""Non-RoPE position encodings: ALiBi slopes and bias, learned relative bias, learned and sinusoidal."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given

from helpers import NAMED, assert_named
from rotary.nn import ALiBi, LearnedPositionEmbedding, RelativePositionBias, SinusoidalPositionEmbedding, alibi_slopes
from strategies import FAST, odd_values


def test_alibi_slopes_power_of_two():
    # the paper: for 8 heads the slopes are 1/2, 1/4, ..., 1/256
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))


def test_alibi_slopes_other_counts():
    # 12 heads: the 8 slopes of n=8, then every other slope of n=16: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expected = [2.0**-i for i in range(1, 9)] + [2.0 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


def test_alibi_bias_values_and_fp32():
    alibi = ALiBi(2).to(torch.bfloat16)
    assert alibi.slopes.dtype == torch.float32
    bias = alibi(torch.tensor([[5, 6]]), torch.tensor([[3, 4, 5, 6]]))
    assert bias.shape == (1, 2, 2, 4) and bias.dtype == torch.float32
    # query at position 6, keys at 3..6; head 0 of 2 has slope 2^(-8/2) = 1/16
    torch.testing.assert_close(bias[0, 0, 1], -0.0625 * torch.tensor([3.0, 2.0, 1.0, 0.0]))


def test_relative_bias_is_a_function_of_distance_clipped():
    rel = RelativePositionBias(3, max_distance=2)
    torch.nn.init.normal_(rel.bias)
    pos = torch.arange(6)[None]
    bias = rel(pos, pos)
    for i in range(6):
        for j in range(6):
            d = max(-2, min(2, i - j))
            torch.testing.assert_close(bias[0, :, i, j], rel.bias[d + 2])


def test_learned_embedding_refuses_positions_beyond_table():
    emb = LearnedPositionEmbedding(8, 4)
    assert emb(torch.arange(8)[None]).shape == (1, 8, 4)
    with pytest.raises(ValueError, match="position 8 is beyond the learned table of max_position=8"):
        emb(torch.arange(9)[None])


def test_sinusoidal_matches_vaswani():
    emb = SinusoidalPositionEmbedding(6)(torch.tensor([[7]]))[0, 0]
    for i in range(3):
        angle = 7 / 10000 ** (2 * i / 6)
        assert math.isclose(float(emb[2 * i]), math.sin(angle), rel_tol=1e-6, abs_tol=1e-7)
        assert math.isclose(float(emb[2 * i + 1]), math.cos(angle), rel_tol=1e-6, abs_tol=1e-7)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: alibi_slopes(0), "num_heads must be a positive int, got 0"),
        (lambda: RelativePositionBias(2, max_distance=-1), "max_distance must be a positive int"),
        (lambda: SinusoidalPositionEmbedding(5), "hidden_size must be even"),
        (lambda: LearnedPositionEmbedding(0, 4), "max_position must be a positive int"),
        (
            lambda: ALiBi(2)(torch.arange(3), torch.arange(3)[None]),
            r"query_positions must be an integer tensor \[B, L\]",
        ),
        (lambda: ALiBi(2)(torch.arange(3)[None], torch.arange(6).view(2, 3)), "share the batch size"),
    ],
)
def test_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    "ids, exc, match",
    [
        (torch.tensor([[-1, 0]]), ValueError, "must be >= 0, got a minimum of -1"),  # was a bare IndexError
        (torch.tensor([[0.0, 1.0]]), TypeError, "integer dtype"),  # was a raw embedding RuntimeError
        (torch.tensor([[0, 1]], dtype=torch.int16), TypeError, "int64 or int32"),
    ],
)
def test_absolute_embeddings_name_bad_positions(ids, exc, match):

    for module in (LearnedPositionEmbedding(8, 4), SinusoidalPositionEmbedding(4)):
        with pytest.raises(exc, match=match):
            module(ids)


def test_absolute_embeddings_take_positions_without_reading_them_back(monkeypatch):
    from rotary import positions as P

    learned, sinusoidal = LearnedPositionEmbedding(8, 4), SinusoidalPositionEmbedding(4)
    expected = learned(torch.arange(3, 6)), sinusoidal(torch.arange(3, 6))
    positions = P.arange(3, offset=3)
    monkeypatch.setattr(torch.Tensor, "max", lambda *a, **k: pytest.fail("read back"))
    assert torch.equal(learned(positions), expected[0]) and torch.equal(sinusoidal(positions), expected[1])
    with pytest.raises(ValueError, match="position 8 is beyond the learned table of max_position=8"):
        learned(P.arange(2, offset=7))


@FAST
@given(num_heads=odd_values)
def test_alibi_slopes_are_a_geometric_sequence_or_a_named_error(num_heads):
    valid = isinstance(num_heads, int) and not isinstance(num_heads, bool) and 1 <= num_heads <= 2**16
    try:
        slopes = alibi_slopes(num_heads)
    except NAMED as exc:
        assert not valid, f"a valid num_heads was refused: {exc}"
        assert_named(exc, "num_heads")
        return
    assert valid, f"num_heads={num_heads!r} was accepted"
    assert slopes.shape == (num_heads,) and bool((slopes > 0).all()) and bool((slopes <= 1).all())
    # the paper's recipe (Press et al., ALiBi): for the largest power of two n <= num_heads, the geometric sequence
    # 2^(-8 (i + 1) / n); the heads beyond n take every other slope of 2 n heads' sequence, 2^(-8 (2 j + 1) / (2 n))
    n = 2 ** (num_heads.bit_length() - 1)
    want = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)] + [
        2.0 ** (-4.0 * (2 * j + 1) / n) for j in range(num_heads - n)
    ]
    torch.testing.assert_close(slopes, torch.tensor(want))
