"""RotaryAttention and repeat_kv (nn/attention.py): inputs checked and named before torch sees them, and
arbitrary arguments that give the right shape or a named error."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rotary
from helpers import NAMED, assert_named, small_lm
from rotary.nn import KVCache, RotaryAttention, RotaryLinearAttention, repeat_kv
from strategies import FAST, odd_values, positions_strategy
from variant_checks import is_int, valid_ids


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: KVCache().next_positions(3), ValueError, "KVCache is empty"),
        (
            lambda: KVCache(keys=torch.zeros(1, 1, 1, 4)).update(
                torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, dtype=torch.long)
            ),
            ValueError,
            "keys / values / positions but not all",
        ),
        (
            lambda: RotaryAttention(16, 2)(torch.randn(1, 3, 16), cache=[KVCache()]),
            TypeError,
            "cache must be a rotary.nn.KVCache or StaticKVCache, got list",
        ),
        (lambda: small_lm().generate(torch.zeros(1, 0, dtype=torch.long), 3), ValueError, "at least one token"),
        (
            lambda: rotary.RoPE(16).cos_sin(torch.arange(4, dtype=torch.int16)),
            TypeError,
            "int64 or int32, got torch.int16",
        ),
        (lambda: rotary.to_half(torch.tensor(1.0)), ValueError, "with a channel axis"),
        (lambda: rotary.permute_qk_weight(torch.randn(8, 4), 0), ValueError, "head_dim must be a positive int, got 0"),
    ],
)
def test_internal_exceptions_became_named_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_repeat_kv_is_public_and_checked():
    from rotary.nn import repeat_kv

    x = torch.arange(2.0).reshape(1, 2, 1, 1)
    assert repeat_kv(x, 3).flatten().tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # head h is KV head h // groups
    with pytest.raises(ValueError, match="groups must be a positive int, got 0"):
        repeat_kv(x, 0)
    with pytest.raises(ValueError, match=r"x must be a \[B, Hk, T, D\] tensor"):
        repeat_kv(x[0], 2)
    with pytest.raises(ValueError, match="groups=100000 would give 200000 heads"):
        repeat_kv(x, 100_000)


@pytest.mark.parametrize("layer", [RotaryAttention, RotaryLinearAttention])
@pytest.mark.parametrize(
    "x, match",
    [
        (
            torch.randn(1, 3, 16, dtype=torch.bfloat16),
            "hidden_states is torch.bfloat16 but this layer's weights are torch.float32",
        ),
        (
            torch.randn(1, 3, 16, dtype=torch.float64),
            "hidden_states is torch.float64 but this layer's weights are torch.float32",
        ),
        (torch.randint(5, (1, 3, 16)), "hidden_states must be a floating-point tensor, got torch.int64"),
    ],
)
def test_attention_input_dtype_is_named(layer, x, match):
    """Were 'mat1 and mat2 must have the same dtype' from inside F.linear."""
    with pytest.raises(TypeError, match=match):
        layer(16, 2)(x)


def test_attention_under_autocast_takes_mixed_dtypes(gen):
    x = torch.randn(1, 3, 16, generator=gen).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert RotaryAttention(16, 2)(x).shape == (1, 3, 16)


#: layers (hidden, heads, kv_heads, causal) that are valid, half of the draws, so that their calls reach the masks and
#: positions; the other half any combination (hidden 6 and 12 give odd head widths, 3; hidden 6 and 8 the smallest
#: even one, 2)
LAYERS = st.one_of(
    st.sampled_from(
        [(8, 1, None, True), (16, 2, 1, False), (16, 4, 2, True), (12, 2, None, False), (6, 3, None, True)]
    ),
    st.tuples(
        st.sampled_from([8, 16, 12, 6]),
        st.sampled_from([1, 2, 3, 4, 0]),
        st.sampled_from([None, 1, 2, 5]),
        st.sampled_from([True, False, "true"]),
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    layer=LAYERS,
    seq=st.integers(0, 6),
    mask=st.sampled_from(["none", "ones", "float", "twos", "short", "left", "bool"]),
    positions=positions_strategy(),
)
@example(layer=(6, 3, None, True), seq=3, mask="left", positions=None)  # valid: head_dim 2
@example(layer=(6, 2, None, False), seq=3, mask="none", positions=None)  # invalid: head_dim 3
@example(layer=(8, 1, None, False), seq=3, mask="bool", positions=None)  # valid: a bool mask
def test_attention_is_right_shaped_or_a_named_error(layer, seq, mask, positions):
    hidden, heads, kv, causal = layer
    # valid (RotaryAttention's documented arguments): heads an int > 0 dividing hidden into an even head_dim (RoPE
    # rotates pairs of channels), num_kv_heads None or dividing heads, causal a bool
    valid = heads > 0 and hidden % heads == 0 and (hidden // heads) % 2 == 0 and (kv is None or heads % kv == 0)
    valid = valid and isinstance(causal, bool)
    try:
        attn = rotary.nn.RotaryAttention(hidden, heads, num_kv_heads=kv, causal=causal)
    except NAMED as exc:
        assert not valid, f"valid arguments were refused: {exc}"
        assert str(exc)
        return
    assert valid, "invalid arguments were accepted"
    x = torch.randn(2, seq, hidden)
    masks = {
        "none": None,
        "ones": torch.ones(2, seq, dtype=torch.long),
        "float": torch.zeros(2, seq),
        "twos": torch.full((2, seq), 2),
        "short": torch.ones(2, max(seq - 1, 0), dtype=torch.long),
        "left": torch.cat((torch.zeros(2, 1, dtype=torch.long), torch.ones(2, max(seq - 1, 0), dtype=torch.long)), 1)[
            :, :seq
        ],
        "bool": torch.arange(seq).expand(2, seq) >= torch.tensor([[0], [1]]),  # left padding as a bool mask
    }
    # the mask: None or a bool / integer [B, S] of 0 and 1; the positions: None or an int64/int32 tensor
    # [S] / [1 or B, S], >= 0 (a list or float positions are not positions)
    m = masks[mask]
    valid = m is None or (not m.is_floating_point() and m.shape == (2, seq) and bool(((m == 0) | (m == 1)).all()))
    if positions is not None:
        valid = valid and valid_ids(positions) and positions.shape[-1] == seq
        valid = valid and (positions.dim() == 1 or positions.shape[0] in (1, 2))
    try:
        out = attn(x, attention_mask=m, position_ids=positions)
    except NAMED as exc:
        assert not valid, f"a valid call was refused: {exc}"
        assert str(exc)
        return
    assert valid, "an invalid call was accepted"
    assert out.shape == x.shape and torch.isfinite(out).all()


dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool])


@FAST
@given(
    # [B, Hk, T, D] and a count of groups half of the time (else any rank, any value), so valid calls are drawn
    shape=st.one_of(
        st.lists(st.integers(0, 4), min_size=4, max_size=4), st.lists(st.integers(0, 4), min_size=1, max_size=5)
    ),
    groups=st.one_of(st.integers(1, 4), odd_values),
    dtype=dtypes,
)
def test_repeat_kv_equals_repeat_interleave_or_names_the_argument(shape, groups, dtype):
    x = torch.zeros(shape, dtype=dtype) if dtype != torch.bool else torch.zeros(shape, dtype=torch.bool)
    # valid: x [B, Hk, T, D], groups a positive int giving at most MAX_NUM_HEADS (2**16) heads
    valid = x.dim() == 4 and is_int(groups) and groups >= 1 and groups * x.shape[1] <= 2**16
    try:
        out = repeat_kv(x, groups)
    except NAMED as exc:
        assert not valid, f"a valid call was refused: {exc}"
        assert_named(exc, "groups", "x must be")
        return
    assert valid, "an invalid call was accepted"
    assert torch.equal(out, x.repeat_interleave(groups, dim=1))


@FAST
@given(
    batch=st.integers(0, 2),
    seq_len=st.integers(0, 5),
    width=st.sampled_from([16, 16, 8, 32]),
    dtype=dtypes,
    rank=st.sampled_from([3, 3, 3, 2, 4]),
)
def test_rotary_attention_runs_or_names_hidden_states(batch, seq_len, width, dtype, rank):
    attn = RotaryAttention(16, 2, causal=True)
    shape = [batch, seq_len, width][:rank] + [2] * max(0, rank - 3)
    x = torch.ones(shape, dtype=dtype)
    valid = rank == 3 and width == 16 and dtype == torch.float32  # [B, S, E] in the layer's dtype
    try:
        out = attn(x)
    except NAMED as exc:
        assert not valid, f"valid hidden states were refused: {exc}"
        assert_named(exc, "hidden_states")
        return
    assert valid, "invalid hidden states were accepted"
    assert out.shape == x.shape and bool(torch.isfinite(out).all())
