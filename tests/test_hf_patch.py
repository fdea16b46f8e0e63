"""rotary.hf.patch / unpatch on random-weight transformers models built from small configs."""

from __future__ import annotations

import copy

import pytest
import torch

from rotary import hf

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def make_config(model_type: str, **kw):
    builders = {
        "llama": lambda: transformers.LlamaConfig(num_key_value_heads=2, **COMMON),
        "mistral": lambda: transformers.MistralConfig(num_key_value_heads=2, **COMMON),
        "qwen2": lambda: transformers.Qwen2Config(num_key_value_heads=2, **COMMON),
        "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=2, head_dim=8, **COMMON),
        # partial rotation: half of Phi-3's head, a quarter of GPT-NeoX's, 4 of 8 channels for GPT-J
        "phi3": lambda: transformers.Phi3Config(num_key_value_heads=2, partial_rotary_factor=0.5, pad_token_id=0, **COMMON),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(rotary_pct=0.25, **COMMON),
        "gptj": lambda: transformers.GPTJConfig(vocab_size=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4),
        "cohere": lambda: transformers.CohereConfig(num_key_value_heads=2, **COMMON),
        "glm": lambda: transformers.GlmConfig(num_key_value_heads=2, head_dim=8, pad_token_id=0, eos_token_id=1, **COMMON),
    }
    config = builders[model_type]()
    for key, value in kw.items():
        setattr(config, key, value)
    return config


def make_model(model_type: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(make_config(model_type, **kw)).eval()


def attention_modules(model):
    return [m for m in model.modules() if hf._MARK in m.__dict__]


@pytest.fixture
def rotate_calls(monkeypatch):
    """Counts calls into rotary's backend dispatcher."""
    import rotary.kernels.dispatch as dispatch

    calls = []
    real = dispatch.rotate

    def counting(rotation, *args, **kwargs):
        calls.extend(x.shape for x in rotation.xs)
        return real(rotation, *args, **kwargs)

    monkeypatch.setattr(dispatch, "rotate", counting)
    return calls


#: the Qwen-VL families (multimodal RoPE): tested with images in tests/variants/test_mrope.py
MULTIMODAL = {f"{name}{suffix}" for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl") for suffix in ("", "_text")}


def test_supported_list_is_the_issue_list():
    text = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gpt_neox", "gptj", "cohere", "glm"}
    assert set(hf.SUPPORTED) == text | MULTIMODAL


@pytest.mark.parametrize("model_type", sorted(set(hf.SUPPORTED) - MULTIMODAL))
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


@pytest.mark.parametrize("model_type", ["llama", "gpt_neox", "gptj", "glm"])
def test_generation_with_kv_cache_unchanged(model_type):
    model = make_model(model_type, seed=1)
    ids = torch.randint(64, (2, 6))
    expected = model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0)
    hf.patch(model)
    assert model.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0).equal(expected)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
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
    with pytest.raises(ValueError, match="does not support model_type 'gpt2'; supported: cohere, glm, gpt_neox, gptj, llama"):
        hf.patch(model)


def test_not_a_transformers_model():
    with pytest.raises(TypeError, match="patch expects a transformers model"):
        hf.patch(torch.nn.Linear(2, 2))
