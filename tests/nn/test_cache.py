"""KVCache (rotary.nn): the entries it accepts and refuses, and caches that do not fit the layer."""

import pytest
import torch

from rotary.nn import KVCache, RotaryAttention


def test_a_cache_from_another_layer_shape_is_named():
    cache = KVCache()
    RotaryAttention(32, 4)(torch.randn(1, 3, 32), cache=cache)  # head_dim 8
    other = RotaryAttention(32, 2)  # head_dim 16
    cache.owner = None  # even handed over on purpose, the shapes must agree
    with pytest.raises(ValueError, match="do not match the cache"):
        other(torch.randn(1, 1, 32), cache=cache)


@pytest.mark.parametrize(
    "cache, new, match",
    [
        # filled by hand with values of another length than the keys
        (dict(keys=torch.zeros(1, 1, 2, 4), values=torch.zeros(1, 1, 3, 4), positions=torch.zeros(1, 2, dtype=torch.long)),
         None, "KVCache is inconsistent: cached values"),
        (dict(keys=torch.zeros(1, 1, 2, 4), values=torch.zeros(1, 1, 2, 4), positions=torch.zeros(1, 2, dtype=torch.int16)),
         None, "KVCache is inconsistent: cached positions must be an int64 tensor"),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 4), torch.arange(2)), "new values .* must match new keys"),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4, dtype=torch.float64), torch.arange(2)), "share dtype and device"),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.arange(3)), "S=3 positions but the input has S=2"),
        ({}, (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.arange(2)), r"new keys must be a floating \[B, Hk, T, D\]"),
    ],
)
def test_kv_cache_entries_must_describe_the_same_tokens(cache, new, match):
    """Were silently concatenated (a wrong attention later) or failed inside torch.cat."""
    k = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=match):
        KVCache(**cache).update(*(new or (k, k, torch.arange(2, 4))))
