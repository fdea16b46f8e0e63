"""M-RoPE: slot layouts, parity with transformers 5.23's Qwen2-VL / Qwen2.5-VL / Qwen3-VL text rotary
embeddings and position-index functions (modules built from configs with random weights), decoding
continued from the positions value, exact reduction to 1-D RoPE, and errors for bad input."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rotary
from helpers import NAMED, forbid_torch_path, hf_frequencies
from rotary.errors import InputError
from rotary.kernels import extension
from rotary.kernels.eager import rotate_torch
from rotary.rope_types import ConfigError
from rotary.variants import MRoPE, MultimodalPositions, check_mrope_section, mrope_axes, multimodal_positions
from variant_checks import (
    FLOATS,
    WILD,
    assert_close,
    assert_named,
    expect,
    expected_nd,
    is_bool,
    is_int,
    is_number,
    largest_angle,
    tensors,
    to_bhsd,
    tolerance,
    valid_ids,
)

transformers = pytest.importorskip("transformers")


# ------------------------------------------------------------------------------------------------
# tiny transformers models (random weights, nothing downloaded)


def text_config(section, *, interleaved=None, head_dim=32, rope_type="default", **extra):
    block = {"rope_type": rope_type, "rope_theta": 10000.0, "mrope_section": list(section), **extra}
    if interleaved is not None:
        block["mrope_interleaved"] = interleaved
    return dict(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        rope_parameters=block,
    )


def qwen2_vl(section=(4, 6, 6), **kw):
    vision = dict(depth=1, embed_dim=16, hidden_size=64, num_heads=2, patch_size=2)
    return transformers.Qwen2VLModel(
        transformers.Qwen2VLConfig(text_config=text_config(section, **kw), vision_config=vision)
    ).eval()


def qwen2_5_vl(section=(4, 6, 6), tokens_per_second=3):
    vision = dict(
        depth=1,
        hidden_size=16,
        out_hidden_size=64,
        intermediate_size=16,
        num_heads=2,
        patch_size=2,
        tokens_per_second=tokens_per_second,
        fullatt_block_indexes=[0],
    )
    config = transformers.Qwen2_5_VLConfig(text_config=text_config(section), vision_config=vision)
    return transformers.Qwen2_5_VLModel(config).eval()


def qwen3_vl(section=(8, 4, 4)):
    vision = dict(
        depth=1,
        hidden_size=16,
        out_hidden_size=64,
        intermediate_size=16,
        num_heads=2,
        patch_size=2,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    )
    config = transformers.Qwen3VLConfig(text_config=text_config(section, interleaved=True), vision_config=vision)
    return transformers.Qwen3VLModel(config).eval()


def random_batch(rng: random.Random, batch: int, *, frames_apart: bool = False):
    """Token types of text, images (1, h, w) and videos (t, h, w) with merge size 2, left padded; grids in order."""
    rows, images, videos, seconds = [], [], [], []
    for _ in range(batch):
        types: list[int] = []
        for _ in range(rng.randint(1, 4)):
            types += [0] * rng.randint(1, 3)
            kind = rng.choice([0, 1, 2])
            if kind == 1:
                h, w = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
                images.append([1, h, w])
                types += [1] * (h * w // 4)
            elif kind == 2:
                t, h, w = rng.randint(1, 4), 2 * rng.randint(1, 2), 2 * rng.randint(1, 3)
                videos.append([t, h, w])
                seconds.append(rng.choice([0.5, 1 / 3, 1.0, 2.0, 0.7]))
                if frames_apart:  # Qwen3-VL: a timestamp (text) before every frame
                    types += ([0] + [2] * (h * w // 4)) * t
                else:
                    types += [2] * (t * h * w // 4)
        rows.append(types + [0] * rng.randint(0, 2))
    longest = max(len(r) for r in rows)
    token_types = torch.tensor([[0] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    grid = lambda g: torch.tensor(g, dtype=torch.int64) if g else None  # noqa: E731
    return (
        token_types,
        mask,
        grid(images),
        grid(videos),
        torch.tensor(seconds, dtype=torch.float32) if seconds else None,
    )


# ------------------------------------------------------------------------------------------------
# slot layouts


def test_qwen3_vl_interleaves_thw_20_times_then_tttt():
    assert "".join("THW"[a] for a in mrope_axes([24, 20, 20], mrope_interleaved=True)) == "THW" * 20 + "TTTT"
    assert MRoPE(128, mrope_section=[24, 20, 20], mrope_interleaved=True).slot_axes() == "THW" * 20 + "TTTT"


def test_qwen2_vl_chunks_slots_0_15_t_16_39_h_40_63_w():
    axes = mrope_axes([16, 24, 24]).tolist()
    assert axes[0:16] == [0] * 16 and axes[16:40] == [1] * 24 and axes[40:64] == [2] * 24


def rotary_embedding(model: str, section, *, interleaved=None):
    """transformers' text rotary embedding of ``model`` for ``mrope_section``, head_dim 2 * sum(section)."""
    head_dim = 2 * sum(section)
    if model == "qwen2_vl":
        config = transformers.Qwen2VLTextConfig(**text_config(section, head_dim=head_dim))
        return transformers.models.qwen2_vl.modeling_qwen2_vl.Qwen2VLRotaryEmbedding(config)
    if model == "qwen2_5_vl":
        config = transformers.Qwen2_5_VLTextConfig(**text_config(section, head_dim=head_dim))
        return transformers.models.qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLRotaryEmbedding(config)
    config = transformers.Qwen3VLTextConfig(**text_config(section, head_dim=head_dim, interleaved=interleaved))
    return transformers.models.qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding(config)


@pytest.mark.parametrize(
    "model,section",
    [
        ("qwen2_vl", (16, 24, 24)),
        ("qwen2_vl", (2, 10, 4)),
        ("qwen2_5_vl", (16, 24, 24)),
        ("qwen3_vl", (24, 20, 20)),
        ("qwen3_vl", (8, 4, 4)),
        ("qwen3_vl", (11, 11, 10)),  # h takes slot 31, one past 3 * 10 (Qwen3.5's sections)
    ],
)
def test_slot_axes_match_transformers_recomposition(model, section):
    interleaved = model == "qwen3_vl"
    embedding = rotary_embedding(model, section, interleaved=True if interleaved else None)
    slots = sum(section)
    # feed transformers' recomposition the axis number itself as the "frequency" of every slot
    labels = torch.arange(3, dtype=torch.float32)[:, None, None, None].expand(3, 1, 1, slots).clone()
    theirs = embedding.recomposition_frequencies(labels)[0, 0, :slots].long()
    assert torch.equal(theirs, mrope_axes(section, mrope_interleaved=interleaved))


