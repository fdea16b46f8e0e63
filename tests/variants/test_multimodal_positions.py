"""multimodal_positions for every vision-language family it has rules for (rotary.variants.FAMILIES), equal to the
model's own ``get_rope_index`` (a tiny multimodal model built from its config class, random weights,
nothing downloaded) on random batches of text, several images and videos (one run per frame with
timestamp text between frames where the model splits them), left padded."""

from __future__ import annotations

import dataclasses
import importlib
import random
import warnings

import pytest
import torch

from rotary.errors import InputError
from rotary.hf import MROPE_MODELS
from rotary.variants import FAMILIES, multimodal_positions

transformers = pytest.importorskip("transformers")
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, model_type_to_module_name  # noqa: E402

TEXT = dict(
    hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    head_dim=32, vocab_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, pad_token_id=0,
)  # fmt: skip
VISION = dict(
    depth=1, num_hidden_layers=1, hidden_size=16, embed_dim=16, out_hidden_size=64, intermediate_size=16, num_heads=2,
    num_attention_heads=2, patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0],
    fullatt_block_indexes=[0], spatial_merge_size=2,
    max_image_size=32,  # HunYuan-VL's: a position embedding per patch of it (2048 / 2 squared: 17M weights)
)  # fmt: skip

#: sections that fit head_dim 32, per slot layout of the text model (rotary.hf.MROPE_MODELS)
SECTIONS = {"chunked": [4, 6, 6], "interleaved": [8, 4, 4], "paired_hw": [6, 6, 4]}
TEXT_EXTRA = {
    "ernie4_5_vl_moe": {"moe_intermediate_size": [32, 32]},
    "hunyuan_vl": {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 4, 4, 4]}},
}


def sub_config(cls, sizes: dict, extra: dict):
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in sizes.items() if k in fields}
    kwargs.update(extra)
    return kwargs


