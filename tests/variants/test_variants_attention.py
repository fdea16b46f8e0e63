"""The N-D producers (AxialRoPE, RoPE-Mixed, M-RoPE) as the ``rope=`` of ``RotaryAttention`` with their
own positions as ``position_ids``: the layer asks the producer for the tables, equal to rotating q and
k by hand; a KV cache with M-RoPE decodes like the full pass; and the errors name what to pass."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rotary import AxialRoPE, MRoPE, RoPEMixed
from rotary.nn import KVCache, RotaryAttention
from rotary.variants import Coordinates, multimodal_positions

E, H, D = 64, 4, 16


def by_hand(attn: RotaryAttention, x: torch.Tensor, rotate) -> torch.Tensor:
    """Projections, ``rotate(q, k)``, SDPA and the output projection, written out."""
    B, S, _ = x.shape
    hk = attn.num_kv_heads
    q = attn.q_proj(x).view(B, S, H, D).transpose(1, 2)
    k = attn.k_proj(x).view(B, S, hk, D).transpose(1, 2)
    v = attn.v_proj(x).view(B, S, hk, D).transpose(1, 2)
    q, k = rotate(q, k)
    k, v = k.repeat_interleave(H // hk, dim=1), v.repeat_interleave(H // hk, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=attn.causal)
    return attn.o_proj(out.transpose(1, 2).reshape(B, S, H * D))


def producers():
    g = torch.Generator().manual_seed(0)
    dinov3 = AxialRoPE.preset("dinov3", D, prefix_tokens=2)  # CLS + a register, then a 2 x 3 grid
    yield "dinov3", dinov3, dinov3.grid(2, 3), lambda q, k, p: dinov3(q, k, p)
    axial = AxialRoPE(D)
    crops = torch.randint(0, 50, (2, 8, 2), generator=g)  # explicit coordinates [B, S, A], one crop per image
    yield "axial [B, S, A]", axial, crops, lambda q, k, p: axial(q, k, p)
    mixed = RoPEMixed(D, H, prefix_tokens=1, generator=g)
    yield "RoPE-Mixed", mixed, mixed.grid(3, 3), lambda q, k, p: mixed(q, k, p)
    mrope = MRoPE(D, mrope_section=[2, 3, 3])
    ids = torch.randint(0, 40, (3, 2, 8), generator=g)
    yield "M-RoPE", mrope, ids, lambda q, k, p: mrope(q, k, position_ids=p)


@pytest.mark.parametrize("name", [p[0] for p in producers()])
def test_position_ids_are_the_producers_positions(name, gen):
    _, rope, positions, rotate = next(p for p in producers() if p[0] == name)
    kv_heads = H if name == "RoPE-Mixed" else 2  # per-head tables need as many k heads as q heads
    torch.manual_seed(0)
    attn = RotaryAttention(E, H, num_kv_heads=kv_heads, head_dim=D, rope=rope).eval()
    S = positions.seq_len if isinstance(positions, Coordinates) else positions.shape[-1 if name == "M-RoPE" else -2]
    x = torch.randn(2, S, E, generator=gen)
    with torch.no_grad():
        got = attn(x, position_ids=positions)
        want = by_hand(attn, x, lambda q, k: rotate(q, k, positions))
        assert torch.equal(got, want)
        # the tables= path of a model that computes them once gives the same
        tables = rope.tables(positions)
        assert torch.equal(attn(x, tables=tables), got)
        # and the positions matter: other positions, another output
        moved = (
            Coordinates(positions.values * 2, positions.identity)
            if isinstance(positions, Coordinates)
            else positions * 2
        )
        assert not torch.allclose(attn(x, position_ids=moved), got, atol=1e-3)


def test_mrope_kv_cache_decodes_like_the_full_pass(gen):
    torch.manual_seed(0)
    mrope = MRoPE(D, mrope_section=[2, 3, 3], base=1e4)
    attn = RotaryAttention(E, H, num_kv_heads=2, head_dim=D, rope=mrope, causal=True).eval()
    types = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0]])  # text and a 2 x 2 image (after merging)
    prompt = multimodal_positions(types, image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]]))
    steps = [prompt.continuation(1)]
    for _ in range(3):
        steps.append(steps[-1].continuation(1))
    all_ids = torch.cat([prompt.position_ids] + [s.position_ids for s in steps], dim=-1)  # [3, B, 7 + 4]
    x = torch.randn(2, 11, E, generator=gen)
    with torch.no_grad():
        full = attn(x, position_ids=all_ids)
        cache = KVCache()
        parts = [attn(x[:, :7], position_ids=prompt, cache=cache)]
        parts += [attn(x[:, 7 + i : 8 + i], position_ids=step, cache=cache) for i, step in enumerate(steps)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.positions.tolist() == [list(range(11))] * 2  # the cache holds token indices, not M-RoPE ids


def test_errors_name_what_to_pass():
    x = torch.randn(1, 7, E)
    mrope_layer = RotaryAttention(E, H, head_dim=D, rope=MRoPE(D, mrope_section=[2, 3, 3]))
    with pytest.raises(ValueError, match=r"M-RoPE rotates tokens by three ids .*pass position_ids \[3, B, S\]"):
        mrope_layer(x)
    with pytest.raises(ValueError, match=r"M-RoPE needs positions \[3, B, S\].*position_ids.expand\(3, B, S\)") as info:
        mrope_layer(x, position_ids=torch.arange(7))
    assert "use rotary.MRoPE" not in str(info.value)  # it already is one
    with pytest.raises(ValueError, match=r"M-RoPE position_ids cover S=5 positions but the input has S=7"):
        mrope_layer(x, position_ids=torch.zeros(3, 1, 5, dtype=torch.int64))
    axial = AxialRoPE(D)
    axial_layer = RotaryAttention(E, H, head_dim=D, rope=axial)
    with pytest.raises(
        ValueError, match=r"AxialRoPE rotates tokens by their 2 coordinates: pass position_ids=rope.grid"
    ):
        axial_layer(x)
    with pytest.raises(ValueError, match=r"cover S=6 tokens but the input has S=7.*grid\(\.\.\., prefix=, suffix=\)"):
        axial_layer(x, position_ids=axial.grid(2, 3))
    with pytest.raises(ValueError, match=r"position_bias=ALiBi scores 1-D distances .*AxialRoPE's positions are N-D"):
        RotaryAttention(E, H, head_dim=D, rope=axial, position_bias="alibi")
    with pytest.raises(ValueError, match=r"per-head frequencies for 4 heads.*num_kv_heads=2"):
        RotaryAttention(E, H, num_kv_heads=2, head_dim=D, rope=RoPEMixed(D, H))