# ------------------------------------------------------------------------------------------------
# tables against transformers' rotary embeddings


@pytest.mark.parametrize(
    "name,build,kw",
    [
        ("qwen2_vl", lambda: qwen2_vl(), {}),
        (
            "qwen2_vl linear",
            lambda: qwen2_vl(rope_type="linear", factor=2.0),
            {"scaling": {"rope_type": "linear", "factor": 2.0}},
        ),
        ("qwen2_5_vl", lambda: qwen2_5_vl(), {}),
        ("qwen3_vl", lambda: qwen3_vl(), {"mrope_interleaved": True}),
    ],
)
def test_tables_match_transformers_rotary_embedding(name, build, kw):
    model = build()
    rotary_emb = model.language_model.rotary_emb
    section = rotary_emb.mrope_section
    ids = torch.randint(0, 300, (3, 2, 17), generator=torch.Generator().manual_seed(0))
    cos, sin = rotary_emb(torch.zeros(1), ids)  # [B, S, D] fp32
    mrope = MRoPE(32, mrope_section=section, base=10000.0, **kw)
    got_cos, got_sin = mrope.tables(ids).gather()
    # transformers forms the angles in fp32: off by up to (angle) * 2^-24 rad; ours in float64
    atol = (int(ids.max()) + 1) * 2.0**-23
    torch.testing.assert_close(got_cos, cos, rtol=0, atol=atol)
    torch.testing.assert_close(got_sin, sin, rtol=0, atol=atol)


# ------------------------------------------------------------------------------------------------
# position ids against transformers' get_rope_index


@pytest.mark.parametrize("seed", range(4))
def test_positions_match_qwen2_vl_get_rope_index(seed):
    model = qwen2_vl()
    types, mask, images, videos, _ = random_batch(random.Random(seed), 3)
    ids = torch.randint(0, 64, types.shape)
    want_ids, want_deltas = model.get_rope_index(
        ids, types, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask
    )
    got = multimodal_positions(
        types, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, spatial_merge_size=2
    )
    assert torch.equal(got.position_ids, want_ids) and torch.equal(got.rope_deltas, want_deltas)


@pytest.mark.parametrize("seed", range(4))
def test_positions_match_qwen2_5_vl_get_rope_index_with_time_alignment(seed):
    model = qwen2_5_vl(tokens_per_second=3)
    types, mask, images, videos, seconds = random_batch(random.Random(100 + seed), 3)
    ids = torch.randint(0, 64, types.shape)
    for given_seconds in (seconds, None):  # without seconds, transformers steps tokens_per_second per frame
        want_ids, want_deltas = model.get_rope_index(
            ids,
            types,
            image_grid_thw=images,
            video_grid_thw=videos,
            second_per_grid_ts=given_seconds,
            attention_mask=mask,
        )
        got = multimodal_positions(
            types,
            image_grid_thw=images,
            video_grid_thw=videos,
            attention_mask=mask,
            tokens_per_second=3,
            second_per_grid_ts=given_seconds,
        )
        assert torch.equal(got.position_ids, want_ids) and torch.equal(got.rope_deltas, want_deltas)


def test_qwen2_5_vl_time_alignment_spaces_frames_by_tokens_per_second_times_seconds():
    types = torch.tensor([[0] + [2] * 3])  # a video of three frames of one merged token each
    got = multimodal_positions(
        types, video_grid_thw=torch.tensor([[3, 2, 2]]), tokens_per_second=4, second_per_grid_ts=[0.5]
    )
    assert got.position_ids[0, 0].tolist() == [0, 1, 3, 5]  # t = 1 + int(j * 4 * 0.5)
    assert got.position_ids[1, 0].tolist() == [0, 1, 1, 1] and got.next_position.tolist() == [6]


def test_a_video_of_one_frame_has_temporal_id_0_at_any_rate_and_more_frames_a_named_error():
    """τ(0) = int(0 · tokens_per_second · second_per_grid_ts) = 0 (docs/variants.md): a rate past float32's range made
    the one frame's temporal ids NaN, cast to -2**63, a wrong tensor without an error (Qwen3-Omni: an error calling
    them fractional); more frames at such a rate were -2**63 + 1 for the Omni models, where Qwen2.5-VL's rule names
    the 2**53 limit."""
    types = torch.tensor([[0] + [2] * 4 + [0]])  # text, a video of one frame of 2 x 2 merged tokens, text
    for model_type in (None, "qwen2_5_omni", "qwen3_omni_moe"):  # Qwen2.5-VL's rule, and the Omni models' own
        got = multimodal_positions(
            types, video_grid_thw=torch.tensor([[1, 4, 4]]), tokens_per_second=1e300, model_type=model_type
        )
        assert got.position_ids[:, 0].tolist() == [[0, 1, 1, 1, 1, 3], [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 3]]
    # two frames at that rate: temporal ids past 2**53, an error naming the rate (the Omni models' were -2**63 + 1)
    types = torch.tensor([[0] + [2] * 8 + [0]])
    for model_type in (None, "qwen2_5_omni", "qwen3_omni_moe"):
        with pytest.raises(InputError, match=r"2 temporal steps at .*1e\+300.* beyond 2\*\*53"):
            multimodal_positions(
                types, video_grid_thw=torch.tensor([[2, 4, 4]]), tokens_per_second=1e300, model_type=model_type
            )


def test_text_after_a_time_aligned_video_as_in_qwen_release_code():
    # the example of the Qwen2.5-VL pull request to transformers (#35569): 25 tokens per second, 2 frames
    # per temporal patch at 1 fps (2 s per grid step), a video of 3 x 2 x 2 merged tokens, then 5 text tokens
    types = torch.tensor([[2] * 12 + [0] * 5])
    kw = dict(video_grid_thw=torch.tensor([[3, 4, 4]]), tokens_per_second=25, second_per_grid_ts=[2.0])
    released = multimodal_positions(types, text_after_vision="max", **kw)
    assert released.position_ids[0, 0, :12].tolist() == [0] * 4 + [50] * 4 + [100] * 4
    assert released.position_ids[1, 0, :12].tolist() == [0, 0, 1, 1] * 3
    assert released.position_ids[2, 0, :12].tolist() == [0, 1, 0, 1] * 3
    assert released.position_ids[:, 0, 12:].tolist() == [[101, 102, 103, 104, 105]] * 3
    # transformers 5.23 starts that text at max(h, w) / m = 2 instead; the next token goes to 101 in both
    grid = multimodal_positions(types, **kw)
    assert grid.position_ids[:, 0, 12:].tolist() == [[2, 3, 4, 5, 6]] * 3
    assert grid.next_position.tolist() == [101] and released.next_position.tolist() == [106]


