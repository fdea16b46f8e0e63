import math

import numpy as np
import pytest
import torch

import rotary
from rotary.tables import RotaryTables, TableCache, cos_sin_table


def float64_truth(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of position * inv_freq evaluated in float64 by NumPy (independent of torch)."""
    theta = positions.numpy().astype(np.float64)[:, None] * inv_freq.numpy().astype(np.float64)[None, :]
    return np.cos(theta), np.sin(theta)


@pytest.mark.parametrize("position", [2**16, 2**20, 2**20 + 12345])
def test_precision_at_long_positions(position):
    rope = rotary.RoPE(128)
    pos = torch.arange(position - 64, position + 1)
    cos, sin = rope.cos_sin(pos)
    c64, s64 = float64_truth(pos, rope.inv_freq)
    half = rope.rotary_dim // 2
    err = max(np.abs(cos[:, :half].numpy() - c64).max(), np.abs(sin[:, :half].numpy() - s64).max())
    assert err < 1e-6
    # Hugging Face's fp32 angles are far off there (that is the point of float64 angles)
    hf_theta = pos[:, None].float() * rope.inv_freq[None, :]
    hf_err = np.abs(hf_theta.cos().numpy() - c64).max()
    assert hf_err > 100 * err


def test_cos2_plus_sin2_within_fp32_rounding():
    cos, sin = rotary.RoPE(128).cos_sin(torch.arange(4096))
    assert float((cos.double() ** 2 + sin.double() ** 2 - 1).abs().max()) < 1.2e-7


@pytest.mark.parametrize("interleaved", [False, True])
def test_layout_of_tables(interleaved):
    rope = rotary.RoPE(8, interleaved=interleaved)
    cos, _ = rope.cos_sin(torch.tensor([3]))
    theta = (3 * rope.inv_freq.double()).cos().float()
    expected = theta.repeat_interleave(2) if interleaved else torch.cat((theta, theta))
    assert torch.equal(cos[0], expected)


def test_tables_are_fp32_and_scaled_shapes():
    rope = rotary.RoPE(64, rotary_dim=32)
    cos, sin = rope.cos_sin(torch.arange(5))
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (5, 32)
    cos, sin = rope.cos_sin(torch.arange(10).view(2, 5))
    assert cos.shape == (2, 5, 32)


def test_cache_grows_and_matches_direct_computation():
    rope = rotary.RoPE(32, max_position=16)
    rope.cos_sin(torch.arange(4))
    assert rope._caches["original"].length == 16
    pos = torch.tensor([[0, 5, 15], [100, 3000, 7]])
    cos, sin = rope.cos_sin(pos)
    assert rope._caches["original"].length >= 3001
    direct = cos_sin_table(pos, rope.inv_freq)
    assert torch.equal(cos, direct[0]) and torch.equal(sin, direct[1])
    # offsets past the cache also grow it (no error, no stale slice)
    q = torch.randn(1, 1, 4, 32)
    out = rope.rotate(q, offset=10_000)
    ref = rope.rotate(q, position_ids=torch.arange(10_000, 10_004))
    assert torch.equal(out, ref)


def test_cache_rebuild_gives_identical_values():
    small, big = (
        TableCache(rotary.frequencies(16).inv_freq, 1.0, False, 4),
        TableCache(rotary.frequencies(16).inv_freq, 1.0, False, 1024),
    )
    a = small.get(torch.device("cpu"), 700)[0][:700]
    b = big.get(torch.device("cpu"), 700)[0][:700]
    assert torch.equal(a, b)


def test_attention_scaling_multiplies_tables():
    inv = torch.tensor([1.0, 0.1])
    cos, sin = cos_sin_table(torch.arange(3), inv, attention_scaling=2.0)
    c1, s1 = cos_sin_table(torch.arange(3), inv)
    assert torch.allclose(cos, 2 * c1) and torch.allclose(sin, 2 * s1)
    assert float(cos[0, 0]) == 2.0 and math.isclose(float(sin[1, 0]), 2 * math.sin(1.0), rel_tol=1e-7)


def test_failed_growth_leaves_a_working_cache(monkeypatch):
    import rotary.tables as tables

    cache = TableCache(rotary.frequencies(16).inv_freq, 1.0, False, 8)
    small = cache.get(torch.device("cpu"), 8)[0].clone()
    real = tables.cos_sin_table

    def out_of_memory(positions, *args, **kwargs):
        if positions.numel() > 8:
            raise RuntimeError("can't allocate")
        return real(positions, *args, **kwargs)

    monkeypatch.setattr(tables, "cos_sin_table", out_of_memory)
    with pytest.raises(RuntimeError, match="allocate"):
        cache.get(torch.device("cpu"), 2**15)
    assert cache.length == 8 and torch.equal(cache.get(torch.device("cpu"), 8)[0], small)
    monkeypatch.setattr(tables, "cos_sin_table", real)
    grown = cache.get(torch.device("cpu"), 100)[0]
    assert cache.length >= 100 and torch.equal(grown[:8], small)
    assert torch.equal(grown[:100], real(torch.arange(100), cache.inv_freq)[0])


def test_a_growth_past_the_memory_budget_computes_rows_per_call(monkeypatch):
    """The cache never builds more than MAX_TABLE_BYTES of cos and sin; a call past it gets its own rows."""
    import rotary.tables as tables

    cache = TableCache(rotary.frequencies(16).inv_freq, 1.0, False, 8, limit=1 << 20)
    monkeypatch.setattr(tables, "MAX_TABLE_BYTES", 2 * 64 * 16 * 4)  # cos and sin of 64 fp32 rows of 16 channels
    assert cache.get(torch.device("cpu"), 64)[0].shape == (64, 16)
    assert cache.get(torch.device("cpu"), 65) is None and cache.length == 64
    wide = TableCache(rotary.frequencies(16).inv_freq, 1.0, False, 8, limit=1 << 20)
    assert wide.get(torch.device("cpu"), 32, torch.float64)[0].shape == (32, 16)
    assert wide.get(torch.device("cpu"), 33, torch.float64) is None  # float64 rows take twice the bytes
    rope = rotary.RoPE(16, max_position=8)
    positions = torch.arange(100, 200)
    cos, sin = rope.cos_sin(positions)  # past the budget: computed for these positions, not cached
    assert rope._caches["original"].length < 100
    want = cos_sin_table(positions, rope.inv_freq)
    assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])


@pytest.mark.parametrize("rows, match", [([-1, 0], "got rows from -1 to 0"), ([0, 8], "got rows from 0 to 8")])
def test_rows_outside_the_table_are_refused_on_every_backend(rows, match):
    """Indexing wraps -1 to the last row on the pure-torch path while the fused kernel refuses it:
    the tables value refuses it before any backend sees it."""
    from rotary.tables import RotaryTables

    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(8))
    with pytest.raises(ValueError, match=match):
        RotaryTables(cos, sin, False, rows=torch.tensor(rows))
    inside = RotaryTables(cos, sin, False, rows=torch.tensor([7, 0]))
    assert torch.equal(inside.gather()[0], cos[[7, 0]])


def test_rows_edited_in_place_after_the_tables_were_made_are_checked_again():
    """The rows are checked when the tables are made and again after an in-place edit (their ``_version``): a
    planned call, the general path, in place, with autograd, ``gather`` and ``rotate_and_cache`` all name them."""
    from rotary.tables import RotaryTables

    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(10))
    tables = RotaryTables(cos, sin, False, rows=torch.tensor([0, 1, 2, 3]))
    q = torch.randn(1, 2, 4, 8)
    before = rotary.rotate([q], tables)[0]  # records a plan of this signature
    kv, cache = torch.randn(1, 4, 1, 8), torch.zeros(1, 16, 1, 8)  # [B, S, H, D], [B, slots, H, D]
    calls = [
        lambda: rotary.rotate([q], tables),
        lambda: rotary.rotate([q.clone().requires_grad_()], tables),
        lambda: rotary.rotate([q.clone()], tables, inplace=True),
        lambda: tables.gather(),
        lambda: rotary.rotate_and_cache(q.transpose(1, 2), kv, kv, cache, cache.clone(), torch.arange(4)[None], tables),
    ]
    for value, match in ((50, "got rows from 0 to 50"), (-1, "got rows from -1 to 3")):
        tables.rows[2] = value
        for call in calls:
            with pytest.raises(rotary.InputError, match=match):
                call()
    tables.rows[2] = 2  # edited back: taken again
    assert torch.equal(rotary.rotate([q], tables)[0], before)


def test_hand_made_tables_are_value_checked():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    RotaryTables(cos, sin, False)  # genuine tables pass
    with pytest.raises(ValueError):
        RotaryTables(cos * 2, sin, False)  # cos²+sin² = 4 cos² + sin², not 1
    with pytest.raises(ValueError):
        RotaryTables(torch.full_like(cos, float("nan")), sin, False)
    with pytest.raises(ValueError):  # laid out for the half pairing, claimed interleaved
        RotaryTables(cos, sin, True)


def test_unchecked_tables_still_check_structure():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    assert RotaryTables.unchecked(cos * 2, sin, False).cos is not None  # values are the producer's word
    with pytest.raises((TypeError, ValueError)):
        RotaryTables.unchecked(cos, sin[:, :4], False)  # shapes are still checked
    with pytest.raises((TypeError, ValueError)):
        RotaryTables.unchecked(cos, sin, False, rows=torch.tensor([0, 9]))  # rows past the table


def test_check_samples_the_rows_tokens_read():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(100))
    cos = cos.clone()
    cos[97] = 3.0  # a broken row that only token 0 reads
    tables = RotaryTables.unchecked(cos, sin, False, rows=torch.tensor([97, 1, 2]))
    with pytest.raises(ValueError):
        tables.check(sample=2)
    RotaryTables.unchecked(cos, sin, False, rows=torch.tensor([1, 2, 3])).check(sample=2)


@pytest.mark.parametrize(
    "kwargs, match", [({"rtol": 0}, "rtol"), ({"rtol": float("nan")}, "rtol"), ({"sample": 0}, "sample")]
)
def test_check_arguments_are_checked(kwargs, match):
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    with pytest.raises(ValueError, match=match):
        RotaryTables(cos, sin, False).check(**kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_from_tensors_takes_half_precision_tables(dtype):
    cos, sin = rotary.RoPE(64).cos_sin(torch.arange(4096))
    tables = RotaryTables.from_tensors(cos.to(dtype), sin.to(dtype), interleaved=False, validate="full")
    assert tables.cos.dtype == torch.float32
    with pytest.raises(ValueError):  # still not any tensor: 1.1 x a bf16 table is no rotation
        RotaryTables.from_tensors((cos * 1.1).to(dtype), sin.to(dtype), interleaved=False, validate="full")


def test_from_tensors_refuses_fp8_tables():
    cos, sin = rotary.RoPE(8).cos_sin(torch.arange(4))
    with pytest.raises(TypeError, match="float8"):
        RotaryTables.from_tensors(cos.to(torch.float8_e4m3fn), sin.to(torch.float8_e4m3fn), interleaved=False)
