"""KVCache (rotary.nn): the entries it accepts and refuses, and caches that do not fit the layer."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import NAMED, assert_named
from rotary.nn import KVCache, RotaryAttention
from strategies import FAST


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
        (
            dict(
                keys=torch.zeros(1, 1, 2, 4),
                values=torch.zeros(1, 1, 3, 4),
                positions=torch.zeros(1, 2, dtype=torch.long),
            ),
            None,
            "KVCache is inconsistent: cached values",
        ),
        (
            dict(
                keys=torch.zeros(1, 1, 2, 4),
                values=torch.zeros(1, 1, 2, 4),
                positions=torch.zeros(1, 2, dtype=torch.int16),
            ),
            None,
            "KVCache is inconsistent: cached positions must be an int64 tensor",
        ),
        ({}, (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 4), torch.arange(2)), "new values .* must match new keys"),
        (
            {},
            (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4, dtype=torch.float64), torch.arange(2)),
            "share dtype and device",
        ),
        (
            {},
            (torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.arange(3)),
            "S=3 positions but the input has S=2",
        ),
        (
            {},
            (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.arange(2)),
            r"new keys must be a floating \[B, Hk, T, D\]",
        ),
    ],
)
def test_kv_cache_entries_must_describe_the_same_tokens(cache, new, match):
    """Were silently concatenated (a wrong attention later) or failed inside torch.cat."""
    k = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=match):
        KVCache(**cache).update(*(new or (k, k, torch.arange(2, 4))))


@FAST
@given(
    new_len=st.integers(0, 3),
    values_len=st.integers(0, 3),
    heads=st.sampled_from([1, 2]),
    value_dtype=st.sampled_from([torch.float32, torch.float32, torch.float64, torch.int64]),
    positions=st.sampled_from(["match", "short", "float", "2d", "negative"]),
)
def test_kv_cache_update_appends_or_names_the_mismatch(new_len, values_len, heads, value_dtype, positions):
    cache = KVCache()
    first = torch.randn(1, 2, 2, 4)
    cache.update(first, first, torch.arange(2))
    keys = torch.randn(1, heads, new_len, 4)
    values = torch.ones(1, heads, values_len, 4, dtype=value_dtype)
    ids = {
        "match": torch.arange(2, 2 + new_len),
        "short": torch.arange(2, 2 + new_len + 1),
        "float": torch.arange(2, 2 + new_len).float(),
        "2d": torch.arange(2, 2 + new_len)[None],
        "negative": torch.arange(-new_len, 0),
    }[positions]
    # valid: keys and values of the cache's heads and dtype and one length, positions [S] / [1, S] of that
    # length (int64, >= 0: the negative ones are valid only when there are none)
    valid = heads == 2 and values_len == new_len and value_dtype == torch.float32
    valid = valid and (positions in ("match", "2d") or (positions == "negative" and new_len == 0))
    try:
        k, v, p = cache.update(keys, values, ids)
    except NAMED as exc:
        assert not valid, f"a valid update was refused: {exc}"
        assert_named(exc, "keys", "values", "positions", "position_ids", "KVCache")
        return
    assert valid, "an invalid update was accepted"
    assert torch.equal(k, torch.cat((first, keys), dim=2)) and torch.equal(v, torch.cat((first, values), dim=2))
    assert p.tolist() == [[0, 1] + list(range(2, 2 + new_len))]