@pytest.mark.parametrize("seed", range(4))
def test_positions_match_qwen3_vl_get_rope_index(seed):
    model = qwen3_vl()
    types, mask, images, videos, _ = random_batch(random.Random(200 + seed), 3, frames_apart=True)
    ids = torch.randint(0, 64, types.shape)
    want_ids, want_deltas = model.get_rope_index(
        ids,
        types,
        image_grid_thw=images,
        video_grid_thw=None if videos is None else videos.clone(),
        attention_mask=mask,
    )
    got = multimodal_positions(
        types, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, split_video_frames=True
    )
    assert torch.equal(got.position_ids, want_ids) and torch.equal(got.rope_deltas, want_deltas)


# ------------------------------------------------------------------------------------------------
# decoding


def test_continuation_equals_transformers_decode_positions():
    model = qwen2_vl()
    types, _, images, videos, _ = random_batch(random.Random(7), 1)
    ids = torch.randint(0, 64, types.shape)
    embeds = model.get_input_embeddings()(ids)
    model.compute_3d_position_ids(ids, embeds, image_grid_thw=images, video_grid_thw=videos, mm_token_type_ids=types)

    class Past:
        def get_seq_length(self, layer_idx=0):
            return types.shape[1]

    step = model.compute_3d_position_ids(None, embeds[:, :3], past_key_values=Past())  # three new tokens
    ours = multimodal_positions(types, image_grid_thw=images, video_grid_thw=videos).continuation(3)
    assert torch.equal(ours.position_ids, step)


def test_kv_cache_decoding_equals_the_full_pass():
    model = qwen2_vl()
    types, _, images, videos, _ = random_batch(random.Random(3), 2)
    prompt = multimodal_positions(types, image_grid_thw=images, video_grid_thw=videos)
    steps, generated = [], prompt
    for _ in range(4):
        generated = generated.continuation(1)
        steps.append(generated)
    full_positions = torch.cat([prompt.position_ids] + [s.position_ids for s in steps], dim=-1)
    ids = torch.randint(0, 64, (2, types.shape[1] + 4))
    text_model = model.language_model
    with torch.no_grad():
        full = text_model(input_ids=ids, position_ids=full_positions).last_hidden_state
        cache = transformers.DynamicCache(config=text_model.config)
        out = [
            text_model(
                input_ids=ids[:, : types.shape[1]],
                position_ids=prompt.position_ids,
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
        ]
        for i, s in enumerate(steps):
            col = types.shape[1] + i
            out.append(
                text_model(
                    input_ids=ids[:, col : col + 1], position_ids=s.position_ids, past_key_values=cache, use_cache=True
                ).last_hidden_state
            )
    torch.testing.assert_close(torch.cat(out, dim=1), full, rtol=1e-5, atol=1e-5)


def test_each_prompt_continues_from_its_own_positions():
    with_image = multimodal_positions(torch.tensor([[0, 1, 1, 1, 1, 0]]), image_grid_thw=torch.tensor([[1, 4, 4]]))
    text_only = multimodal_positions(torch.zeros(1, 3, dtype=torch.int64))
    assert with_image.next_position.tolist() == [4] and with_image.rope_deltas.tolist() == [[-2]]
    # computing another prompt's positions in between changes nothing: no module keeps rope_deltas
    assert text_only.continuation(2).position_ids[0].tolist() == [[3, 4]]
    assert with_image.continuation(2).position_ids[0].tolist() == [[4, 5]]
    padded = multimodal_positions(
        torch.tensor([[0, 0, 0, 1, 1, 1, 1]]),
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1, 1]]),
    )
    assert padded.position_ids[:, 0, 0].tolist() == [0, 0, 0] and padded.next_position.tolist() == [4]


# ------------------------------------------------------------------------------------------------
# the tables themselves


@pytest.mark.parametrize("interleaved_layout", [False, True])
@pytest.mark.parametrize("pairing", [False, True])
def test_reduces_exactly_to_1d_rope_when_t_h_w_are_equal(interleaved_layout, pairing, gen):
    section = [8, 4, 4] if interleaved_layout else [4, 6, 6]
    mrope = MRoPE(32, mrope_section=section, mrope_interleaved=interleaved_layout, base=1e6, interleaved=pairing)
    rope = rotary.RoPE(32, base=1e6, interleaved=pairing)
    ids = torch.randint(0, 5000, (2, 9), generator=gen)
    m_cos, m_sin = mrope.tables(ids.expand(3, 2, 9)).gather()
    r_cos, r_sin = rope.tables(ids).gather()
    assert torch.equal(m_cos, r_cos) and torch.equal(m_sin, r_sin)
    q, k = torch.randn(2, 4, 9, 32, generator=gen), torch.randn(2, 2, 9, 32, generator=gen)
    for a, b in zip(mrope(q, k, position_ids=ids.expand(3, 2, 9)), rope(q, k, position_ids=ids)):
        assert torch.equal(a, b)


