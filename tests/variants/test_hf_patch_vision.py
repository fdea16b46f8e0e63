"""rotary.hf.patch on the vision towers with 2-D RoPE (Pixtral, Llama 4) and on Llama 4's text model:
random-weight models from small configs give the unpatched outputs, q and k go through rotary, and
each replacement returns transformers' q/k channel for channel on random inputs."""

from __future__ import annotations

import pytest
import torch

from rotary import positions as P
from rotary.hf import patching as hf

transformers = pytest.importorskip("transformers")
from transformers.models.llama4 import modeling_llama4 as ml  # noqa: E402
from transformers.models.pixtral import modeling_pixtral as mp  # noqa: E402

VISION = {"pixtral", "llama4", "llama4_text", "llama4_vision_model"}


@pytest.fixture
def rotary_calls(monkeypatch):
    """The shapes the patched models hand to rotary's ``rotate`` (every replacement calls it), or to a plan
    recorded by an earlier call with the same signature (``rotary.rotation.run_plan``)."""
    import rotary.rotation

    calls = []
    real, real_plan = hf.rotate, rotary.rotation.run_plan
    inside = []  # a plan run by rotate itself is that rotate call, counted once

    def counting(xs, *args, **kwargs):
        calls.append([tuple(x.shape) for x in xs])
        inside.append(1)
        try:
            return real(xs, *args, **kwargs)
        finally:
            inside.pop()

    def counting_plan(plan, xs, *args):
        outs = real_plan(plan, xs, *args)
        if outs and not inside:
            calls.append([tuple(x.shape) for x in xs])
        return outs

    monkeypatch.setattr(hf, "rotate", counting)
    monkeypatch.setattr(rotary.rotation, "run_plan", counting_plan)
    return calls


def pixtral():
    torch.manual_seed(0)
    config = transformers.PixtralVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=16
    )
    return transformers.PixtralVisionModel(config).eval()


def llama4_vision():
    torch.manual_seed(0)
    config = transformers.Llama4VisionConfig(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=56,
        patch_size=14,
        vision_output_dim=64,
        projector_input_dim=64,
        projector_output_dim=64,
    )
    return transformers.Llama4VisionModel(config).eval()


def llama4_text():
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
    )
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def test_supported_model_types():
    assert VISION <= set(hf.SUPPORTED)
    assert pixtral().config.model_type == "pixtral"
    assert llama4_vision().config.model_type == "llama4_vision_model"
    assert llama4_text().config.model_type == "llama4_text"


@pytest.mark.parametrize(
    "build, call, rotated",
    [
        # Pixtral: one 3 x 4 grid of patches (an image 48 x 64), q and k [1, 4 heads, 12, 16]
        (
            pixtral,
            lambda m: m(torch.randn(1, 3, 48, 64), image_sizes=torch.tensor([[48, 64]])).last_hidden_state,
            [(1, 4, 12, 16)] * 2,
        ),
        # Llama 4 vision: 4 x 4 patches and the class token, q and k [2, 17, 4 heads, 16]
        (llama4_vision, lambda m: m(torch.randn(2, 3, 56, 56)).last_hidden_state, [(2, 17, 4, 16)] * 2),
    ],
    ids=["pixtral", "llama4_vision"],
)
def test_vision_tower_outputs_equal_unpatched(build, call, rotated, rotary_calls):
    model = build()
    with torch.no_grad():
        torch.manual_seed(1)
        before = call(model)
        hf.patch(model)
        assert len([m for m in model.modules() if hf._MARK in m.__dict__]) == 2  # one attention per layer
        torch.manual_seed(1)
        patched = call(model)
        assert rotary_calls == [rotated] * 2  # q and k of both layers went through rotary
        hf.unpatch(model)
        torch.manual_seed(1)
        after = call(model)
    torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-6)
    assert after.equal(before) and len(rotary_calls) == 2


def test_llama4_text_logits_and_generation_unchanged(rotary_calls):
    model = llama4_text()
    ids = torch.randint(64, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
        expected = model.generate(ids[:, :5], max_new_tokens=6, do_sample=False, pad_token_id=0)
        hf.patch(model)
        patched = model(ids).logits
        assert rotary_calls == [[(2, 11, 4, 8), (2, 11, 2, 8)]] * 2  # q [B, S, H, D] and k (2 KV heads), 2 layers
        assert model.generate(ids[:, :5], max_new_tokens=6, do_sample=False, pad_token_id=0).equal(expected)
    torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-6)


