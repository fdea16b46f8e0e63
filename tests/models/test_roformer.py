"""RoFormer: loads Hugging Face RoFormer weights and reproduces transformers' outputs (random weights)."""

from __future__ import annotations

import copy

import pytest
import torch

from rotary.models import RoFormer, RoFormerConfig

transformers = pytest.importorskip("transformers")


def hf_config(**kw):
    base = dict(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.RoFormerConfig(**{**base, **kw})


def inputs(seq_len=20, vocab=97):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(vocab, (3, seq_len), generator=g)
    mask = torch.ones(3, seq_len, dtype=torch.long)
    mask[1, -6:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    types = torch.randint(2, (3, seq_len), generator=g)
    return ids, mask, types


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(rotary_value=True),
        dict(embedding_size=24),
        dict(hidden_act="gelu_new", tie_word_embeddings=False),
    ],
)
def test_masked_lm_matches_transformers(kw):
    torch.manual_seed(0)
    hf = transformers.RoFormerForMaskedLM(hf_config(**kw)).eval()
    ours = RoFormer.from_hf(hf)
    assert ours.head == "masked_lm"
    ids, mask, types = inputs()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_base_model_matches_transformers_at_max_length():
    torch.manual_seed(1)
    hf = transformers.RoFormerModel(hf_config(rotary_value=True)).eval()
    ours = RoFormer.from_hf(hf)
    assert ours.head is None
    ids, mask, types = inputs(seq_len=128)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_sequence_classification_matches_transformers():
    torch.manual_seed(2)
    hf = transformers.RoFormerForSequenceClassification(hf_config(num_labels=3)).eval()
    ours = RoFormer.from_hf(hf.state_dict(), hf.config)
    assert ours.head == "sequence_classification"
    ids, mask, types = inputs()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    assert got.shape == (3, 3)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_encoder_only_from_masked_lm_weights():
    torch.manual_seed(3)
    hf = transformers.RoFormerForMaskedLM(hf_config()).eval()
    ours = RoFormer.from_hf(hf, head=None)
    ids, mask, _ = inputs()
    with torch.no_grad():
        expected = hf.roformer(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(ours(ids, attention_mask=mask), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("safe", [True, False])
def test_load_from_a_saved_directory(tmp_path, safe):
    torch.manual_seed(4)
    hf = transformers.RoFormerForMaskedLM(hf_config()).eval()
    hf.save_pretrained(tmp_path)
    if not safe:  # transformers 5 always writes safetensors; make the .bin the only file
        for f in tmp_path.glob("*.safetensors"):
            f.unlink()
        torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    ours = RoFormer.from_hf(tmp_path)  # config.json read from the directory
    ids, mask, _ = inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, attention_mask=mask), hf(input_ids=ids, attention_mask=mask).logits, rtol=1e-5, atol=1e-5
        )


def test_bin_files_are_read_with_weights_only(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("unpickled!",))

    torch.save({"x": Evil()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported"):
        RoFormer.from_hf(tmp_path, hf_config())


def test_gradients_and_bf16():
    torch.manual_seed(5)
    hf = transformers.RoFormerForMaskedLM(hf_config(rotary_value=True)).eval()
    ours = RoFormer.from_hf(hf).train()
    ids, mask, _ = inputs()
    ours(ids, attention_mask=mask).sum().backward()
    for name, p in ours.named_parameters():
        if name != "embeddings.token_type_embeddings.weight":  # types are all 0: one row used
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    ours.eval()
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask)
        got = ours.to(torch.bfloat16)(ids, attention_mask=mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.1, atol=0.1)


def test_config_from_hf_and_errors(tmp_path):
    c = RoFormerConfig.from_hf(hf_config(embedding_size=16))
    assert (c.embedding_size, c.hidden_size, c.vocab_size) == (16, 32, 97)
    with pytest.raises(ValueError, match="not 'roformer'"):
        RoFormerConfig.from_hf({"model_type": "bert", "hidden_size": 32})
    with pytest.raises(ValueError, match="only the RoFormer encoder"):
        RoFormerConfig.from_hf(hf_config(is_decoder=True))
    with pytest.raises(ValueError, match="unsupported hidden_act 'mish'"):
        RoFormerConfig(hidden_act="mish")
    with pytest.raises(ValueError, match="not divisible by num_attention_heads=5"):
        RoFormerConfig(hidden_size=32, num_attention_heads=5)
    with pytest.raises(ValueError, match="unknown head 'qa'"):
        RoFormer(RoFormerConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1), head="qa")