def test_each_slot_turns_with_its_own_axis(gen):
    mrope = MRoPE(16, mrope_section=[2, 3, 3])
    t, h, w = 5, 11, 17
    theta = torch.atan2(*reversed(mrope.tables(torch.tensor([t, h, w]).view(3, 1, 1)).gather()))[0, 0, :8].double()
    want = torch.tensor([[t, h, w][a] for a in mrope.axes.tolist()]) * mrope.inv_freq.double()
    torch.testing.assert_close(
        torch.remainder(theta - want + torch.pi, 2 * torch.pi) - torch.pi,
        torch.zeros(8, dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )


@pytest.mark.parametrize("interleaved_layout", [False, True])
def test_runs_on_the_fused_cpu_kernel(interleaved_layout, monkeypatch, gen):
    assert extension.load_cpu_extension() is not None, extension.cpu_extension_error()
    forbid_torch_path(monkeypatch)  # equal to the torch oracle, and not by falling back to it
    section = [8, 4, 4] if interleaved_layout else [4, 6, 6]
    mrope = MRoPE(32, mrope_section=section, mrope_interleaved=interleaved_layout)
    ids = torch.randint(0, 50, (3, 2, 7), generator=gen)
    tables = mrope.tables(ids)
    q, k = torch.randn(2, 7, 4, 32, generator=gen), torch.randn(2, 7, 2, 32, generator=gen)
    q_rot, k_rot = rotary.rotate([q, k], tables, layout="bshd", kinds=("q", "k"))
    cos, sin = tables.gather()
    want_q = rotate_torch(q, cos[:, :, None], sin[:, :, None], interleaved=False, inplace=False)
    want_k = rotate_torch(k, cos[:, :, None], sin[:, :, None], interleaved=False, inplace=False)
    assert torch.equal(q_rot, want_q) and torch.equal(k_rot, want_k)
    # the module's own call (bshd), with autograd: forward and backward on the kernel
    q_leaf = q.clone().requires_grad_()
    got_q, got_k = mrope(q_leaf, k, position_ids=ids, layout="bshd")
    assert torch.equal(got_q.detach(), want_q) and torch.equal(got_k, want_k)
    g = torch.randn(q.shape, generator=gen)  # a dense gradient (an expanded one, from .sum(), has no unit stride)
    got_q.backward(g)
    want_grad = rotate_torch(g, cos[:, :, None], -sin[:, :, None], interleaved=False, inplace=False)
    torch.testing.assert_close(q_leaf.grad, want_grad, rtol=1e-6, atol=1e-6)


def test_positions_value_feeds_the_tables():
    mp = multimodal_positions(torch.tensor([[0, 1, 1, 1, 1]]), image_grid_thw=torch.tensor([[1, 4, 4]]))
    assert isinstance(mp, MultimodalPositions) and mp.bound == 3 and mp.positions.axes == 3
    mrope = MRoPE(16, mrope_section=[2, 3, 3])
    assert torch.equal(mrope.tables(mp).cos, mrope.tables(mp.position_ids).cos)


# ------------------------------------------------------------------------------------------------
# bad input


def test_3d_positions_given_to_1d_rope_say_to_use_mrope():
    with pytest.raises(ValueError, match=r"M-RoPE ids \[3, B, S\].*use rotary.MRoPE"):
        rotary.RoPE(32).tables(torch.zeros(3, 1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"M-RoPE"):
        rotary.RoPE(32)(
            torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32), position_ids=torch.zeros(3, 1, 4, dtype=torch.int64)
        )


def test_1d_positions_given_to_mrope_say_how_to_expand():
    mrope = MRoPE(32, mrope_section=[4, 6, 6])
    for ids in (torch.arange(4), torch.arange(4)[None]):
        with pytest.raises(ValueError, match=r"needs positions \[3, B, S\].*got 1-D positions.*expand\(3, B, S\)"):
            mrope.tables(ids)
    with pytest.raises(ValueError, match=r"got 1-D positions \(Positions with 1 axis"):
        mrope.tables(rotary.positions.arange(4))
    with pytest.raises(ValueError, match=r"must be \[3, B, S\].*got shape \(2, 1, 4\)"):
        mrope.tables(torch.zeros(2, 1, 4, dtype=torch.int64))


def test_sections_that_do_not_sum_to_half_the_rotary_dim():
    with pytest.raises(
        ValueError, match=r"mrope_section \[16, 24, 20\] sums to 60 but rotary_dim=128 has 64 .* sum to 64"
    ):
        MRoPE(128, mrope_section=[16, 24, 20])
    with pytest.raises(ValueError, match="sums to 64 but rotary_dim=64 has 32"):
        check_mrope_section([16, 24, 24], 64)
    with pytest.raises(ValueError, match=r"\[4, 30, 30\] cannot be interleaved over 64 slots: .* \[22, 21, 21\]"):
        MRoPE(128, mrope_section=[4, 30, 30], mrope_interleaved=True)
    with pytest.raises(ValueError, match="positive ints"):
        mrope_axes([16, 0, 48])
    with pytest.raises(ValueError, match="rope_type 'dynamic' changes the frequencies with the sequence length"):
        MRoPE(
            32, mrope_section=[4, 6, 6], scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
        )


def test_grids_that_do_not_match_the_tokens():
    with pytest.raises(ValueError, match=r"run of 3 image tokens at index 1 does not match .*\[1, 4, 4\].* = 4 tokens"):
        multimodal_positions(torch.tensor([[0, 1, 1, 1]]), image_grid_thw=torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="no image_grid_thw entry is left"):
        multimodal_positions(torch.tensor([[0, 1, 0, 1]]), image_grid_thw=torch.tensor([[1, 2, 2]]))
    with pytest.raises(ValueError, match="video_grid_thw holds 2 entries but the token types hold only 1 video runs"):
        multimodal_positions(torch.tensor([[2, 0]]), video_grid_thw=torch.tensor([[1, 2, 2], [1, 2, 2]]))
    with pytest.raises(ValueError, match=r"token_types must hold 0 \(text\), 1 \(image\) or 2 \(video\)"):
        multimodal_positions(torch.tensor([[0, 3]]))


def test_layout_numbers_behind_the_figure():
    from rotary.analysis import mrope_layout

    chunked = mrope_layout(MRoPE(128, mrope_section=[16, 24, 24], base=1e6))
    # chunked: each axis owns one band of the spectrum, t the fastest and w the slowest
    assert chunked.span["T"][1] < chunked.span["H"][0] and chunked.span["H"][1] < chunked.span["W"][0]
    interleaved = mrope_layout(MRoPE(128, mrope_section=[24, 20, 20], mrope_interleaved=True, base=1e6))
    # interleaved: every axis reaches from within 2x of the fastest wavelength to within 3x of the slowest
    fastest, slowest = min(interleaved.wavelength), max(interleaved.wavelength)
    for low, high in interleaved.span.values():
        assert low < 2 * fastest and high > slowest / 3


# ------------------------------------------------------------------------------------------------
# from Hugging Face configs


@pytest.mark.parametrize(
    "name,build,kw",
    [
        ("qwen2_vl", lambda: qwen2_vl(), {}),
        ("qwen2_5_vl", lambda: qwen2_5_vl(), {}),
        ("qwen3_vl", lambda: qwen3_vl(), {}),
    ],
)
def test_from_hf_config_matches_transformers(name, build, kw):
    model = build()
    mrope = MRoPE.from_hf_config(model.config)
    assert (
        mrope.mrope_interleaved is (name == "qwen3_vl")
        and list(mrope.mrope_section) == model.language_model.rotary_emb.mrope_section
    )
    ids = torch.randint(0, 300, (3, 2, 17), generator=torch.Generator().manual_seed(1))
    cos, sin = model.language_model.rotary_emb(torch.zeros(1), ids)
    got_cos, got_sin = mrope.tables(ids).gather()
    atol = (int(ids.max()) + 1) * 2.0**-23  # transformers' fp32 angles
    torch.testing.assert_close(got_cos, cos, rtol=0, atol=atol)
    torch.testing.assert_close(got_sin, sin, rtol=0, atol=atol)
    # a 1-D RoPE of the config is right for text positions only: RoPE.from_hf_config refuses it and says
    # where to go, and which 1-D RoPE equals it on text; that RoPE, built as the message writes it, does
    section = list(model.language_model.rotary_emb.mrope_section)
    for config in (model.config, model.config.text_config):
        with pytest.raises(rotary.ConfigError, match=r"uses multimodal RoPE") as info:
            rotary.RoPE.from_hf_config(config)
        message = str(info.value)
        assert f"model_type '{name}_text' uses multimodal RoPE (M-RoPE): mrope_section {section}" in message
        assert "load it with rotary.MRoPE.from_hf_config(config) and pass positions [3, B, S]" in message
        call = message.split("tables equal those of ")[1].split(", if a 1-D RoPE")[0]
        rope = eval(call, {"rotary": rotary})  # noqa: S307 - the message's own expression
        text = ids[0]
        assert torch.equal(rope.tables(text).gather()[0], mrope.tables(text.expand(3, -1, -1)).gather()[0])


def test_from_a_flat_4x_config_with_type_mrope():
    flat = {
        "model_type": "qwen2_5_vl",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        "vision_config": {"depth": 32},
    }
    mrope = MRoPE.from_hf_config(flat)
    assert (mrope.head_dim, mrope.freqs.base, mrope.mrope_section, mrope.mrope_interleaved) == (
        128,
        1e6,
        (16, 24, 24),
        False,
    )
    assert mrope.freqs.rope_type == "default"


def test_from_hf_config_errors():
    bad = {
        "model_type": "qwen2_vl",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 20]},
    }
    with pytest.raises(
        rotary.ConfigError, match=r"qwen2_vl_text.*mrope_section \[16, 24, 20\] sums to 60 but rotary_dim=128"
    ):
        MRoPE.from_hf_config(bad)
    with pytest.raises(rotary.ConfigError, match="has no multimodal RoPE .*rotary.RoPE.from_hf_config"):
        MRoPE.from_hf_config({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4})
    with pytest.raises(rotary.ConfigError, match="does not use multimodal RoPE"):
        rotary.RoPE.from_hf_config(
            {"model_type": "llama", "head_dim": 64, "rope_parameters": {"mrope_section": [16, 8, 8]}}
        )
    qwen3 = {
        "model_type": "qwen3_vl_text",
        "head_dim": 128,
        "hidden_size": 512,
        "num_attention_heads": 4,
        "rope_parameters": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": False},
    }
    with pytest.raises(rotary.ConfigError, match="lays its frequency slots out interleaved whatever the flag says"):
        MRoPE.from_hf_config(qwen3)
    with pytest.warns(UserWarning, match="interleaved whatever the flag"):
        assert MRoPE.from_hf_config(qwen3, strict=False).mrope_interleaved


