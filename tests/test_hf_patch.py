"""rotary.hf.patch / unpatch on random-weight transformers models built from small configs."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rotary
from helpers import NAMED, assert_named
from rotary.hf import patching as hf
from rotary.hf.encoder_tables import SEQUENCE_ROPE
from strategies import FAST

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


#: Gemma-3: a sliding layer (default RoPE, base 10000) and a full layer (linear factor 8, base 1e6)
GEMMA3_LAYERS = dict(
    layer_types=["sliding_attention", "full_attention"],
    sliding_window=4,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    },
)
MOE = dict(num_experts_per_tok=2)
DEEPSEEK = dict(
    num_key_value_heads=4,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    kv_lora_rank=16,
    q_lora_rank=16,
    n_routed_experts=4,
    moe_intermediate_size=32,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    **MOE,
)


def make_config(model_type: str, **kw):
    builders = {
        "llama": lambda: transformers.LlamaConfig(num_key_value_heads=2, **COMMON),
        "mistral": lambda: transformers.MistralConfig(num_key_value_heads=2, **COMMON),
        "mixtral": lambda: transformers.MixtralConfig(num_key_value_heads=2, num_local_experts=4, **MOE, **COMMON),
        "qwen2": lambda: transformers.Qwen2Config(num_key_value_heads=2, **COMMON),
        "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=2, head_dim=8, **COMMON),
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
            num_key_value_heads=2, head_dim=8, num_experts=4, moe_intermediate_size=32, **MOE, **COMMON
        ),
        # partial rotation: half of Phi-3's head, a quarter of GPT-NeoX's, 4 of 8 channels for GPT-J
        "phi3": lambda: transformers.Phi3Config(
            num_key_value_heads=2, partial_rotary_factor=0.5, pad_token_id=0, **COMMON
        ),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(
            num_key_value_heads=2, head_dim=8, **GEMMA3_LAYERS, **COMMON
        ),
        "gemma3": lambda: transformers.Gemma3Config(
            text_config=dict(num_key_value_heads=2, head_dim=8, **GEMMA3_LAYERS, **{**COMMON, "vocab_size": 300}),
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            mm_tokens_per_image=4,
            boi_token_index=297,
            eoi_token_index=298,
            image_token_index=299,
        ),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(rotary_pct=0.25, **COMMON),
        # gpt-oss's defaults: yarn (factor 32 over 4096, truncate false), sliding and full layers
        "gpt_oss": lambda: transformers.GptOssConfig(
            num_key_value_heads=2, head_dim=8, num_local_experts=4, sliding_window=4, **MOE, **COMMON
        ),
        "deepseek_v3": lambda: transformers.DeepseekV3Config(rope_interleave=True, **DEEPSEEK, **COMMON),
        "gptj": lambda: transformers.GPTJConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4),
        "cohere": lambda: transformers.CohereConfig(num_key_value_heads=2, **COMMON),
        "glm": lambda: transformers.GlmConfig(
            num_key_value_heads=2, head_dim=8, pad_token_id=0, eos_token_id=1, **COMMON
        ),
    }
    config = builders[model_type]()
    for key, value in kw.items():
        setattr(config, key, value)
    return config


def make_model(model_type: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    if model_type == "gemma3":  # the multimodal model; called with text only here
        return transformers.Gemma3ForConditionalGeneration(make_config(model_type, **kw)).eval()
    return transformers.AutoModelForCausalLM.from_config(make_config(model_type, **kw)).eval()


def attention_modules(model):
    return [m for m in model.modules() if hf._MARK in m.__dict__]


#: the vision-language families (multimodal RoPE): tested with images in tests/variants/test_mrope.py (Qwen-VL)
#: and with per-axis positions in tests/variants/test_mrope_families.py (the others)
MULTIMODAL = {
    f"{name}{suffix}"
    for name in (
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_vl_moe",
        "qwen3_5",
        "qwen3_5_moe",
        "paddleocr_vl",
        "glm4v",
        "glm4v_moe",
        "glm_image",
        "glm_ocr",
        "cosmos3_edge",
        "ernie4_5_vl_moe",
    )
    for suffix in ("", "_text")
} | {
    "qwen2_5_omni_thinker",
    "qwen2_5_omni_text",
    "qwen2_5_omni_talker",
    "qwen3_omni_moe_thinker",
    "qwen3_omni_moe_text",
}
#: the text families of the 2026 model types: tested in tests/test_hf_patch_text.py
from test_hf_patch_text import NEW_TEXT  # noqa: E402

#: vision towers with 2-D RoPE and Llama 4 (text and vision): tested in tests/variants/test_hf_patch_vision.py;
#: DINOv3, EoMT, SAM 3 and the towers (and VL models) patched through apply_rotary_pos_emb_vision: in
#: tests/hf/test_vision_encoders.py
VISION = {
    "pixtral",
    "llama4",
    "llama4_text",
    "llama4_vision_model",
    "dinov3_vit",
    "eomt_dinov3",
    "sam3_vit_model",
    "gemma4_vision",
    "sapiens2",  # DINOv3's apply; EfficientLoFTR's and LightGlue's Cohere-style apply (tests/hf/)
    "efficientloftr",
    "lightglue",
} | {t for t, family in hf.SUPPORTED.items() if "apply_rotary_pos_emb_vision" in family.replacements}
#: the sequence encoders (audio, codecs, time series): tests/hf/test_encoders.py
ENCODERS = set(SEQUENCE_ROPE) & set(hf.SUPPORTED)


def test_supported_list_is_the_issue_list():
    text = {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "phi3",
        "gemma3",
        "gemma3_text",
        "gpt_neox",
        "gpt_oss",
        "deepseek_v3",
        "gptj",
        "cohere",
        "glm",
    }
    assert set(hf.SUPPORTED) == text | MULTIMODAL | VISION | set(NEW_TEXT) | ENCODERS


@pytest.mark.parametrize("model_type", sorted(set(hf.SUPPORTED) - MULTIMODAL - VISION - set(NEW_TEXT) - ENCODERS))
def test_patched_logits_equal_unpatched_and_unpatch_restores(model_type, rotate_calls):
    model = make_model(model_type)
    ids = torch.randint(64, (2, 11))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        before = model(ids, attention_mask=mask).logits
        hf.patch(model)
        assert hf.is_patched(model)
        assert len(attention_modules(model)) == 2  # one attention per layer
        patched = model(ids, attention_mask=mask).logits
        assert len(rotate_calls) == 4  # q and k in 2 layers went through rotary
        hf.unpatch(model)
        after = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-6)
    assert len(rotate_calls) == 4  # unpatched: rotary no longer called
    assert after.equal(before)
    assert not hf.is_patched(model)
    for m in model.modules():
        assert "forward" not in m.__dict__  # the class method is back, nothing left on instances


@pytest.mark.parametrize(
    "model_type", ["llama", "gpt_neox", "gptj", "glm", "gemma3_text", "gpt_oss", "deepseek_v3", "qwen3", "qwen3_moe"]
)
def test_generation_with_kv_cache_unchanged(model_type):
    model = make_model(model_type, seed=1)
    ids = torch.randint(64, (2, 6))
    expected = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    hf.patch(model)
    assert model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0).equal(expected)


def test_deepseek_v3_without_rope_interleave_takes_the_half_path(rotate_calls):
    model = make_model("deepseek_v3", rope_interleave=False)
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(hf.patch(model)(ids).logits, expected, rtol=1e-5, atol=1e-6)
    assert len(rotate_calls) == 4


def deepseek_tables(seq_len: int, rotary_dim: int = 8):
    """cos/sin ``[1, S, r]`` as DeepSeek-V3's rotary embedding returns them: ``[θ, θ]`` per row."""
    model = make_model("deepseek_v3")
    x = torch.zeros(1, seq_len, 32)
    return model.model.rotary_emb(x, torch.arange(seq_len)[None])