def test_replacements_equal_transformers_functions(gen):
    """Each replacement against the transformers function it stands in for, on random q/k: Pixtral's
    tables from its rotary embedding, Llama 4's text table not unit-norm (it multiplies the table by
    an attention scaling)."""
    q, k = torch.randn(2, 4, 12, 16, generator=gen), torch.randn(2, 4, 12, 16, generator=gen)
    config = transformers.PixtralVisionConfig(hidden_size=64, num_attention_heads=4, image_size=64, patch_size=16)
    cos, sin = mp.PixtralVisionRotaryEmbedding(config)(torch.zeros(1), P.grid(3, 4).ids)  # a 3 x 4 grid's [12, 16]
    want = mp.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)
    got = hf.SUPPORTED["pixtral"].replacements["apply_rotary_pos_emb"](q, k, cos, sin, unsqueeze_dim=0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)

    family = hf.SUPPORTED["llama4"].replacements
    q, k = torch.randn(2, 17, 4, 16, generator=gen), torch.randn(2, 17, 2, 16, generator=gen)
    freqs = torch.polar(torch.rand(2, 17, 8, generator=gen) + 0.5, torch.randn(2, 17, 8, generator=gen))
    for a, b in zip(family["apply_rotary_emb"](q, k, freqs), ml.apply_rotary_emb(q, k, freqs)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    k = torch.randn(2, 17, 4, 16, generator=gen)
    freqs_ci = torch.polar(torch.ones(17, 1, 8), torch.randn(17, 1, 8, generator=gen))  # [S, 1, D/2], the model's
    got = family["vision_apply_rotary_emb"](q, k, freqs_ci)
    for a, b in zip(got, ml.vision_apply_rotary_emb(q, k, freqs_ci)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(got[0], q, atol=1e-3)  # rotated, not handed back


def test_llama4_with_an_image_patches_both_towers(rotary_calls):
    """Llama4ForConditionalGeneration (model_type llama4): the vision attention and the text attention."""
    torch.manual_seed(0)
    vision = dict(
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        image_size=56,
        patch_size=14,
        vision_output_dim=32,
        projector_input_dim=32,
        projector_output_dim=32,
    )
    text = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
    )
    config = transformers.Llama4Config(
        vision_config=vision, text_config=text, image_token_index=63, boi_token_index=61, eoi_token_index=62
    )
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    assert model.config.model_type == "llama4"
    ids = torch.randint(60, (1, 9), generator=torch.Generator().manual_seed(3))
    ids[0, 2:6] = 63  # the image's 4 tokens (16 patches after the pixel shuffle)
    pixels = torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = model(input_ids=ids, pixel_values=pixels).logits
        hf.patch(model)
        assert len([m for m in model.modules() if hf._MARK in m.__dict__]) == 3  # 1 vision layer, 2 text layers
        patched = model(input_ids=ids, pixel_values=pixels).logits
    # the vision tower's q and k (16 patches and the class token), then each text layer's
    assert rotary_calls == [[(1, 17, 4, 16)] * 2] + [[(1, 9, 4, 8), (1, 9, 2, 8)]] * 2
    torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-6)


def test_qwen2_5_vl_with_images_and_a_video_patches_both_towers(rotary_calls):
    """Qwen2_5_VLForConditionalGeneration: the vision blocks (apply_rotary_pos_emb_vision, windowed and
    full attention) and the text attention (M-RoPE) both run through rotary; logits equal unpatched."""
    torch.manual_seed(0)
    vision = dict(
        depth=2,
        hidden_size=32,
        out_hidden_size=32,
        intermediate_size=32,
        num_heads=2,
        patch_size=2,
        window_size=8,
        fullatt_block_indexes=[1],
    )
    text = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
    )
    config = transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=60, video_token_id=61, vision_start_token_id=62
    )
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    images, video = torch.tensor([[1, 4, 6], [1, 6, 2]]), torch.tensor([[2, 4, 4]])  # (t, h, w) in patches
    tokens = [int(g.prod()) // 4 for g in (*images, *video)]  # 2 x 2 patches merge into one token
    ids = [5, 62, *[60] * tokens[0], 7, 62, *[60] * tokens[1], 62, *[61] * tokens[2], 9, 10]
    ids = torch.tensor([ids])
    gen = torch.Generator().manual_seed(5)
    patch_dim = 3 * 2 * 2 * 2  # channels x temporal_patch_size x patch_size^2
    pixels = torch.randn(int(images.prod(-1).sum()), patch_dim, generator=gen)
    frames = torch.randn(int(video.prod(-1).sum()), patch_dim, generator=gen)
    kwargs = dict(
        input_ids=ids, pixel_values=pixels, image_grid_thw=images, pixel_values_videos=frames, video_grid_thw=video
    )
    with torch.no_grad():
        before = model(**kwargs).logits
        hf.patch(model)
        assert len([m for m in model.modules() if hf._MARK in m.__dict__]) == 4  # 2 vision blocks, 2 text layers
        patched = model(**kwargs).logits
        hf.unpatch(model)
        after = model(**kwargs).logits
    n_image, n_video = int(images.prod(-1).sum()), int(video.prod(-1).sum())
    vision_calls = [[(1, n, 2, 16)] * 2 for n in (n_image, n_image, n_video, n_video)]  # per tower call, 2 blocks
    text_calls = [[(1, 2, ids.shape[1], 16), (1, 1, ids.shape[1], 16)]] * 2
    assert sorted(map(str, rotary_calls)) == sorted(map(str, vision_calls + text_calls))
    torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-5)
    assert after.equal(before)
