"""The passkey generator and scorer: an oracle scores 1, a constant guess about 0, keys only where put."""

import re

import pytest
import torch

from rotary.tools.experiments.passkey import (
    FILLER,
    KEY_DIGITS,
    NEEDLE,
    QUESTION,
    make_sample,
    make_trials,
    min_sample_length,
    passkey_accuracy,
    random_key,
    score,
)


def text(tokens: torch.Tensor) -> str:
    return bytes(tokens.tolist()).decode("ascii")


def oracle(prompts: torch.Tensor) -> torch.Tensor:
    """Reads the key out of each prompt, as a model that retrieves perfectly would."""
    keys = [re.search(r"The pass key is (\d{5})\. ", text(p)).group(1) for p in prompts]
    return torch.tensor([[ord(c) for c in k] for k in keys])


@pytest.mark.parametrize("length", [min_sample_length(), 200, 1024])
def test_oracle_scores_one_and_constant_guess_about_zero(length):
    trials = make_trials(length, 60, [0.0, 0.25, 0.5, 0.75, 1.0], torch.Generator().manual_seed(length))
    assert passkey_accuracy(oracle, trials, batch_size=7)["accuracy"] == 1.0
    guess = passkey_accuracy(lambda p: torch.full((p.shape[0], KEY_DIGITS), ord("7")), trials)
    assert guess["accuracy"] <= 1 / 60  # "77777" can be a key, with probability 1e-5 per trial

    # an answer off by one digit scores nothing: the match is exact
    def off_by_one(p):
        out = oracle(p)
        out[:, -1] = (out[:, -1] - ord("0") + 1) % 10 + ord("0")
        return out

    assert passkey_accuracy(off_by_one, trials)["accuracy"] == 0.0


def test_samples_have_the_exact_length_and_the_key_only_in_the_key_sentence():
    g = torch.Generator().manual_seed(0)
    for length in (min_sample_length(), 128, 333, 1000):
        for depth in (0.0, 0.3, 1.0):
            key = random_key(g)
            s = make_sample(length, key, depth, filler_offset=int(torch.randint(1000, (1,), generator=g)))
            assert s.tokens.shape == (length,)
            prompt = text(s.prompt)
            assert text(s.tokens).endswith(QUESTION + key)
            needle = NEEDLE.format(key=key)
            assert prompt.count(needle) == 1
            assert prompt.index(needle) == s.needle_start
            # the filler (everything but the key sentence and the question) holds no digit at all
            filler = prompt.replace(needle, "").replace(QUESTION, "")
            assert not any(c.isdigit() for c in filler)
            assert all(c in FILLER for c in set(filler))


def test_depth_places_the_key_sentence_from_start_to_question():
    key = "31415"
    length = 400
    start = make_sample(length, key, 0.0)
    end = make_sample(length, key, 1.0)
    assert start.needle_start == 0
    assert text(end.prompt).endswith(NEEDLE.format(key=key) + QUESTION)
    middle = make_sample(length, key, 0.5).needle_start
    assert 0 < middle < end.needle_start


def test_trials_spread_over_depths_and_keys_vary():
    trials = make_trials(150, 50, [0.0, 0.5, 1.0], torch.Generator().manual_seed(3))
    depths = [t.depth for t in trials]
    assert {d: depths.count(d) for d in set(depths)} == {0.0: 17, 0.5: 17, 1.0: 16}
    assert len({t.key for t in trials}) > 45
    assert all(len(t.key) == KEY_DIGITS and t.key.isdigit() for t in trials)
    # leading zeros are keys too: the key is any 5-digit string
    keys = [random_key(torch.Generator().manual_seed(i)) for i in range(400)]
    assert any(k.startswith("0") for k in keys)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="at least 110 tokens"):
        make_sample(50, "12345", 0.5)
    with pytest.raises(ValueError, match="5 decimal digits"):
        make_sample(200, "1234a", 0.5)
    with pytest.raises(ValueError, match="depth"):
        make_sample(200, "12345", 1.5)
    with pytest.raises(ValueError, match="2 answers for 1 keys"):
        score(["1", "2"], ["1"])
    trials = make_trials(120, 2, [0.0], torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="shape"):
        passkey_accuracy(lambda p: torch.zeros(p.shape[0], 3, dtype=torch.long), trials)