# ------------------------------------------------------------------------------------------------
# rotary.hf.patch on the Qwen-VL models


def vl_for_generation(name: str):
    tokens = dict(image_token_id=60, video_token_id=61, vision_start_token_id=62)
    if name == "qwen2_vl":
        vision = dict(depth=1, embed_dim=16, hidden_size=64, num_heads=2, patch_size=2)
        config = transformers.Qwen2VLConfig(text_config=text_config((4, 6, 6)), vision_config=vision, **tokens)
        return transformers.Qwen2VLForConditionalGeneration(config).eval()
    if name == "qwen2_5_vl":
        vision = dict(
            depth=1,
            hidden_size=16,
            out_hidden_size=64,
            intermediate_size=16,
            num_heads=2,
            patch_size=2,
            fullatt_block_indexes=[0],
            window_size=8,
        )
        config = transformers.Qwen2_5_VLConfig(text_config=text_config((4, 6, 6)), vision_config=vision, **tokens)
        return transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    vision = dict(
        depth=1,
        hidden_size=16,
        out_hidden_size=64,
        intermediate_size=16,
        num_heads=2,
        patch_size=2,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    )
    config = transformers.Qwen3VLConfig(
        text_config=text_config((8, 4, 4), interleaved=True), vision_config=vision, **tokens
    )
    return transformers.Qwen3VLForConditionalGeneration(config).eval()


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_hf_patch_gives_the_same_logits_with_an_image(name, monkeypatch):
    torch.manual_seed(0)
    model = vl_for_generation(name)
    ids = torch.tensor([[1, 2, 62] + [60] * 4 + [3, 4, 5], [1, 62] + [60] * 4 + [6, 7, 8, 9]])
    inputs = dict(
        input_ids=ids,
        pixel_values=torch.randn(32, 24),
        image_grid_thw=torch.tensor([[1, 4, 4], [1, 4, 4]]),
        mm_token_type_ids=(ids == 60).long(),
    )
    with torch.no_grad():
        before = model(**inputs).logits
        calls = []
        rotate = rotary.hf.patching.rotate
        monkeypatch.setattr(rotary.hf.patching, "rotate", lambda *a, **k: calls.append(1) or rotate(*a, **k))
        run_plan = rotary.rotation.run_plan  # a later layer's call with the same signature: its recorded plan
        monkeypatch.setattr(
            rotary.rotation, "run_plan", lambda *a: (lambda o: o and calls.append(1) or o)(run_plan(*a))
        )
        rotary.hf.patch(model)
        patched = model(**inputs).logits
        # every text layer and every vision block (its tower's apply_rotary_pos_emb_vision), through rotary
        assert len(calls) == model.config.text_config.num_hidden_layers + model.config.vision_config.depth
        torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-5)
        rotary.hf.unpatch(model)
        assert torch.equal(model(**inputs).logits, before)


def test_hf_patch_generates_the_same_tokens():
    torch.manual_seed(0)
    model = vl_for_generation("qwen2_5_vl")
    ids = torch.tensor([[1, 2, 62] + [60] * 4 + [3, 4, 5]])
    inputs = dict(
        input_ids=ids,
        pixel_values=torch.randn(16, 24),
        image_grid_thw=torch.tensor([[1, 4, 4]]),
        mm_token_type_ids=(ids == 60).long(),
        attention_mask=torch.ones_like(ids),
    )
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    before = model.generate(**inputs, **settings)
    rotary.hf.patch(model)
    assert torch.equal(model.generate(**inputs, **settings), before)


