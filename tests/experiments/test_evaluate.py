"""Evaluation past L: every scaling measured equals a direct Decoder forward with that scaling; the
sliding windows score the same tokens at every length with at least E - stride of context; a fine-tuned
scaling keeps its own factor."""

import math

import pytest
import torch
import torch.nn.functional as F

from rotary.models import POSITION_ENCODINGS, Decoder
from rotary.tools.experiments.config import PRESETS, SCALINGS, ExperimentConfig
from rotary.tools.experiments.data import evaluation_tokens, load_corpus, sliding_starts, windows
from rotary.tools.experiments.evaluate import (
    EvaluationText,
    eval_rows,
    evaluate_model,
    evaluation_scalings,
    greedy_continuation,
    position_bins,
    rows_per_batch,
    scaled_copy,
    scaling_block,
    sliding_losses,
    token_losses,
    uses_rope,
)
from rotary.tools.experiments.passkey import KEY_DIGITS, make_trials, passkey_accuracy
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
        (s, e, m) for s in ("none", "yarn") for e in config.eval_lengths for m in ("windows", "sliding")
    }
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
        assert r.perplexity == pytest.approx(math.exp(r.loss), rel=1e-9) and r.bits_per_byte == pytest.approx(
            r.loss / math.log(2)
        )
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
    at_8L = {
        s: float(token_losses(scaled_copy(rope_model, scaling_block(s, 8, L)), windows(tokens, 8 * L)).mean())
        for s in SCALINGS
    }
    assert len({round(v, 9) for v in at_8L.values()}) == len(SCALINGS)  # five different models past L
    at_L = {
        s: float(token_losses(scaled_copy(rope_model, scaling_block(s, 1, L)), windows(tokens, L)).mean())
        for s in SCALINGS
    }
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
    assert torch.allclose(
        token_losses(rope_model, win, batch_rows=1), token_losses(rope_model, win), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("encoding", CFG.encodings)
def test_greedy_continuation_is_generate(encoding):
    model = build_model(SPECS[f"{encoding}-1"], CFG).eval()
    if encoding == "rope":
        model = scaled_copy(model, scaling_block("dynamic", 4, L))
    prompts = torch.randint(256, (3, 2 * L), generator=torch.Generator().manual_seed(0))
    fresh = scaled_copy(model, model.config.rope_scaling)  # dynamic NTK keeps state: same start for both
    assert torch.equal(greedy_continuation(model, prompts, 5), fresh.generate(prompts, 5)[:, -5:])


def test_learned_table_reaches_8L_without_index_errors(corpus, tokens):
    model = build_model(SPECS["learned-0"], CFG).eval()
    rows = evaluate_model(
        SPECS["learned-0"],
        model,
        EvaluationText(tokens, sliding_starts(CFG, tokens.numel()), corpus.held_out),
        CFG,
        Reporter(enabled=False),
    )
    assert sorted({r.eval_length for r in rows.perplexity}) == [L, 2 * L, 4 * L, 8 * L]
    assert all(r.scaling == "none" for r in rows.perplexity)  # no RoPE: measured as trained only
    assert all(math.isfinite(r.perplexity) for r in rows.perplexity) and all(
        0 <= r.correct <= r.trials for r in rows.passkey
    )
    assert not uses_rope(model)


def test_scaling_block_names():
    assert scaling_block("dynamic", 2, 64) == {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
    assert scaling_block("linear", 2, 64) == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="unknown scaling 'ntk2'; known: none, linear, ntk, dynamic, yarn"):
        scaling_block("ntk2", 2, 64)


# ------------------------------------------------------------------------------------------------
# attention through SDPA, batched evaluation, mixed precision


def explicit_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``softmax(q kᵀ / sqrt(d) + mask) v`` written out, in float64: what SDPA computes, without its kernels."""
    assert dropout_p == 0.0 and not enable_gqa
    scores = (q.double() @ k.double().transpose(-2, -1)) * (
        scale if scale is not None else q.shape[-1] ** -0.5
    )  # [B, H, S, T]
    if is_causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask.double()
        )
    return (scores.softmax(-1) @ v.double()).to(q.dtype)


#: every method of the experiment: each registered encoding as trained, and RoPE under each scaling past L
METHODS = [(e, "none") for e in sorted(POSITION_ENCODINGS)] + [("rope", s) for s in SCALINGS if s != "none"]


@pytest.mark.parametrize(("encoding", "scaling"), METHODS)
def test_every_method_attends_through_sdpa_as_the_explicit_formula(encoding, scaling, monkeypatch):
    model = Decoder(decoder_config(encoding, CFG)).eval()
    if scaling != "none":
        model = scaled_copy(model, scaling_block(scaling, 4, L))
    ids = torch.randint(256, (2, 3 * L), generator=torch.Generator().manual_seed(1))
    sdpa, causal = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        causal.append(kwargs.get("is_causal", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    fast, fast_tokens = model(ids), greedy_continuation(model, ids[:, :L], 3)
    monkeypatch.setattr(F, "scaled_dot_product_attention", explicit_attention)
    exact, exact_tokens = model(ids), greedy_continuation(model, ids[:, :L], 3)
    assert torch.allclose(fast, exact, rtol=1e-5, atol=1e-5), (fast - exact).abs().max()
    assert torch.equal(fast_tokens, exact_tokens)
    # SDPA's own causal path (flash attention on a GPU) wherever the encoding leaves the scores alone;
    # a score bias (ALiBi, a learned bias) comes as attn_mask
    biased = any(layer.attn.position_bias is not None for layer in model.layers)
    assert causal[: CFG.num_layers] == [not biased] * CFG.num_layers


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_passkey_answers_do_not_depend_on_the_batching(encoding):
    model = build_model(SPECS[f"{encoding}-0"], CFG).eval()
    trials = make_trials(2 * L, 6, CFG.passkey_depths, torch.Generator().manual_seed(0))
    prompts = torch.stack([t.prompt for t in trials])
    together = greedy_continuation(model, prompts, KEY_DIGITS)
    alone = torch.cat([greedy_continuation(model, p[None], KEY_DIGITS) for p in prompts])
    assert torch.equal(together, alone)
    answer = lambda p: greedy_continuation(model, p, KEY_DIGITS)  # noqa: E731
    assert passkey_accuracy(answer, trials, batch_size=1) == passkey_accuracy(answer, trials, batch_size=6)


def test_the_cpu_keeps_its_batches_and_a_gpu_takes_long_windows_in_batches():
    cpu = build_model(SPECS["rope-0"], CFG)
    for length in (L, 8 * L, 4096):  # make demo's batches, as before
        assert eval_rows(cpu, length) == rows_per_batch(length, CFG.num_heads)
        assert eval_rows(cpu, length, generate=True) == rows_per_batch(length, CFG.num_heads, max_scores=2**23)
    large = ExperimentConfig(**PRESETS["large"])
    with torch.device("meta"):  # no GPU needed: any device but the CPU takes the GPU budget
        rope, alibi = (Decoder(decoder_config(e, large)) for e in ("rope", "alibi"))
    assert eval_rows(rope, 4096) == 16 and eval_rows(rope, 512) == 512  # 2**28 scores, 2**18 tokens
    assert eval_rows(alibi, 4096) == 2 and eval_rows(alibi, 512) == 128  # [rows, 8 heads, E, E] biases
    assert eval_rows(cpu.to("meta"), 4096) > eval_rows(build_model(SPECS["rope-0"], CFG), 4096) == 1


def test_greedy_decoding_under_bf16_autocast_writes_a_bf16_cache_and_matches_a_growing_cache():
    model = build_model(SPECS["rope-0"], CFG).eval()
    prompts = torch.randint(256, (2, L), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        tokens = greedy_continuation(model, prompts, 4)
        cache, step, expected = model.new_cache(), prompts, []
        for _ in range(4):  # the decoding greedy_continuation replaced: growing caches
            expected.append(model(step, cache=cache)[:, -1].float().argmax(-1, keepdim=True))
            step = expected[-1]
    assert torch.equal(tokens, torch.cat(expected, dim=1))


def test_a_bf16_evaluation_is_near_the_fp32_one(corpus, tokens):
    spec = SPECS["rope-0"]
    text = EvaluationText(tokens, sliding_starts(CFG, tokens.numel()), corpus.held_out)
    bf16 = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "precision": "bf16", "scalings": ("none", "yarn")})
    fp32 = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu", "scalings": ("none", "yarn")})
    rows = [evaluate_model(spec, build_model(spec, CFG).eval(), text, c, Reporter(enabled=False)) for c in (bf16, fp32)]
    low, high = ([r.loss for r in m.perplexity] for m in rows)
    assert len(low) == len(high) and low != high  # bf16 did run
    assert all(abs(a - b) < 0.02 * b for a, b in zip(low, high))