def test_from_hf_errors(tmp_path):
    hf = transformers.RoFormerModel(hf_config())
    with pytest.raises(ValueError, match="config is required"):
        RoFormer.from_hf(hf.state_dict())
    with pytest.raises(ValueError, match="weights do not fit.*missing"):
        RoFormer.from_hf(hf.state_dict(), hf_config(num_hidden_layers=3))
    with pytest.raises(ValueError, match="(?s)weights do not fit.*size mismatch"):
        RoFormer.from_hf(hf.state_dict(), hf_config(intermediate_size=64))
    with pytest.raises(TypeError, match="model_or_state_dict must be"):
        RoFormer.from_hf(42, hf_config())
    with pytest.raises(FileNotFoundError, match="no model.safetensors or pytorch_model.bin"):
        RoFormer.from_hf(tmp_path, hf_config())
    state = hf.state_dict()
    state["encoder.embed_positions.weight"] = state["encoder.embed_positions.weight"] * 0.5
    with pytest.raises(ValueError, match="not the standard RoFormer sinusoidal table"):
        RoFormer.from_hf(state, hf.config)


def test_set_rope_scaling_equals_layers_built_with_that_rope():
    import rotary

    torch.manual_seed(0)
    config = RoFormerConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    model = RoFormer(config).eval()
    ids = torch.randint(100, (2, 40))  # longer than trained: what the scaling is for
    before = model(ids)
    block = {"rope_type": "linear", "factor": 4.0}
    model.set_rope_scaling(block)
    built = RoFormer(config).eval()
    built.load_state_dict(model.state_dict())
    built.rope = rotary.RoPE(8, interleaved=True, scaling=block, max_position=16)
    for layer in built.layers:
        layer.attention.rope = built.rope
    assert torch.equal(model(ids), built(ids)) and not torch.equal(model(ids), before)
    assert all(layer.attention.rope is model.rope for layer in model.layers)
    model.set_rope_scaling(None)
    assert torch.equal(model(ids), before)
    with pytest.raises(TypeError, match="scaling must be a dict"):
        model.set_rope_scaling("linear")


def test_roformer_copies_after_a_forward():
    model = RoFormer(
        RoFormerConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    ).eval()
    ids = torch.randint(50, (1, 7))
    out = model(ids)
    assert torch.equal(copy.deepcopy(model)(ids), out)


@pytest.mark.parametrize(
    "ids, types, exc, match",
    [
        (torch.tensor([[1, 97]]), None, ValueError, "input_ids hold id 97, but vocab_size is 97"),
        (
            torch.tensor([[1, 2]]),
            torch.tensor([[0, 2]]),
            ValueError,
            "token_type_ids hold id 2, but type_vocab_size is 2",
        ),
        (
            torch.tensor([[1, 2]]),
            torch.tensor([[0, 1, 0]]),
            ValueError,
            r"token_type_ids must have the shape of input_ids \(1, 2\)",
        ),
        (
            torch.tensor([[1, 2]]),
            torch.tensor([[0, 1]]).float(),
            ValueError,
            "token_type_ids must be an integer tensor",
        ),
    ],
)
def test_roformer_ids_outside_their_tables_are_named(ids, types, exc, match):
    """Were ``IndexError: index out of range in self`` from inside the embeddings."""
    from rotary.models import RoFormer, RoFormerConfig

    model = RoFormer(
        RoFormerConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)
    )
    with pytest.raises(exc, match=match):
        model(ids, token_type_ids=types)
