"""The no-synchronisation rule, on this CPU machine: every hot path, run as on an accelerator
(``helpers.accelerator_rules``), reads no tensor value on the host and gives the results of the CPU
path bit for bit; bad input that only device values show is named on the CPU and is the caller's
contract on an accelerator (nothing read, nothing to poll).

On a GPU the same rule is checked for real (``torch.cuda.set_sync_debug_mode("error")`` and CUDA-graph
capture) in ``tests/test_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch

import rotary
from helpers import HostReadError, accelerator_rules

B, S, HQ, HK, D = 2, 6, 4, 2, 16
ROPE = rotary.RoPE(D)
ROPE_I = rotary.RoPE(D, interleaved=True, rotary_dim=12)


def _qk(layout="bhsd", seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h: (B, h, S, D)) if layout == "bhsd" else (lambda h: (B, S, h, D))
    return torch.randn(shape(HQ), generator=g), torch.randn(shape(HK), generator=g)


IDS = torch.tensor([[3, 0, 7, 1, 1, 11], [5, 6, 7, 8, 9, 10]])
TABLE = ROPE.cos_sin(torch.arange(16))
TABLE_I = ROPE_I.cos_sin(torch.arange(16))


def _static_write(q, k, ids=IDS, max_len=S + 2, rope=ROPE_I):
    """A StaticKVCache taking unrotated q and k (the attention layer's one rotate_and_cache call): the
    rotated q and the cache's keys, values and positions."""
    cache = rotary.nn.StaticKVCache(B, HK, max_len, D)
    q_rot, entries = cache.rotate_and_update(q, k, k * 2, rope.tables(ids), ids)
    return q_rot, entries.keys, entries.values, entries.positions


def _calls():
    """name -> a call of a hot path (fresh inputs each time), returning tensors."""
    q, k = _qk()
    qs, ks = _qk("bshd")
    cos, sin = ROPE.cos_sin(torch.arange(S))
    packed = torch.randn(9, HQ, D, generator=torch.Generator().manual_seed(3))
    cu = torch.tensor([0, 4, 9])
    qkv = torch.randn(B, S, 3, HK, D, generator=torch.Generator().manual_seed(4))
    gqa = torch.randn(B, S, HQ + 2 * HK, D, generator=torch.Generator().manual_seed(5))
    return {
        "rope(q, k)": lambda: ROPE(q, k),
        "rope(q, k, offset)": lambda: ROPE(q, k, offset=100),
        "rope(q, k, position_ids)": lambda: ROPE_I(q, k, position_ids=IDS),
        "rope(q, k, inplace)": lambda: ROPE(q.clone(), k.clone(), inplace=True),
        "rope bshd views of qkv": lambda: ROPE(qkv.clone()[:, :, 0], qkv.clone()[:, :, 1], layout="bshd"),
        "rope.rotate": lambda: (ROPE.rotate(q, offset=3),),
        "rope packed cu_seqlens": lambda: ROPE(packed, packed, cu_seqlens=cu, max_seqlen=5),
        "rope packed cu_seqlens without max_seqlen": lambda: ROPE(packed, packed, cu_seqlens=cu),
        "rope flat [T, H * D] position_ids": lambda: ROPE(
            packed.flatten(1), packed.flatten(1), position_ids=torch.arange(9)
        ),
        "rope.tables(ids)": lambda: ROPE.tables(IDS).gather(),
        "rope.cos_sin(ids)": lambda: ROPE.cos_sin(IDS),
        "rotate(tables)": lambda: rotary.rotate([q, k], ROPE.tables(rotary.positions.arange(S)), kinds=("q", "k")),
        "apply_rotary": lambda: (rotary.apply_rotary(q, cos, sin),),
        "apply_rotary validate=False": lambda: (rotary.apply_rotary(q, cos, sin, validate=False),),
        "apply_rotary position_ids": lambda: (rotary.apply_rotary(q, *TABLE_I, interleaved=True, position_ids=IDS),),
        "apply_rotary seqlen_offsets": lambda: (
            rotary.apply_rotary(qs, *TABLE, layout="bshd", seqlen_offsets=torch.tensor([2, 5])),
        ),
        "apply_rotary seqlen_offsets int": lambda: (rotary.apply_rotary(qs, *TABLE, layout="bshd", seqlen_offsets=3),),
        "apply_rotary cu_seqlens": lambda: (rotary.apply_rotary(packed, *TABLE, cu_seqlens=cu, max_seqlen=5),),
        "apply_rotary_": lambda: (rotary.apply_rotary_(q.clone(), cos, sin),),
        "apply_rotary_qkv_": lambda: (rotary.apply_rotary_qkv_(qkv.clone(), cos, sin),),
        "apply_rotary_qkv_ GQA offsets": lambda: (
            rotary.apply_rotary_qkv_(gqa.clone(), *TABLE, num_heads_q=HQ, seqlen_offsets=torch.tensor([1, 2])),
        ),
        "apply_rotary_kv_": lambda: (rotary.apply_rotary_kv_(qkv.clone()[:, :, 1:], cos, sin),),
        "StaticKVCache.rotate_and_update": lambda: _static_write(q, k),
    }


CALLS = list(_calls())


@pytest.mark.parametrize("name", CALLS)
def test_hot_path_reads_nothing_on_an_accelerator_and_gives_the_cpu_result(name):
    want = _calls()[name]()
    with accelerator_rules():
        got = _calls()[name]()
        got = _calls()[name]()  # a second call: cached tables
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_rule_catches_a_host_read():
    with accelerator_rules(), pytest.raises(HostReadError):
        int(torch.arange(3).max())


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda q, k: _static_write(q, k, max_len=S - 1), "do not fit"),
        (lambda q, k: (rotary.apply_rotary(q, TABLE[0][:S] * 2, TABLE[1][:S]),), "not constant"),
        (
            lambda q, k: (rotary.apply_rotary(q, *TABLE, interleaved=True, position_ids=torch.arange(S)),),
            "laid out for the half",
        ),
        (
            lambda q, k: (rotary.apply_rotary(q, TABLE[1], TABLE[0], position_ids=torch.arange(S)),),
            "cos and sin swapped",
        ),
        (
            lambda q, k: (
                rotary.apply_rotary(q[0].transpose(0, 1).contiguous(), *TABLE, cu_seqlens=torch.tensor([0, 7, 6])),
            ),
            "cu_seqlens must start at 0",
        ),
    ],
)
def test_bad_device_values_are_named_on_the_cpu_and_the_caller_s_contract_on_an_accelerator(call, named, monkeypatch):
    """What only device values show is read on the CPU (free) and raised by name; on an accelerator nothing
    is read (a read would synchronise) and nothing is raised or left to poll: the documented contract."""
    monkeypatch.setattr(rotary.kernels.ops, "load_cpu_extension", lambda: None)  # the checking pure-torch path
    q, k = _qk()
    with pytest.raises(rotary.InputError, match=named):
        call(q, k)
    with accelerator_rules():
        call(q, k)