def test_rotary_inspect_shows_the_axis_of_every_pair(tmp_path, capsys):
    import json

    from rotary.tools.cli import main

    transformers.Qwen2VLConfig().save_pretrained(tmp_path / "qwen2_vl")
    transformers.Qwen3VLConfig().save_pretrained(tmp_path / "qwen3_vl")
    assert main(["inspect", str(tmp_path / "qwen2_vl" / "config.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mrope"] == {"mrope_section": [16, 24, 24], "layout": "chunked", "axes": "T" * 16 + "H" * 24 + "W" * 24}
    assert main(["inspect", str(tmp_path / "qwen3_vl" / "config.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mrope"]["axes"] == "THW" * 20 + "TTTT"
    assert main(["inspect", str(tmp_path / "qwen2_vl" / "config.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())  # rich wraps long lines at the terminal's width
    assert "mrope_section [16, 24, 24] (chunked)" in text and "T 0-15, H 16-39, W 40-63" in text


def _slot_axes(section, interleaved):
    """Independent of rotary: the axis of each frequency slot (chunked, or Qwen3-VL's cycle)."""
    if not interleaved:
        return [j % 3 for j, n in enumerate(section) for _ in range(n)]
    left, out = list(section), []
    for i in range(sum(section)):
        axis = i % 3
        if axis and left[axis] and 3 * left[axis] > 0 and i < 3 * section[axis]:
            out.append(axis)
            left[axis] -= 1
        else:
            out.append(0)
    return out


#: a valid static block with an attention scaling of its own (0.1 ln 4 + 1)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@st.composite
def mrope_args(draw, wild=True):
    head_dim = draw(st.sampled_from([16] * 8 + [24, 12, 8, 8, 0, 7, "16", 16.0]))
    d = head_dim if isinstance(head_dim, int) and head_dim > 0 else 16
    r = draw(st.sampled_from([d, d, d - 4 if d > 4 else d]))
    slots = r // 2
    interleaved_layout = draw(st.sampled_from([False] * 5 + [True] * 5 + ["true"]))
    hw = max(1, (slots - 1) // 3) if interleaved_layout is True else max(1, slots // 3)
    t = slots - 2 * hw
    section = draw(
        st.sampled_from(
            [[t, hw, hw]] * 20
            + [
                [slots],
                [t, hw, hw + 1],
                [0, slots, 0],
                [-1, 1, slots],
                "2,3,3",
                [],
                None,
                [t, hw, float(hw)],
                [True, hw, hw],
            ]
        )
    )
    scaling = draw(
        st.sampled_from(
            [None] * 10
            + [
                {"rope_type": "linear", "factor": 2.0},
                YARN,
                {"rope_type": "dynamic", "factor": 2.0},
                {"rope_type": "linear", "factor": -1.0},
                "linear",
            ]
        )
    )
    args = dict(
        head_dim=head_dim,
        mrope_section=section,
        mrope_interleaved=interleaved_layout,
        base=draw(st.sampled_from([None] * 5 + [10000.0] * 5 + [1e6] * 5 + [0.5, -1.0, math.nan, "1e6"])),
        rotary_dim=r if r != d else None,
        scaling=scaling,
        interleaved=draw(st.sampled_from([False] * 5 + [True] * 5 + ["false"])),
    )
    if not wild:  # every argument valid
        args.update(
            head_dim=d,
            mrope_section=[t, hw, hw],
            mrope_interleaved=interleaved_layout is True,
            interleaved=args["interleaved"] is True,
        )
        args.update(
            base=args["base"] if args["base"] in (None, 10000.0, 1e6) else None,
            scaling=draw(st.sampled_from([None, {"rope_type": "linear", "factor": 2.0}, YARN])),
        )
    return args


@st.composite
def mrope_positions(draw, batch, seq, wild=True):
    kind = draw(st.sampled_from(["ids"] * 2 + ["text"] + ["arbitrary"] * wild))
    if kind == "arbitrary":
        return draw(
            st.one_of(
                tensors(max_size=3),
                st.just(torch.arange(seq)),
                st.just(torch.arange(seq).expand(batch, seq)),
                st.just([0, 1]),
            )
        )
    b = draw(st.sampled_from([batch, 1] + [batch + 1] * wild))
    values = draw(st.sampled_from([50, 50, 2**20, 2**40]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if kind == "text":
        ids = torch.randint(0, values, (1, b, seq), generator=g).expand(3, b, seq)
    else:
        ids = torch.randint(0, values, (3, b, seq), generator=g)
    special = draw(st.sampled_from([None, None, "int32"] + [-1, "float", "bool"] * wild))
    if special == -1 and ids.numel():
        ids = ids.clone()
        ids.view(-1)[0] = -1
    elif special == "float":
        ids = ids.float()
    elif special == "int32":
        ids = ids.int()
    elif special == "bool":
        ids = ids > 3
    return ids


def valid_mrope(args: dict) -> bool:
    """MRoPE's documented contract: head_dim an even int in (0, 2**16], rotary_dim an even int <= head_dim, base
    None or a number > 1, a static scaling block (None, linear with factor > 0, yarn; not dynamic), boolean flags,
    and mrope_section positive ints summing to rotary_dim / 2; interleaved: three sections with h, w taking
    every third slot (3 h <= slots + 1, 3 w <= slots)."""
    d, r, base = args["head_dim"], args["rotary_dim"], args["base"]
    r = d if r is None else r
    if not (is_int(d) and 0 < d <= 2**16 and d % 2 == 0 and is_int(r) and 0 < r <= d and r % 2 == 0):
        return False
    if not (base is None or (is_number(base) and base > 1)):
        return False
    scaling = args["scaling"]
    if not (scaling is None or (isinstance(scaling, dict) and scaling["rope_type"] in ("linear", "yarn"))):
        return False
    if scaling is not None and scaling["rope_type"] == "linear" and not scaling["factor"] > 0:
        return False
    layout_interleaved, section = args["mrope_interleaved"], args["mrope_section"]
    if not (is_bool(layout_interleaved) and is_bool(args["interleaved"]) and isinstance(section, (list, tuple))):
        return False
    slots = r // 2
    if not section or not all(is_int(n) and n > 0 for n in section) or sum(section) != slots:
        return False
    if layout_interleaved:
        return len(section) == 3 and 3 * section[1] <= slots + 1 and 3 * section[2] <= slots
    return True


@settings(max_examples=80, deadline=None)
@given(wild=WILD, data=st.data())
def test_mrope_is_right_or_a_named_error(wild, data):
    args = data.draw(mrope_args(wild))
    ok = valid_mrope(args)
    rope = expect(ok, MRoPE, strict=True, **args)
    if not ok:
        return
    section, layout_interleaved = list(args["mrope_section"]), args["mrope_interleaved"]
    assert rope.axes.tolist() == _slot_axes(section, layout_interleaved)
    batch, seq, dtype = data.draw(st.integers(1, 2)), data.draw(st.integers(0, 4)), data.draw(st.sampled_from(FLOATS))
    layout = data.draw(st.sampled_from(["bhsd", "bshd"] + ["thd"] * wild))
    d = args["head_dim"]
    shape_q = [batch, 2, seq, d] if layout != "bshd" else [batch, seq, 2, d]
    q = data.draw(st.one_of(tensors(shape=shape_q, dtype=dtype), *[tensors(max_size=3)] * wild))
    k = data.draw(tensors(shape=[batch, 1, seq, d] if layout != "bshd" else [batch, seq, 1, d], dtype=dtype))
    ids = data.draw(mrope_positions(batch, seq, wild))
    # valid: q and k as drawn for the layout (a wild q never fits: its last dim is <= 3), "bhsd"/"bshd", and
    # ids [3, 1 or B, S] (int64/int32, in [0, 2**53])
    ok = q.shape == tuple(shape_q) and q.dtype == dtype and layout in ("bhsd", "bshd")
    ok = ok and isinstance(ids, torch.Tensor) and ids.dim() == 3 and ids.shape[0] == 3 and ids.shape[2] == seq
    ok = ok and ids.shape[1] in (1, batch) and valid_ids(ids, ranks=(3,))
    out = expect(ok, rope, q, k, position_ids=ids, layout=layout)
    if not ok:
        return
    # the frequencies and attention scaling: transformers' for the block over the rotated channels (restated in
    # helpers; docs/core.md: bit-identical), the base 10000 when none is given
    r = d if args["rotary_dim"] is None else args["rotary_dim"]
    base = 10000.0 if args["base"] is None else args["base"]
    inv_freq, attention_scaling = hf_frequencies(args["scaling"] or {"rope_type": "default"}, base, r, head_dim=r)
    assert torch.equal(rope.freqs.inv_freq, inv_freq) and rope.attention_scaling == attention_scaling
    coords = ids.long().permute(1, 2, 0).double()  # [B, S, 3]
    slots = torch.arange(r // 2)
    inv = torch.zeros(3, slots.numel(), dtype=torch.float64)
    inv[torch.tensor(_slot_axes(section, layout_interleaved)), slots] = inv_freq.double()
    angle = largest_angle(coords, inv)
    for got, x in zip(out, (q, k)):
        ref = expected_nd(to_bhsd(x, layout), coords, inv, args["interleaved"])
        ref[..., :r] *= attention_scaling  # the pass-through channels are not scaled
        assert_close(got, ref if layout == "bhsd" else ref.transpose(1, 2), x, angle)
    if ids.numel() and bool((ids == ids[:1]).all()):  # text: M-RoPE is the 1-D RoPE of the same config
        plain = rotary.RoPE(
            d, base=args["base"], rotary_dim=args["rotary_dim"], scaling=args["scaling"], interleaved=rope.interleaved
        )
        want = plain(q, k, position_ids=ids[0].expand(batch, seq), layout=layout)
        for got, w, x in zip(out, want, (q, k)):
            assert float((got.double() - w.double()).abs().max()) <= 2 * tolerance(x, angle)


@settings(max_examples=60, deadline=None)
@given(
    # weighted to valid values, so that valid configs are drawn (6 of 60 draws were)
    model_type=st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2_vl", "qwen2_5_vl", "llama", None, 3]),
    hidden=st.sampled_from([64, 64, 64, 48, 0, -64, "64", 64.0]),
    heads=st.sampled_from([4, 4, 4, 3, 0]),
    theta=st.sampled_from([1e6, 1e4, None, 1e6, 1e4, None, 0.0, -1.0, math.nan, "1e6"]),
    section=st.sampled_from(
        [[2, 3, 3], [2, 3, 3], [4, 2, 2], [2, 3, 3], None, [3, 3, 3], [2, 3], "233", None, [2.0, 3, 3]]
    ),
    block=st.sampled_from(["rope_scaling", "rope_scaling", "rope_parameters", "text_config"]),
)
# valid configs of each family and block form (5 of the 60 derandomized draws are valid)
@example(model_type="qwen2_vl", hidden=64, heads=4, theta=None, section=[2, 3, 3], block="rope_scaling")
@example(model_type="qwen2_5_vl", hidden=48, heads=3, theta=1e4, section=[4, 2, 2], block="text_config")
@example(model_type="qwen3_vl", hidden=64, heads=4, theta=1e6, section=None, block="rope_parameters")
@example(model_type="qwen3_vl", hidden=64, heads=4, theta=None, section=None, block="text_config")
def test_mrope_from_hf_config_is_right_or_a_named_error(model_type, hidden, heads, theta, section, block):
    cfg = {"model_type": model_type, "hidden_size": hidden, "num_attention_heads": heads}
    inner = {"type": "mrope", "rope_type": "default", "mrope_section": section}
    if block == "rope_parameters":
        inner = {"rope_type": "default", "mrope_section": section, "rope_theta": theta}
    elif theta is not None:  # None: absent. (In the block a null is "not given", docs/scaling.md; a top-level
        cfg["rope_theta"] = theta  # rope_theta: null is refused, which the documents do not decide: not drawn)
    cfg["rope_scaling" if block != "rope_parameters" else "rope_parameters"] = inner
    if block == "text_config":
        cfg = {"model_type": model_type, "text_config": cfg}
    # valid, from transformers' configs: a Qwen VL model_type; rope_theta absent or null in the block (None) or a
    # number > 1; Qwen2-VL and Qwen2.5-VL: head_dim = hidden_size // num_attention_heads (ints > 0, an even
    # quotient) and an mrope_section of positive ints summing to head_dim / 2; Qwen3-VL: its defaults, head_dim 128
    # and [24, 20, 20] (hidden_size and the heads are not read), so only a missing section fits
    valid = model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl") and (theta is None or (is_number(theta) and theta > 1))
    if model_type == "qwen3_vl":
        valid = valid and section is None
    elif valid:
        head_dim = hidden // heads if is_int(hidden) and hidden > 0 and heads > 0 else 0
        valid = head_dim > 0 and head_dim % 2 == 0 and isinstance(section, list)
        valid = valid and all(is_int(n) and n > 0 for n in section) and sum(section) == head_dim // 2
    try:
        rope = MRoPE.from_hf_config(cfg)
    except ConfigError as exc:
        assert not valid, f"a valid config was refused: {exc}"
        assert str(exc)
        return
    except NAMED as exc:
        assert not valid, f"a valid config was refused: {exc}"
        assert_named(exc)
        return
    assert valid, f"an invalid config was accepted: {cfg}"
    assert rope.mrope_interleaved is (model_type == "qwen3_vl")
    if model_type != "qwen3_vl":  # Qwen3-VL has transformers' defaults (head_dim 128, [24, 20, 20]) for what is missing
        assert rope.head_dim == hidden // heads and list(rope.mrope_section) == section
    if theta is not None:
        assert rope.freqs.base == theta


@st.composite
def multimodal_batches(draw):
    """Token types with images / videos whose grids match, and the expected ids (written out here)."""
    merge = draw(st.sampled_from([1, 2]))
    rows, images, videos = [], [], []
    for _ in range(draw(st.integers(1, 2))):
        row = []
        for _ in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from([0, 0, 1, 2]))
            if kind == 0:
                row += [0] * draw(st.integers(1, 3))
                continue
            t, h, w = draw(st.integers(1, 2)), merge * draw(st.integers(1, 2)), merge * draw(st.integers(1, 2))
            (images if kind == 1 else videos).append([t, h, w])
            row += [kind] * (t * (h // merge) * (w // merge))
            row += [0]  # text after each vision run keeps runs apart
        rows.append(row)
    length = max(len(r) for r in rows)
    types = torch.tensor([r + [0] * (length - len(r)) for r in rows], dtype=torch.int64)
    mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows], dtype=torch.int64)
    return types, mask, images, videos, merge


def _expected_positions(types, mask, images, videos, merge):
    """get_rope_index's ids ('grid' rule), written out token by token."""
    grids = {1: list(images), 2: list(videos)}
    out = torch.zeros(3, *types.shape, dtype=torch.int64)
    nxt = []
    for b in range(types.shape[0]):
        i, cur, top = 0, 0, -1
        n = int(mask[b].sum())
        while i < n:
            kind = int(types[b, i])
            if kind == 0:
                out[:, b, i] = cur
                top = max(top, cur)
                cur, i = cur + 1, i + 1
                continue
            t, h, w = grids[kind].pop(0)
            h, w = h // merge, w // merge
            for tt in range(t):
                for y in range(h):
                    for x in range(w):
                        out[:, b, i] = torch.tensor([cur + tt, cur + y, cur + x])
                        top = max(top, cur + tt, cur + y, cur + x)
                        i += 1
            cur += max(h, w)
        nxt.append(top + 1)
    return out, nxt


@settings(max_examples=60, deadline=None)
@given(
    case=multimodal_batches(),
    spoil=st.sampled_from(
        [None] * 5
        + [
            "odd_grid",
            "float_grid",
            "nan_seconds",
            "neg_seconds",
            "huge_tps",
            "tps_str",
            "types_3",
            "types_float",
            "mask_shape",
            "merge_0",
            "extra_grid",
            "grid_list",
        ]
    ),
)
def test_multimodal_positions_are_right_or_a_named_error(case, spoil):
    types, mask, images, videos, merge = case
    kwargs = dict(
        image_grid_thw=torch.tensor(images, dtype=torch.int64).reshape(-1, 3) if images else None,
        video_grid_thw=torch.tensor(videos, dtype=torch.int64).reshape(-1, 3) if videos else None,
        spatial_merge_size=merge,
        attention_mask=mask,
    )
    if spoil == "odd_grid" and images and merge == 2:
        kwargs["image_grid_thw"] = kwargs["image_grid_thw"] + torch.tensor([0, 1, 0])  # h not a multiple of the merge
    elif spoil == "float_grid" and images:
        kwargs["image_grid_thw"] = kwargs["image_grid_thw"].float()
    elif spoil == "nan_seconds" and videos:
        kwargs.update(tokens_per_second=2.0, second_per_grid_ts=[math.nan] * len(videos))
    elif spoil == "neg_seconds" and videos:
        kwargs.update(tokens_per_second=2.0, second_per_grid_ts=[-1.0] * len(videos))
    elif spoil == "huge_tps" and videos:
        kwargs.update(tokens_per_second=1e300)
    elif spoil == "tps_str":
        kwargs.update(tokens_per_second="2")
    elif spoil == "types_3" and types.numel():
        types = types.clone()
        types[0, 0] = 3
    elif spoil == "types_float":
        types = types.float()
    elif spoil == "mask_shape":
        kwargs["attention_mask"] = mask[:, :-1]
    elif spoil == "merge_0":
        kwargs["spatial_merge_size"] = 0
    elif spoil == "extra_grid":
        kwargs["image_grid_thw"] = torch.tensor([*images, [1, merge, merge]]).reshape(-1, 3)
    elif spoil == "grid_list":
        kwargs["image_grid_thw"] = images
    # decided up front: the spoils that leave the input as documented (no image or video to spoil, a video of
    # one frame whose timing cannot overflow, an empty mask cut shorter) are valid and must not be refused;
    # image_grid_thw is a tensor [N, 3] or None: a list (even an empty one) is not
    spoiled = spoil is not None and (
        (spoil == "odd_grid" and images and merge == 2)
        or spoil == "float_grid"
        and images
        or spoil == "grid_list"
        or spoil in ("nan_seconds", "neg_seconds")
        and videos
        or spoil == "huge_tps"
        and any(t > 1 for t, _, _ in videos)
        or spoil == "types_3"
        and types.numel()
        or spoil in ("tps_str", "types_float", "mask_shape", "merge_0", "extra_grid")
        and (spoil != "mask_shape" or types.shape[1] > 0)
    )
    mp = expect(not spoiled, multimodal_positions, types, **kwargs)
    if spoiled:
        return
    # a valid draw with tokens_per_second has only videos of one temporal step: their τ(0) = 0 whatever the rate, and
    # images are not time-aligned (docs/variants.md), so the grid rule below holds (longer videos: against
    # transformers in test_multimodal_positions.py)
    assert kwargs.get("tokens_per_second") is None or all(t == 1 for t, _, _ in videos)
    want, nxt = _expected_positions(types, mask, images, videos, merge)
    assert torch.equal(mp.position_ids, want)
    assert mp.next_position.tolist() == nxt and mp.bound == max(nxt)
    assert mp.rope_deltas[:, 0].tolist() == [n - int(m.sum()) for n, m in zip(nxt, mask)]
    cont = mp.continuation(2)
    assert cont.position_ids[:, :, 0].tolist() == [nxt] * 3
    # the ids drive MRoPE: its tables equal those of the [3, B, S] ids given directly
    rope = MRoPE(16, mrope_section=[2, 3, 3])
    assert torch.equal(rope.tables(mp).cos, rope.tables(mp.position_ids).cos)