def tiny_model(model_type: str):
    """The multimodal base model of ``model_type`` (the class that owns ``get_rope_index``), tiny."""
    cls = CONFIG_MAPPING[model_type]
    subs = cls.sub_configs
    text_extra = dict(TEXT_EXTRA.get(model_type, {}))
    if "rope_parameters" not in text_extra:
        layout = MROPE_MODELS[subs["text_config"].model_type][1]
        text_extra["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": SECTIONS[layout]}
        if model_type.startswith("qwen3_5"):
            text_extra["rope_parameters"]["partial_rotary_factor"] = 1.0
    text = sub_config(subs["text_config"], TEXT, text_extra)
    vision = sub_config(subs["vision_config"], VISION, {})
    name = model_type_to_module_name(model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = cls(text_config=text, vision_config=vision)
        for model_cls in vars(module).values():
            if (
                isinstance(model_cls, type)
                and issubclass(model_cls, transformers.PreTrainedModel)
                and "get_rope_index" in model_cls.__dict__
            ):
                return model_cls(config).eval()
    raise AssertionError(f"no class of {model_type} defines get_rope_index")


def random_batch(rng: random.Random, batch: int, *, frames_apart: bool = False, frames_per_step: int = 1):
    """Token types of text, images (1, h, w) and videos (t, h, w) with merge size 2, left padded; grids in order."""
    rows, images, videos = [], [], []
    for b in range(batch):
        types: list[int] = []
        forced = [[1, 2, 1], [2, 1]][b] if b < 2 else []  # at least three images and two videos per batch
        for i in range(max(len(forced), rng.randint(1, 4))):
            types += [0] * rng.randint(1, 3)
            kind = forced[i] if i < len(forced) else rng.choice([0, 1, 1, 2])
            if kind == 1:
                h, w = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
                images.append([1, h, w])
                types += [1] * (h * w // 4)
            elif kind == 2:
                steps, h, w = rng.randint(1, 3), 2 * rng.randint(1, 2), 2 * rng.randint(1, 3)
                videos.append([steps * frames_per_step, h, w])
                if frames_apart:  # a timestamp (text) before every frame
                    types += ([0] + [2] * (h * w // 4)) * steps
                else:
                    types += [2] * (steps * h * w // 4)
        rows.append(types + [0] * rng.randint(0, 2))
    return pad(rows), (torch.tensor(images) if images else None), (torch.tensor(videos) if videos else None)


def pad(rows: list[list[int]]):
    longest = max(len(r) for r in rows)
    types = torch.tensor([[0] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    return types, mask


#: model_type -> keywords of random_batch that give its processor's layout
LAYOUTS = {
    "qwen2_vl": {},
    "paddleocr_vl": {},
    "ernie4_5_vl_moe": {"frames_per_step": 2},
    **{t: {"frames_apart": True}
       for t in "qwen3_vl qwen3_vl_moe qwen3_5 qwen3_5_moe glm4v glm4v_moe glm_ocr cosmos3_edge".split()},
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(3))
def test_positions_equal_the_models_get_rope_index(model_type, seed):
    model = tiny_model(model_type)
    (types, mask), images, videos = random_batch(random.Random(1000 * seed + len(model_type)), 3, **LAYOUTS[model_type])
    ids = torch.randint(1, 64, types.shape)
    want_ids, want_deltas = model.get_rope_index(
        ids,
        types,
        image_grid_thw=images,
        video_grid_thw=None if videos is None else videos.clone(),
        attention_mask=mask,
    )
    for how in ({"config": model.config}, {"model_type": model_type}):
        got = multimodal_positions(types, image_grid_thw=images, video_grid_thw=videos, attention_mask=mask, **how)
        assert torch.equal(got.position_ids, want_ids), how
        assert torch.equal(got.rope_deltas, want_deltas), how


@pytest.mark.parametrize("model_type", sorted(LAYOUTS))
def test_continuation_equals_the_models_decode_positions(model_type):
    model = tiny_model(model_type)
    (types, _), images, videos = random_batch(random.Random(7), 1, **LAYOUTS[model_type])
    ids = torch.randint(1, 64, types.shape)
    embeds = torch.zeros(1, types.shape[1], 64)
    model.compute_3d_position_ids(
        ids,
        embeds,
        image_grid_thw=images,
        video_grid_thw=None if videos is None else videos.clone(),
        mm_token_type_ids=types,
    )

    class Past:
        def get_seq_length(self, layer_idx=0):
            return types.shape[1]

    step = model.compute_3d_position_ids(None, embeds[:, :3], past_key_values=Past())  # three new tokens
    prompt = multimodal_positions(types, image_grid_thw=images, video_grid_thw=videos, model_type=model_type)
    assert torch.equal(prompt.continuation(3).position_ids, step)


def test_qwen2_5_vl_takes_tokens_per_second_from_its_config():
    model = tiny_model("qwen2_5_vl")
    assert model.config.vision_config.tokens_per_second not in (None, 1)
    (types, mask), images, videos = random_batch(random.Random(5), 3)
    seconds = torch.tensor([0.5, 2.0, 1.0, 0.7, 1.5, 3.0])[: videos.shape[0]]
    ids = torch.randint(1, 64, types.shape)
    want_ids, want_deltas = model.get_rope_index(
        ids, types, image_grid_thw=images, video_grid_thw=videos, second_per_grid_ts=seconds, attention_mask=mask
    )
    got = multimodal_positions(
        types,
        image_grid_thw=images,
        video_grid_thw=videos,
        attention_mask=mask,
        second_per_grid_ts=seconds,
        config=model.config,
    )
    assert torch.equal(got.position_ids, want_ids) and torch.equal(got.rope_deltas, want_deltas)


def test_every_family_with_rules_is_checked():
    assert set(FAMILIES) - {"qwen2_5_vl", "hunyuan_vl", "qwen2_5_omni", "qwen3_omni_moe"} == set(LAYOUTS)  # below


def test_ernie_videos_merge_two_frames_per_temporal_step():
    types = torch.tensor([[0] + [2] * 4 + [0]])  # 4 frames of 2 x 2 merged tokens -> 2 temporal steps of 1 x 2
    got = multimodal_positions(types, video_grid_thw=torch.tensor([[4, 2, 4]]), model_type="ernie4_5_vl_moe")
    assert got.position_ids[:, 0].tolist() == [[0, 1, 1, 2, 2, 3], [0, 1, 1, 1, 1, 3], [0, 1, 2, 1, 2, 3]]


# ------------------------------------------------------------------------------------------------
# HunYuan-VL (XD-RoPE)


def hunyuan_batch(rng: random.Random, batch: int):
    rows, images = [], []
    for _ in range(batch):
        types: list[int] = []
        for _ in range(rng.randint(1, 3)):
            types += [0] * rng.randint(1, 3)
            if rng.random() < 0.7:
                h, w = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
                images.append([1, h, w])
                types += [1] * ((h // 2) * (w // 2 + 1) + rng.choice([0, 2]))  # with or without begin/end tokens
        rows.append(types + [0] * rng.randint(0, 2))
    return pad(rows), (torch.tensor(images) if images else None)


@pytest.mark.parametrize("axes", [4, 3])
@pytest.mark.parametrize("seed", range(3))
def test_hunyuan_vl_positions_equal_get_rope_index(axes, seed):
    section = [4, 4, 4, 4] if axes == 4 else [6, 5, 5]
    TEXT_EXTRA["hunyuan_vl"] = {
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": section}
    }
    try:
        model = tiny_model("hunyuan_vl")
    finally:
        TEXT_EXTRA["hunyuan_vl"] = {
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4] * 4}
        }
    (types, mask), images = hunyuan_batch(random.Random(seed), 3)
    ids = torch.randint(1, 64, types.shape)
    want_ids, want_deltas = model.get_rope_index(ids, types, image_grid_thw=images, attention_mask=mask)
    got = multimodal_positions(types, image_grid_thw=images, attention_mask=mask, config=model.config)
    assert got.position_ids.shape[0] == axes
    assert torch.equal(got.position_ids, want_ids) and torch.equal(got.rope_deltas, want_deltas)
    # decoding: HunYuanVLForConditionalGeneration gives the next tokens (cache length + step + rope_deltas) on
    # every axis
    steps = mask.sum(-1, keepdim=True) + torch.arange(2) + want_deltas
    assert torch.equal(got.continuation(2).position_ids, steps.expand(axes, -1, -1))


# ------------------------------------------------------------------------------------------------
# errors


def test_unknown_and_unbuilt_model_types_are_named():
    types = torch.zeros(1, 3, dtype=torch.int64)
    with pytest.raises(InputError, match=r"no rules for model_type 'llava'.*builds .*glm4v.*hunyuan_vl"):
        multimodal_positions(types, model_type="llava")
    with pytest.raises(InputError, match=r"does not build the positions of model_type 'glm_image': GLM-Image"):
        multimodal_positions(types, model_type="glm_image")
    with pytest.raises(InputError, match=r"3, audio, only for the Omni models"):
        multimodal_positions(torch.tensor([[0, 3]]), model_type="qwen3_5")
    with pytest.raises(InputError, match=r"split_video_frames=False contradicts .*'frames'"):
        multimodal_positions(types, model_type="qwen3_5", split_video_frames=False)


def test_hunyuan_runs_that_do_not_fit_their_grid():
    with pytest.raises(InputError, match=r"\(h/2\) \* \(w/2 \+ 1\) = 6 tokens, or 8 with the begin and end"):
        multimodal_positions(
            torch.tensor([[0] + [1] * 4]), image_grid_thw=torch.tensor([[1, 4, 4]]), model_type="hunyuan_vl"
        )
    with pytest.raises(InputError, match="images only"):
        multimodal_positions(torch.tensor([[0, 2]]), model_type="hunyuan_vl")


# ------------------------------------------------------------------------------------------------
# Qwen2.5-Omni and Qwen3-Omni (the thinker reads the prompt: text, images, videos, audio)

VS, VE, AS, AE, IMG, VID, AUD = 151652, 151653, 151647, 151648, 151655, 151656, 151646
AUDIO = dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16, output_dim=64,
             num_mel_bins=16, downsample_hidden_size=8)  # fmt: skip


def tiny_thinker(model_type: str):
    name = {"qwen3_omni_moe": "Qwen3OmniMoe", "qwen2_5_omni": "Qwen2_5Omni"}[model_type]
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    cls = getattr(
        importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}"), f"{name}ThinkerConfig"
    )
    subs = cls.sub_configs
    section = [8, 4, 4] if model_type == "qwen3_omni_moe" else [4, 6, 6]
    text = sub_config(
        subs["text_config"],
        TEXT,
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": section}},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = cls(
            text_config=text,
            vision_config=sub_config(subs["vision_config"], VISION, {}),
            audio_config=sub_config(subs["audio_config"], AUDIO, {}),
            vision_start_token_id=VS,
            vision_end_token_id=VE,
            audio_end_token_id=AE,
        )
        return getattr(module, f"{name}ThinkerModel")(config).eval(), module


def audio_tokens(model_type: str, module, seqlen: int, n_window: int) -> int:
    if model_type == "qwen3_omni_moe":
        return int(module._get_feat_extract_output_lengths(torch.tensor(seqlen), n_window))
    return ((seqlen - 1) // 2 + 1 - 2) // 2 + 1


def omni_batch(rng: random.Random, model_type: str, model, module, n_window: int, *, audio_in_video: bool):
    """input_ids of text, images, videos and audio (and, for audio_in_video, videos with their audio
    interleaved by time as the processor lays them out); the grids, seconds and audio lengths in order."""
    pps, rows, images, videos, seconds, seqlens = 25, [], [], [], [], []
    choices = [1.0, 2.0, 4.0] if model_type == "qwen3_omni_moe" else [0.5, 1.0, 2.0, 0.7]
    for b in range(3):
        ids: list[int] = []
        forced = [[1, 2, 3], [2, 1]][b] if b < 2 else []
        for i in range(max(len(forced), rng.randint(1, 3))):
            ids += [rng.randint(1, 100) for _ in range(rng.randint(1, 3))]
            kind = forced[i] if i < len(forced) else rng.choice([1, 2, 3])
            if kind == 2 and audio_in_video:  # use_audio_in_video: every video comes with its audio
                kind = 4
            if kind == 1:
                h, w = 2 * rng.randint(1, 3), 2 * rng.randint(1, 3)
                images.append([1, h, w])
                ids += [VS] + [IMG] * (h * w // 4) + [VE]
            elif kind == 3:
                seqlens.append(rng.randint(20, 200))
                ids += [AS] + [AUD] * audio_tokens(model_type, module, seqlens[-1], n_window) + [AE]
            else:
                t, h, w = rng.randint(1, 3), 2 * rng.randint(1, 2), 2 * rng.randint(1, 2)
                videos.append([t, h, w])
                seconds.append(rng.choice(choices))
                if kind == 2:
                    ids += [VS] + [VID] * (t * h * w // 4) + [VE]
                    continue
                seqlens.append(rng.randint(20, 200))
                n_audio = audio_tokens(model_type, module, seqlens[-1], n_window)
                if model_type == "qwen3_omni_moe":  # by time: a frame's tokens before the audio of a later time
                    frame_times = [int(j * seconds[-1] * pps) for j in range(t) for _ in range(h * w // 4)]
                    block, a = [], 0
                    for time in frame_times:
                        while a < n_audio and a < time:
                            block.append(AUD)
                            a += 1
                        block.append(VID)
                    block += [AUD] * (n_audio - a)
                else:  # Qwen2.5-Omni: chunks of seconds_per_chunk, video chunk j then audio chunk j
                    times = (torch.arange(t) * torch.tensor(seconds[-1]) * pps).long().repeat_interleave(h * w // 4)
                    per_chunk = int(pps * 2)  # seconds_per_chunk = 2
                    v_chunks = model.get_chunked_index(times, per_chunk, 0)
                    a_chunks = model.get_chunked_index(torch.arange(n_audio), per_chunk, 0)
                    block = []
                    for j in range(max(len(v_chunks), len(a_chunks))):
                        block += [VID] * (v_chunks[j][1] - v_chunks[j][0] if j < len(v_chunks) else 0)
                        block += [AUD] * (a_chunks[j][1] - a_chunks[j][0] if j < len(a_chunks) else 0)
                ids += [VS, AS] + block + [AE, VE]
        rows.append(ids + [rng.randint(1, 100) for _ in range(rng.randint(0, 2))])
    longest = max(len(r) for r in rows)
    input_ids = torch.tensor([[0] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    grid = lambda g: torch.tensor(g) if g else None  # noqa: E731
    return input_ids, mask, grid(images), grid(videos), torch.tensor(seconds), torch.tensor(seqlens)


@pytest.mark.parametrize(
    "model_type,audio_in_video",
    [("qwen3_omni_moe", False), ("qwen3_omni_moe", True), ("qwen2_5_omni", False), ("qwen2_5_omni", True)],
)
@pytest.mark.parametrize("seed", range(8))
def test_omni_positions_equal_the_thinkers_get_rope_index(model_type, audio_in_video, seed):
    model, module = tiny_thinker(model_type)
    ids, mask, images, videos, seconds, seqlens = omni_batch(
        random.Random(seed),
        model_type,
        model,
        module,
        model.config.audio_config.n_window,
        audio_in_video=audio_in_video,
    )
    want_ids, want_deltas = model.get_rope_index(
        ids,
        image_grid_thw=images,
        video_grid_thw=videos,
        attention_mask=mask,
        use_audio_in_video=audio_in_video,
        audio_seqlens=seqlens,
        second_per_grids=seconds,
    )
    types = (ids == IMG).long() + 2 * (ids == VID).long() + 3 * (ids == AUD).long()
    assert (types == 3).any() and (types == 2).any() and (types == 1).any()
    got = multimodal_positions(
        types,
        image_grid_thw=images,
        video_grid_thw=videos,
        attention_mask=mask,
        second_per_grid_ts=seconds,
        config=model.config,
    )
    kept = mask.bool()  # Qwen2.5-Omni writes 1 on padding, Qwen3-Omni 0; no token reads it
    assert torch.equal(want_ids, want_ids.round()) and torch.equal(got.position_ids[:, kept], want_ids[:, kept].long())
    assert torch.equal(got.rope_deltas, want_deltas.long()) and bool((got.position_ids[:, ~kept] == 0).all())


def test_qwen3_omni_fractional_temporal_ids_are_refused():
    types = torch.tensor([[0, 2, 2, 0]])  # a video of 2 temporal steps of one merged token each
    with pytest.raises(InputError, match=r"fractional \(\[0.0, 12.5\]"):
        multimodal_positions(
            types, video_grid_thw=torch.tensor([[2, 2, 2]]), second_per_grid_ts=[0.5], model_type="qwen3_omni_moe"
        )
    got = multimodal_positions(
        types, video_grid_thw=torch.tensor([[2, 2, 2]]), second_per_grid_ts=[0.5], model_type="qwen2_5_omni"
    )
    assert got.position_ids[0, 0].tolist() == [0, 1, 13, 14]  # Qwen2.5-Omni truncates 12.5 to 12