@pytest.mark.parametrize("kernel", ["cpu", "torch"])
def test_positions_past_the_cache_are_computed_and_nothing_is_flagged(kernel, monkeypatch):
    if kernel == "torch":
        monkeypatch.setattr(rotary.kernels.ops, "load_cpu_extension", lambda: None)
    q, k = _qk()
    ids = torch.tensor([0, 1, 2, 3, -1, 10**6])  # -1 and 10**6: no row of the cache
    want = ROPE(q, k, position_ids=ids)  # the CPU reads the ids: the tables are computed for them
    with accelerator_rules():
        got = ROPE(q, k, position_ids=ids)
        static = _static_write(q, k, torch.tensor([0, 1, 2, 3, 4, 10**6]), rope=ROPE)[:2]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert not any(torch.isnan(o).any() for o in (*got, *static))


def test_a_position_outside_a_table_you_made_is_nan_for_that_token_only(monkeypatch):
    monkeypatch.setattr(rotary.kernels.ops, "load_cpu_extension", lambda: None)
    q, _ = _qk()
    ids = torch.tensor([0, 1, 2, 3, 4, 16])  # TABLE has 16 rows
    want = rotary.apply_rotary(q, *TABLE, position_ids=torch.tensor([0, 1, 2, 3, 4, 5]))
    with accelerator_rules():
        got = rotary.apply_rotary(q, *TABLE, position_ids=ids)
    assert torch.equal(got[:, :, :5], want[:, :, :5])
    assert torch.isnan(got[:, :, 5]).all()  # never another row's rotation, never a read past the table
    with pytest.raises(rotary.InputError, match="reach position 16 but the cos/sin tables have only 16 rows"):
        rotary.apply_rotary(q, *TABLE, position_ids=ids)  # on the CPU, at once


def test_validate_sync_checks_on_the_host_at_once():
    q, _ = _qk()
    cos, sin = ROPE.cos_sin(torch.arange(S))
    with pytest.raises(ValueError, match="not constant"):
        rotary.apply_rotary(q, cos * torch.linspace(1, 2, S)[:, None], sin, validate="sync")
    with accelerator_rules(), pytest.raises(HostReadError):
        rotary.apply_rotary(q, cos, sin, validate="sync")  # what "sync" means on a GPU: it reads


def test_swapped_cos_and_sin_are_named_on_the_cpu_when_the_table_has_position_0():
    q, _ = _qk()
    cos, sin = TABLE
    with pytest.raises(ValueError, match="cos and sin swapped"):
        rotary.apply_rotary(q, sin, cos, position_ids=torch.arange(S))
    with pytest.raises(ValueError, match="cos and sin swapped"):
        rotary.apply_rotary(q, sin, cos, seqlen_offsets=0)
