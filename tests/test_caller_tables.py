"""Tables a caller makes: any angles are accepted, a swapped (sin, cos) pair is named where it shows.

flash-attn's tests build cos/sin from random angles and index them by position; ``apply_rotary`` must
rotate by exactly those tables. A swapped pair has an exact signature at position 0 (every pair's cos
0 and sin the scaling), which is looked for wherever the tables hold position 0, and only there.
"""

from __future__ import annotations

import pytest
import torch

import rotary
from helpers import accelerator_rules
from rotary.tables import expand_pairs


def random_tables(rows: int, r: int, interleaved: bool, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """flash-attn's test pattern: cos/sin of random angles, ``[rows, r]`` laid out for the pairing (float64)."""
    angles = torch.rand(rows, r // 2, generator=g, dtype=torch.float64) * 2 * torch.pi
    return expand_pairs(angles.cos(), interleaved), expand_pairs(angles.sin(), interleaved)


def rotate_by(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x ``[..., r]`` rotated by per-token float64 tables ``[..., r]`` broadcasting against it."""
    x = x.double()
    if interleaved:
        turned = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        a, b = x.chunk(2, dim=-1)
        turned = torch.cat((-b, a), dim=-1)
    return x * cos + turned * sin


@pytest.mark.parametrize("interleaved", [False, True])
def test_tables_of_random_angles_indexed_by_position_ids_rotate_by_those_tables(interleaved):
    g = torch.Generator().manual_seed(0)
    cos, sin = random_tables(32, 16, interleaved, g)
    x = torch.randn(2, 3, 5, 16, generator=g)  # [B, H, S, D]
    ids = torch.randint(0, 32, (2, 5), generator=g)
    got = rotary.apply_rotary(x, cos.float(), sin.float(), position_ids=ids, interleaved=interleaved)
    want = rotate_by(x, cos.float().double()[ids][:, None], sin.float().double()[ids][:, None], interleaved)
    assert torch.allclose(got.double(), want, atol=1e-6, rtol=0)
    # float64 tables with float64 x: the float64 rotation
    got64 = rotary.apply_rotary(x.double(), cos, sin, position_ids=ids, interleaved=interleaved)
    assert torch.allclose(got64, rotate_by(x, cos[ids][:, None], sin[ids][:, None], interleaved), atol=1e-12, rtol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_tables_of_random_angles_with_cu_seqlens_rotate_by_those_tables(interleaved):
    g = torch.Generator().manual_seed(1)
    cos, sin = random_tables(8, 16, interleaved, g)
    x = torch.randn(7, 2, 16, generator=g, dtype=torch.float64)  # packed [T, H, D]: sequences of 3 and 4
    cu_seqlens = torch.tensor([0, 3, 7])
    got = rotary.apply_rotary(x, cos, sin, cu_seqlens=cu_seqlens, interleaved=interleaved)
    ids = torch.tensor([0, 1, 2, 0, 1, 2, 3])
    want = rotate_by(x, cos[ids][:, None], sin[ids][:, None], interleaved)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    # the keys' and the queries' tables from the same random angles at an offset start: no row is refused
    got = rotary.apply_rotary(x[None], cos, sin, seqlen_offsets=1, layout="bshd", interleaved=interleaved)
    want = rotate_by(x, cos[1:8][:, None], sin[1:8][:, None], interleaved)
    assert torch.allclose(got[0], want, atol=1e-12, rtol=0)


def test_a_swapped_pair_is_named_in_every_form_that_holds_position_0():
    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 5, 16)
    cos, sin = rope.cos_sin(torch.arange(8))  # [T, r], row p is position p
    forms = {
        "position_ids": lambda c, s: rotary.apply_rotary(q, c, s, position_ids=torch.tensor([3, 0, 1, 2, 4])),
        "seqlen_offsets": lambda c, s: rotary.apply_rotary(q, c, s, seqlen_offsets=0),
        "cu_seqlens": lambda c, s: rotary.apply_rotary(q[0].transpose(0, 1), c, s, cu_seqlens=torch.tensor([0, 2, 5])),
        # the README's pattern: per-token tables from rope.cos_sin(...) of the tokens' positions
        "per_token": lambda c, s: rotary.apply_rotary(q, c[:5], s[:5]),
        "per_token_batched": lambda c, s: rotary.apply_rotary(q, c[None, :5], s[None, :5]),
    }
    for call in forms.values():
        call(cos, sin)  # the right order passes
        with pytest.raises(rotary.InputError, match="cos and sin swapped"):
            call(sin, cos)
    with pytest.raises(rotary.InputError, match="cos and sin swapped"):
        rotary.apply_rotary(q, sin[:5], cos[:5], validate="full")
    with pytest.raises(rotary.InputError, match="cos and sin swapped"):
        rotary.check_tables(sin[:5], cos[:5], interleaved=False)
    # per-token tables of a decoding step hold no position 0: nothing recognisable, the caller's contract
    rotary.apply_rotary(q, sin[3:8], cos[3:8])


def test_a_swapped_pair_on_an_accelerator_is_the_caller_s_contract_and_named_with_validate_sync():
    """Tables made on an accelerator are not read (a read would synchronise): nothing is raised or left to
    poll there; validate="sync" reads a few rows at once on any device and names the swap."""
    rope = rotary.RoPE(16)
    q = torch.randn(1, 2, 5, 16)
    cos, sin = rope.cos_sin(torch.arange(5))
    with accelerator_rules():
        rotary.apply_rotary(q, sin.clone(), cos.clone())  # per-token: its row 0 is position 0
    with pytest.raises(rotary.InputError, match="cos and sin swapped"):
        rotary.apply_rotary(q, sin.clone(), cos.clone(), validate="sync")


def test_no_valid_table_has_the_swap_signature():
    # RoPE's tables at every position of a long range, with attention scaling, in fp32 and bf16
    for scaling in (None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}):
        cos, sin = rotary.RoPE(64, scaling=scaling).cos_sin(torch.arange(1 << 14))
        for dtype in (torch.float32, torch.bfloat16):
            assert not rotary.tables.swapped_rows(cos.to(dtype), sin.to(dtype)).any()
            assert rotary.tables.swapped_rows(sin.to(dtype), cos.to(dtype))[0]