def test_deepseek_interleave_equals_transformers_channel_for_channel(gen):
    """The replacement returns what transformers returns, channel for channel (not only equal scores)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    cos, sin = deepseek_tables(7)
    q, k = torch.randn(2, 4, 7, 8, generator=gen), torch.randn(2, 1, 7, 8, generator=gen)
    expected_q, expected_k = ds.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    got_q, got_k = hf.SUPPORTED["deepseek_v3"].replacements["apply_rotary_pos_emb_interleave"](q, k, cos, sin)
    torch.testing.assert_close(got_q, expected_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_k, expected_k, rtol=0, atol=1e-6)
    # what docs/attention.md states: rotary's interleaved RoPE rotates the same pairs (2i, 2i+1) but
    # leaves every channel in place, so it equals transformers' output re-interleaved, not the output
    rope = rotary.RoPE(8, interleaved=True)
    in_place_q, in_place_k = rope(q, k)
    torch.testing.assert_close(rotary.to_interleaved(expected_q), in_place_q, rtol=0, atol=1e-6)
    assert (in_place_q - expected_q).abs().max() > 0.1
    scores = torch.einsum("bhsd,bgtd->bhst", in_place_q, in_place_k)
    torch.testing.assert_close(torch.einsum("bhsd,bgtd->bhst", expected_q, expected_k), scores, rtol=1e-5, atol=1e-5)


def test_rotating_in_place_gives_equal_logits_but_a_different_cache(monkeypatch):
    """Why the cache test below matters: DeepSeek's attention uses q_rot and k_rot only through their
    dot product, so rotating pairs (2i, 2i+1) in place, without transformers' de-interleave, leaves
    the logits unchanged. The cached keys are another channel order, though: wrong for an unpatched
    reader. The cache comparison catches what the logits cannot."""
    model = make_model("deepseek_v3")
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        expected = model(ids, use_cache=True)

    def interleaved_in_place(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        half = cos.shape[-1] // 2
        cos, sin = cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1)
        return rotary.apply_rotary(q, cos, sin, interleaved=True), rotary.apply_rotary(k, cos, sin, interleaved=True)

    family = hf.SUPPORTED["deepseek_v3"]
    wrong = dataclasses.replace(
        family, replacements={**family.replacements, "apply_rotary_pos_emb_interleave": interleaved_in_place}
    )
    monkeypatch.setitem(hf.SUPPORTED, "deepseek_v3", wrong)
    with torch.no_grad():
        got = hf.patch(model)(ids, use_cache=True)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-6)
    # DeepSeek's cache holds the compressed latent as "keys" and the rotated k_rot [B, 1, S, r] as "values"
    k_rot, expected_k_rot = got.past_key_values.layers[0].values, expected.past_key_values.layers[0].values
    assert (k_rot - expected_k_rot).abs().max() > 0.1
    torch.testing.assert_close(rotary.to_half(k_rot), expected_k_rot, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type", ["deepseek_v3", "gemma3_text", "gpt_oss"])
def test_kv_caches_are_interchangeable(model_type):
    """A cache filled by the patched model holds what the unpatched model would have stored, and an
    unpatched model continues from it exactly as from its own."""
    unpatched = make_model(model_type, seed=2)
    patched = hf.patch(copy.deepcopy(unpatched))
    prompt, step = torch.randint(64, (2, 6)), torch.randint(64, (2, 1))
    with torch.no_grad():
        own = unpatched(prompt, use_cache=True).past_key_values
        filled = patched(prompt, use_cache=True).past_key_values
        for mine, theirs in zip(own.layers, filled.layers):
            torch.testing.assert_close(theirs.keys, mine.keys, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(theirs.values, mine.values, rtol=1e-5, atol=1e-6)
        expected = unpatched(step, past_key_values=own).logits
        torch.testing.assert_close(unpatched(step, past_key_values=filled).logits, expected, rtol=1e-5, atol=1e-6)


def test_gemma3_both_layer_types_go_through_rotary_with_their_own_tables(monkeypatch):
    seen = []
    real = hf.rmsnorm_rotate  # Gemma-3 normalises q and k first: both in one rotary.rmsnorm_rotate call

    def spy(q, k, q_weight, k_weight, tables, **kw):
        seen.append(tables.cos.clone())
        return real(q, k, q_weight, k_weight, tables, **kw)

    monkeypatch.setattr(hf, "rmsnorm_rotate", spy)
    model = make_model("gemma3_text")
    ids = torch.randint(64, (1, 10))
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(hf.patch(model)(ids).logits, expected, rtol=1e-5, atol=1e-6)
    assert len(seen) == 2  # the sliding layer and the full layer
    # the sliding layer's pair 1 turns at 10000^(-2/8) = 0.1 rad per token; the full layer's at 1e6^(-2/8) / 8
    torch.testing.assert_close(
        seen[0][0, :, 1].double(), torch.cos(torch.arange(10) * 10000**-0.25).double(), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(
        seen[1][0, :, 1].double(), torch.cos(torch.arange(10) * 1e6**-0.25 / 8).double(), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8},
    ],
)
def test_scaled_rope_models(rope_parameters):
    """The model's own (scaled) tables are applied by rotary: any rope_type works."""
    model = make_model("llama", rope_parameters=rope_parameters)
    assert model.model.rotary_emb.rope_type == rope_parameters["rope_type"]
    ids = torch.randint(64, (1, 20))
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(hf.patch(model)(ids).logits, expected, rtol=1e-5, atol=1e-6)


