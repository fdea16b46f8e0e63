"""RotaryAttention and repeat_kv (nn/attention.py): inputs checked and named before torch sees them, and
arbitrary arguments that give the right shape or a named error."""

import pytest
import torch

import rotary
from helpers import small_lm
from rotary.nn import KVCache, RotaryAttention, RotaryLinearAttention


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: KVCache().next_positions(3), ValueError, "KVCache is empty"),
        (lambda: KVCache(keys=torch.zeros(1, 1, 1, 4)).update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, dtype=torch.long)), ValueError, "keys / values / positions but not all"),
        (lambda: RotaryAttention(16, 2)(torch.randn(1, 3, 16), cache=[KVCache()]), TypeError, "cache must be a rotary.nn.KVCache or StaticKVCache, got list"),
        (lambda: small_lm().generate(torch.zeros(1, 0, dtype=torch.long), 3), ValueError, "at least one token"),
        (lambda: rotary.RoPE(16).cos_sin(torch.arange(4, dtype=torch.int16)), TypeError, "int64 or int32, got torch.int16"),
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
        (torch.randn(1, 3, 16, dtype=torch.bfloat16), "hidden_states is torch.bfloat16 but this layer's weights are torch.float32"),
        (torch.randn(1, 3, 16, dtype=torch.float64), "hidden_states is torch.float64 but this layer's weights are torch.float32"),
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
