"""The retrieval probe: the trials are laid out as documented, a model built to copy earlier text shows
a large gain exactly where a copy is planted, and a model that cannot copy shows none."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from rotary.models import Decoder, DecoderConfig
from rotary.tools.experiments.config import PRESETS, ExperimentConfig
from rotary.tools.experiments.data import load_corpus
from rotary.tools.experiments.retrieval import ALPHABET, PREFIX, longest_distance, make_trials, retrieval_scores

CFG = ExperimentConfig(**{**PRESETS["tiny"], "device": "cpu"})


@pytest.fixture(scope="module")
def text() -> torch.Tensor:
    corpus = load_corpus(CFG)
    return corpus.held_out.to(torch.int64)


class Copier(nn.Module):
    """Induction by lookup: at each position, find the latest earlier occurrence of the last ``k`` tokens
    and predict the token that followed it (logit 10 against 0); with no match, predict nothing (all 0)."""

    def __init__(self, k: int = 3, vocab: int = 256) -> None:
        super().__init__()
        self.k, self.vocab = k, vocab

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, length = tokens.shape
        logits = torch.zeros(batch, length, self.vocab)
        for b in range(batch):
            row = tokens[b].tolist()
            for q in range(self.k - 1, length):
                key = row[q - self.k + 1 : q + 1]
                for j in range(q - 1, self.k - 2, -1):
                    if row[j - self.k + 1 : j + 1] == key:
                        logits[b, q, row[j + 1]] = 10.0
                        break
        return logits


def test_trials_plant_the_span_twice_in_the_copy_and_two_different_spans_in_the_control(text):
    t = make_trials(text, 40, trials=5, span=12, generator=torch.Generator().manual_seed(1))
    assert t.copy.shape == t.control.shape == (5, PREFIX + 40 + 12) and t.second == PREFIX + 40
    first, second = slice(PREFIX, PREFIX + 12), slice(t.second, t.second + 12)
    assert torch.equal(t.copy[:, first], t.copy[:, second]) and torch.equal(t.control[:, second], t.copy[:, second])
    assert bool((t.control[:, first] != t.copy[:, first]).all())  # the control's first span differs at every byte
    assert set(bytes(t.copy[:, first].flatten().tolist()).decode()) <= set(ALPHABET)
    outside = torch.ones(t.copy.shape[1], dtype=torch.bool)
    outside[first] = False
    assert torch.equal(t.copy[:, outside], t.control[:, outside])  # the same text and positions elsewhere
    again = make_trials(text, 40, trials=5, span=12, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again.copy, t.copy) and torch.equal(again.control, t.control)


def test_a_model_built_to_copy_retrieves_the_planted_span_at_every_distance(text):
    copier = Copier()
    for distance in (24, 112, 400):
        t = make_trials(text, distance, trials=4, span=16, generator=torch.Generator().manual_seed(distance))
        scores = retrieval_scores(copier, t, batch_rows=3)
        assert scores["predictions"] == 4 * 15
        # all but the first k - 1 = 2 of the 15 scored bytes (their last 3 bytes reach back into the text)
        assert scores["copy_accuracy"] >= 13 / 15 - 1e-9 and scores["control_accuracy"] < 0.2, scores
        assert scores["gain"] > 3.0, scores  # ln 256 ≈ 5.5 nats without a match, near 0 with one


def test_a_model_that_cannot_copy_gains_nothing(text):
    """An untrained decoder predicts the same (nearly uniform) distribution whether or not the span was
    planted before: no gain, at short distances and long ones."""
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=256, hidden_size=32, num_layers=1, num_heads=2, max_position=1024)).eval()
    copier_gains = []
    for distance in (24, 400):
        t = make_trials(text, distance, trials=4, span=16, generator=torch.Generator().manual_seed(distance))
        scores = retrieval_scores(model, t)
        assert abs(scores["gain"]) < 0.01 and math.isfinite(scores["copy_loss"]), scores
        assert scores["copy_loss"] == pytest.approx(math.log(256), abs=0.1)
        copier_gains.append(retrieval_scores(Copier(), t)["gain"])
    assert min(copier_gains) > 100 * 0.01  # the same trials separate the two models


def test_distances_must_fit():
    assert longest_distance(1024, 16) == 1024 - PREFIX - 16
    with pytest.raises(ValueError, match="shorter than the span"):
        make_trials(torch.zeros(1000, dtype=torch.int64), 8, trials=1, span=16, generator=torch.Generator())
    with pytest.raises(ValueError, match="fewer than one trial"):
        make_trials(torch.zeros(100, dtype=torch.int64), 80, trials=1, span=16, generator=torch.Generator())