def test_mqa_with_one_kv_head():
    model = make_model("llama", num_key_value_heads=1)
    ids = torch.randint(64, (1, 9))
    with torch.no_grad():
        expected = model(ids).logits
        torch.testing.assert_close(hf.patch(model)(ids).logits, expected, rtol=1e-5, atol=1e-6)


def test_patch_is_per_model():
    patched, other = make_model("llama"), make_model("llama")
    module = __import__("transformers.models.llama.modeling_llama", fromlist=["x"])
    original_function = module.apply_rotary_pos_emb
    original_forward = module.LlamaAttention.forward
    hf.patch(patched)
    assert module.apply_rotary_pos_emb is original_function
    assert module.LlamaAttention.forward is original_forward
    other_attention = other.model.layers[0].self_attn
    assert "forward" not in other_attention.__dict__ and other_attention.forward.__func__ is original_forward
    assert patched.model.layers[0].self_attn.forward.__func__ is not original_forward


def test_gradients_equal(rotate_calls):
    model = make_model("qwen2")
    ids = torch.randint(64, (2, 7))
    model(ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    hf.patch(model)
    model(ids, labels=ids).loss.backward()
    assert rotate_calls
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_model():
    model = make_model("llama").to(torch.bfloat16)
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits.float()
        got = hf.patch(model)(ids).logits
    assert got.dtype == torch.bfloat16
    # transformers rotates in bf16, rotary in fp32 then rounds once: a bf16-sized difference at most
    torch.testing.assert_close(got.float(), expected, rtol=0.02, atol=0.02)


def test_patch_twice_unpatch_once_and_deepcopy():
    model = make_model("mistral")
    hf.patch(model)
    hf.patch(model)
    clone = copy.deepcopy(model)
    assert hf.is_patched(clone)
    assert clone.model.layers[0].self_attn.forward.__self__ is clone.model.layers[0].self_attn
    hf.unpatch(model)
    assert not hf.is_patched(model)
    with pytest.raises(ValueError, match="is not patched; nothing to undo"):
        hf.unpatch(model)


def test_existing_instance_forward_is_restored():
    model = make_model("llama")
    attention = model.model.layers[0].self_attn
    hook = attention.forward  # e.g. what an accelerate hook leaves on the instance
    attention.forward = hook
    hf.patch(model)
    assert attention.forward is not hook
    hf.unpatch(model)
    assert attention.__dict__["forward"] is hook


def test_unsupported_architecture_lists_supported():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64))
    with pytest.raises(
        ValueError,
        match=re.escape(f"does not support model_type 'gpt2'; supported: {', '.join(sorted(hf.SUPPORTED))}"),
    ):
        hf.patch(model)


