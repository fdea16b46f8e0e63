"""Evaluation past L: every scaling measured equals a direct Decoder forward with that scaling; the
sliding windows score the same tokens at every length with at least E - stride of context; a fine-tuned
scaling keeps its own factor."""

import math

import pytest
import torch
import torch.nn.functional as F

from rotary.models import Decoder
from rotary.tools.experiments.config import PRESETS, SCALINGS, ExperimentConfig
from rotary.tools.experiments.data import evaluation_tokens, load_corpus, sliding_starts, windows
from rotary.tools.experiments.evaluate import (
    EvaluationText,
    evaluate_model,
    evaluation_scalings,
    greedy_continuation,
    position_bins,
    scaled_copy,
    scaling_block,
    sliding_losses,
    token_losses,
    uses_rope,
)
from rotary.tools.experiments.plan import model_specs
from rotary.tools.experiments.progress import Reporter
from rotary.tools.experiments.train import build_model, decoder_config

CFG = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu"})
L = CFG.train_length
SPECS = {s.name: s for s in model_specs(CFG)}


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(CFG)


@pytest.fixture(scope="module")
def tokens(corpus):
    return evaluation_tokens(corpus, CFG)


@pytest.fixture(scope="module")
def rope_model():
    model = build_model(SPECS["rope-0"], CFG)
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
    measured = token_losses(scaled_copy(rope_model, block), windows(tokens, length))
    expected = direct_losses(rope_model, block, windows(tokens, length))
    assert measured.shape == (tokens.numel() // length, length - 1)
    assert torch.allclose(measured, expected, rtol=1e-5, atol=1e-5)


def test_the_rows_of_a_model_are_its_direct_forwards(rope_model, corpus, tokens):
    """evaluate_model: the windows rows, the position bins and the sliding rows, for two scalings."""
    import dataclasses

    config = dataclasses.replace(CFG, scalings=("none", "yarn"))
    text = EvaluationText(tokens, sliding_starts(config, tokens.numel()), corpus.held_out)
    rows = evaluate_model(SPECS["rope-0"], rope_model, text, config, Reporter(enabled=False))
    assert {(r.scaling, r.eval_length, r.mode) for r in rows.perplexity} == {
        (s, e, m) for s in ("none", "yarn") for e in config.eval_lengths for m in ("windows", "sliding")}
    for r in rows.perplexity:
        block = scaling_block(r.scaling, r.eval_length / L, L) if r.scaling != "none" else None
        assert r.factor == (1.0 if r.scaling == "none" else r.eval_length / L)
        if r.mode == "windows":
            expected = direct_losses(rope_model, block, windows(tokens, r.eval_length)).double()
        else:
            expected = []
            for start in text.sliding:  # each stride predicted by the window that ends with it
                window = tokens[start + config.stride - r.eval_length : start + config.stride]
                expected.append(direct_losses(rope_model, block, window[None])[0, -config.stride :])
            expected = torch.cat(expected).double()
            assert r.predictions == expected.numel() == config.sliding_tokens // config.stride * config.stride
        assert r.loss == pytest.approx(float(expected.mean()), rel=1e-5)
        assert r.perplexity == pytest.approx(math.exp(r.loss), rel=1e-9) and r.bits_per_byte == pytest.approx(r.loss / math.log(2))
    longest = direct_losses(rope_model, None, windows(tokens, config.longest))
    bins = [r for r in rows.positions if r.scaling == "none"]
    assert [(r.start, r.end) for r in bins] == position_bins(config)
    for r in bins:
        assert r.loss == pytest.approx(float(longest[:, r.start : r.end].double().mean()), rel=1e-5)
    assert {r.distance for r in rows.retrieval} == set(config.distances)
    assert all(r.predictions == config.retrieval_trials * (config.retrieval_span - 1) for r in rows.retrieval)
    assert sum(r.trials for r in rows.passkey if r.eval_length == L and r.scaling == "none") == config.passkey_trials


def test_sliding_windows_score_the_same_strides_at_every_length_spread_over_the_text(rope_model, tokens):
    stride = CFG.stride
    starts = sliding_starts(CFG, tokens.numel())
    assert len(starts) == CFG.sliding_tokens // stride and starts[0] == CFG.longest  # room for the longest window
    gaps = {b - a for a, b in zip(starts, starts[1:])}
    assert all(g % stride == 0 and g >= stride for g in gaps) and starts[-1] + stride <= tokens.numel()
    full = sliding_losses(rope_model, tokens, CFG.longest, stride, starts)
    assert full.numel() == len(starts) * stride
    for length in CFG.eval_lengths:  # the same tokens at every length; a longer window changes the losses
        assert sliding_losses(rope_model, tokens, length, stride, starts).shape == full.shape
    assert not torch.allclose(sliding_losses(rope_model, tokens, L, stride, starts), full)
    with pytest.raises(ValueError, match="needs at least"):
        sliding_losses(rope_model, tokens, CFG.longest + 2 * stride, stride, starts)


def test_a_fine_tuned_scaling_keeps_its_own_factor_and_the_others_are_measured_as_trained(rope_model):
    assert evaluation_scalings(SPECS["rope-ft-yarn-0"], rope_model, CFG) == [("yarn", 4.0)]
    assert evaluation_scalings(SPECS["rope-0"], rope_model, CFG) == [(s, None) for s in CFG.scalings]
    assert evaluation_scalings(SPECS["rope-scratch-0"], rope_model, CFG) == [("none", 1.0)]
    learned = build_model(SPECS["learned-0"], CFG)
    assert evaluation_scalings(SPECS["learned-0"], learned, CFG) == [("none", 1.0)]


def test_scalings_change_the_numbers_past_L_and_not_at_L(rope_model, tokens):
    at_8L = {s: float(token_losses(scaled_copy(rope_model, scaling_block(s, 8, L)), windows(tokens, 8 * L)).mean()) for s in SCALINGS}
    assert len({round(v, 9) for v in at_8L.values()}) == len(SCALINGS)  # five different models past L
    at_L = {s: float(token_losses(scaled_copy(rope_model, scaling_block(s, 1, L)), windows(tokens, L)).mean()) for s in SCALINGS}
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
    model = build_model(SPECS[f"{encoding}-1"], CFG).eval()
    if encoding == "rope":
        model = scaled_copy(model, scaling_block("dynamic", 4, L))
    prompts = torch.randint(256, (3, 2 * L), generator=torch.Generator().manual_seed(0))
    fresh = scaled_copy(model, model.config.rope_scaling)  # dynamic NTK keeps state: same start for both
    assert torch.equal(greedy_continuation(model, prompts, 5), fresh.generate(prompts, 5)[:, -5:])


def test_learned_table_reaches_8L_without_index_errors(corpus, tokens):
    model = build_model(SPECS["learned-0"], CFG).eval()
    rows = evaluate_model(SPECS["learned-0"], model, EvaluationText(tokens, sliding_starts(CFG, tokens.numel()), corpus.held_out), CFG,
                          Reporter(enabled=False))
    assert sorted({r.eval_length for r in rows.perplexity}) == [L, 2 * L, 4 * L, 8 * L]
    assert all(r.scaling == "none" for r in rows.perplexity)  # no RoPE: measured as trained only
    assert all(math.isfinite(r.perplexity) for r in rows.perplexity) and all(0 <= r.correct <= r.trials for r in rows.passkey)
    assert not uses_rope(model)


def test_scaling_block_names():
    assert scaling_block("dynamic", 2, 64) == {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
    assert scaling_block("linear", 2, 64) == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="unknown scaling 'ntk2'; known: none, linear, ntk, dynamic, yarn"):
        scaling_block("ntk2", 2, 64)
