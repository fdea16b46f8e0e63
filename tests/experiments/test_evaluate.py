"""Evaluation past L: every scaling measured equals a direct Decoder forward with that scaling."""

import math

import pytest
import torch
import torch.nn.functional as F

from rotary.experiments.config import PRESETS, SCALINGS, ExperimentConfig
from rotary.experiments.data import evaluation_tokens, load_corpus, windows
from rotary.experiments.evaluate import (
    bucket_edges,
    evaluate_model,
    greedy_continuation,
    perplexity_at,
    scaled_copy,
    scaling_block,
    token_losses,
    uses_rope,
)
from rotary.experiments.progress import Reporter
from rotary.experiments.train import ModelSpec, build_model, decoder_config
from rotary.models import Decoder

CFG = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu"})
L = CFG.train_length


@pytest.fixture(scope="module")
def tokens():
    return evaluation_tokens(load_corpus(CFG), CFG)


@pytest.fixture(scope="module")
def rope_model():
    model = build_model(ModelSpec("rope", "rope", 0), CFG)
    with torch.no_grad():  # weights far from the initialisation, so positions matter to the output
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return model.eval()


@torch.no_grad()
def direct_losses(model: Decoder, scaling: dict | None, win: torch.Tensor) -> torch.Tensor:
    """What evaluation must equal: a Decoder built with that rope_scaling, the same weights, one forward."""
    direct = Decoder(decoder_config("rope", CFG, rope_scaling=scaling))
    direct.load_state_dict(model.state_dict())
    logits = direct.eval()(win[:, :-1])
    return F.cross_entropy(logits.reshape(-1, 256), win[:, 1:].reshape(-1), reduction="none").view(win.shape[0], -1)


@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize("factor", [2, 8])
def test_each_scaling_equals_a_direct_forward_past_L(rope_model, tokens, scaling, factor):
    length = factor * L
    block = scaling_block(scaling, factor, L)
    measured = perplexity_at(scaled_copy(rope_model, block), tokens, length, bucket_edges(CFG))
    expected = direct_losses(rope_model, block, windows(tokens, length)).double()
    assert measured["windows"] == tokens.numel() // length
    assert measured["loss"] == pytest.approx(float(expected.mean()), rel=1e-6)
    assert measured["perplexity"] == pytest.approx(math.exp(float(expected.mean())), rel=1e-6)
    assert measured["bits_per_byte"] == pytest.approx(float(expected.mean()) / math.log(2), rel=1e-6)
    # buckets: the mean loss of queries at positions [a, b) of the same windows
    for (a, b), value in zip(zip(bucket_edges(CFG)[:-1], bucket_edges(CFG)[1:]), measured["buckets"].values()):
        if a < length - 1:
            assert value == pytest.approx(float(expected[:, a : min(b, length - 1)].mean()), rel=1e-6)
        else:
            assert value is None


def test_scalings_change_the_numbers_past_L_and_not_at_L(rope_model, tokens):
    edges = bucket_edges(CFG)
    at_8L = {s: perplexity_at(scaled_copy(rope_model, scaling_block(s, 8, L)), tokens, 8 * L, edges)["loss"] for s in SCALINGS}
    assert len({round(v, 9) for v in at_8L.values()}) == len(SCALINGS)  # five different models past L
    at_L = {s: perplexity_at(scaled_copy(rope_model, scaling_block(s, 1, L)), tokens, L, edges)["loss"] for s in SCALINGS}
    assert max(at_L.values()) - min(at_L.values()) < 1e-6  # factor 1 is the trained model (YaRN rounds once)


def test_scaled_copy_keeps_weights_and_the_callers_random_state(rope_model):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    copy = scaled_copy(rope_model, scaling_block("yarn", 4, L))
    assert torch.equal(torch.rand(3), expected)
    assert copy.config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L}
    assert all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), rope_model.state_dict().values()))
    assert rope_model.config.rope_scaling is None  # the trained model is untouched


def test_token_losses_do_not_depend_on_the_batching(rope_model, tokens):
    win = windows(tokens, 2 * L)
    assert torch.allclose(token_losses(rope_model, win, batch_rows=1), token_losses(rope_model, win), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("encoding", ["rope", "alibi", "learned"])
def test_greedy_continuation_is_generate(encoding):
    model = build_model(ModelSpec(encoding, encoding, 1), CFG).eval()
    if encoding == "rope":
        model = scaled_copy(model, scaling_block("dynamic", 4, L))
    prompts = torch.randint(256, (3, 2 * L), generator=torch.Generator().manual_seed(0))
    fresh = scaled_copy(model, model.config.rope_scaling)  # dynamic NTK keeps state: same start for both
    assert torch.equal(greedy_continuation(model, prompts, 5), fresh.generate(prompts, 5)[:, -5:])


def test_learned_table_reaches_8L_without_index_errors(tokens):
    model = build_model(ModelSpec("learned", "learned", 0), CFG).eval()
    rows = evaluate_model(ModelSpec("learned", "learned", 0), model, tokens, CFG, Reporter(enabled=False))
    assert [r["eval_length"] for r in rows] == [L, 2 * L, 4 * L, 8 * L]
    assert all(r["scaling"] == "none" for r in rows)  # no RoPE: measured as trained only
    assert all(math.isfinite(r["perplexity"]) and 0 <= r["passkey_accuracy"] <= 1 for r in rows)
    assert not uses_rope(model)


def test_scaling_block_names():
    assert scaling_block("dynamic", 2, 64) == {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
    assert scaling_block("linear", 2, 64) == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="unknown scaling 'ntk2'; known: none, linear, ntk, dynamic, yarn"):
        scaling_block("ntk2", 2, 64)