def test_not_a_transformers_model():
    with pytest.raises(TypeError, match="patch expects a transformers model"):
        hf.patch(torch.nn.Linear(2, 2))


# QK-norm families: q_norm, k_norm and the rotation in one rotary.rmsnorm_rotate call ---------------------

#: model_type -> the attention module's norm class, whose forward the fused call replaces
QK_NORM = {
    "qwen3": "Qwen3RMSNorm",
    "qwen3_moe": "Qwen3MoeRMSNorm",
    "gemma3_text": "Gemma3RMSNorm",
    "gemma3": "Gemma3RMSNorm",
}


@pytest.fixture
def fused_calls(monkeypatch):
    """The calls of rotary.rmsnorm_rotate made by patched attention modules."""
    calls = []
    real = hf.rmsnorm_rotate

    def spy(q, k, q_weight, k_weight, tables, **kw):
        calls.append((q_weight, k_weight, kw["style"]))
        return real(q, k, q_weight, k_weight, tables, **kw)

    monkeypatch.setattr(hf, "rmsnorm_rotate", spy)
    return calls


def norms(model):
    return [m for m in model.modules() if type(m).__name__.endswith("RMSNorm") and "forward" in m.__dict__]


@pytest.mark.parametrize("model_type", sorted(QK_NORM))
def test_qk_norm_families_normalise_and_rotate_in_one_call(model_type, fused_calls):
    model = make_model(model_type)
    ids = torch.randint(64, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, :2] = 0
    with torch.no_grad():
        before = model(ids, attention_mask=mask).logits
        hf.patch(model)
        patched = model(ids, attention_mask=mask).logits
    layers = [m for m in attention_modules(model)]
    assert len(fused_calls) == len(layers) == 2  # one fused call per layer, with that layer's norm weights
    for (q_weight, k_weight, style), attention in zip(fused_calls, layers):
        assert q_weight is attention.q_norm.weight and k_weight is attention.k_norm.weight
        assert style == ("gemma3" if model_type.startswith("gemma3") else "qwen3")
    assert {type(n).__name__ for n in norms(model)} == {QK_NORM[model_type]} and len(norms(model)) == 4
    torch.testing.assert_close(patched, before, rtol=1e-5, atol=1e-6)
    hf.unpatch(model)
    assert not norms(model) and not hf.is_patched(model)
    with torch.no_grad():
        assert model(ids, attention_mask=mask).logits.equal(before)


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_qk_norm_gradients_equal(model_type, fused_calls):
    """Training through the patched model: every parameter's gradient, the norms' weights included."""
    model = make_model(model_type)
    with torch.no_grad():  # norm weights away from their initial 1 (Qwen3) / 0 (Gemma-3)
        for n in [m for m in model.modules() if type(m).__name__ == QK_NORM[model_type]]:
            n.weight.uniform_(-0.5, 1.5, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(64, (2, 7))
    model(ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    hf.patch(model)
    model(ids, labels=ids).loss.backward()
    assert len(fused_calls) == 2
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
    assert any("q_norm" in name and expected[name].abs().sum() > 0 for name in expected)


def test_qk_norm_bf16_model(fused_calls):
    model = make_model("qwen3").to(torch.bfloat16)
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits.float()
        got = hf.patch(model)(ids).logits
    assert got.dtype == torch.bfloat16 and len(fused_calls) == 2
    # transformers rotates in bf16, rotary in fp32 then rounds once: a bf16-sized difference at most
    torch.testing.assert_close(got.float(), expected, rtol=0.02, atol=0.02)


def test_qk_norm_weights_of_another_dtype_take_the_norms_own_forward(fused_calls, rotate_calls):
    """Under autocast q is bf16 and Qwen3's norm weight fp32: Hugging Face's norm returns fp32 then, which
    the fused call (results in q's dtype) would not; the norms' own forward and rotary's rotation run."""
    model = make_model("qwen3")
    ids = torch.randint(64, (2, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(ids).logits.float()
        got = hf.patch(model)(ids).logits.float()
    assert not fused_calls and len(rotate_calls) == 4
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_qk_norm_patched_deepcopy_uses_its_own_norms():
    model = hf.patch(make_model("qwen3"))
    clone = copy.deepcopy(model)
    ids = torch.randint(64, (1, 8))
    with torch.no_grad():
        before = model(ids).logits
        for m in clone.modules():
            if type(m).__name__ == "Qwen3RMSNorm" and "forward" in m.__dict__:
                m.weight.mul_(3.0)
        changed = clone(ids).logits
        assert model(ids).logits.equal(before)  # the original's norms untouched, and used
        reference = hf.unpatch(copy.deepcopy(clone))(ids).logits
    assert not torch.allclose(changed, before)
    torch.testing.assert_close(changed, reference, rtol=1e-5, atol=1e-6)  # the clone's own weights


def test_qk_norm_existing_instance_forward_of_a_norm_is_restored():
    model = make_model("gemma3_text")
    q_norm = model.model.layers[0].self_attn.q_norm
    hook = q_norm.forward  # e.g. what an accelerate hook leaves on the instance
    q_norm.forward = hook
    hf.patch(model)
    assert q_norm.forward is not hook
    hf.unpatch(model)
    assert q_norm.__dict__["forward"] is hook


def test_qk_norm_patched_model_under_torch_compile(fused_calls):
    """The fused attention finds its norms without closures in the patched globals, which dynamo would
    guard against the modeling module's own globals (and fail to build the guard). Traced, it runs the
    norms' own forward and the rotation as plain torch operations (which Inductor fuses with the
    projections), in one graph, equal to the unpatched model. One layer: dynamo traces every layer's attention
    through the same code."""
    model = make_model("qwen3", num_hidden_layers=1)
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        unpatched = model(ids).logits
        expected = hf.patch(model)(ids).logits
        torch._dynamo.reset()
        got = torch.compile(model, backend="aot_eager", fullgraph=True)(ids).logits
    assert len(fused_calls) == 1  # eager only (one call per layer): the traced forward did not call the fused op
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(got, unpatched)


@FAST
@given(model=st.sampled_from([None, 3, "model", torch.nn.Linear(2, 2), torch.nn.Sequential(), [torch.nn.Linear(2, 2)]]))
def test_hf_entry_points_name_what_is_not_a_transformers_model(model):
    from rotary.hf import patching as hf

    # decided up front (the entry points' docstrings): none of these is a transformers model, so patch refuses
    # each (InputTypeError for what is not an nn.Module, InputError for a module of no supported model_type) and
    # unpatch too (nothing is patched); is_patched answers False for any nn.Module, never patched
    module = isinstance(model, torch.nn.Module)
    for call in (hf.patch, hf.unpatch, hf.is_patched):
        valid = call is hf.is_patched and module
        try:
            result = call(model)
        except NAMED as exc:
            assert not valid, f"is_patched refused a module: {exc}"
            assert_named(exc, "transformers model", "not patched")
            if not module:
                assert isinstance(exc, rotary.InputTypeError), exc
        else:
            assert valid, f"{call.__name__} accepted {model!r}"
            assert result is False
