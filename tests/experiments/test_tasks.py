"""The synthetic tasks: rows that say what they claim (the copy is the string, each recalled value is the one
that followed its key), the same rows for the same seed, scores that an oracle aces and a wrong model fails,
and bad sizes refused with the value to change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rotary.errors import InputError
from rotary.tools.experiments.config import ExperimentConfig
from rotary.tools.experiments.tasks import (
    END,
    IGNORE,
    KEYS,
    LETTERS,
    SEPARATOR,
    VALUES,
    copy_batch,
    copy_range,
    induction_batch,
    make_batch,
    task_scores,
    task_training_batch,
    task_trials,
)


def test_a_copy_row_is_the_string_a_separator_and_the_string_again_scored_on_the_copy():
    for training, length in ((True, 32), (False, 64), (False, 256)):
        batch = copy_batch(64, length, torch.Generator().manual_seed(length), training=training)
        lo, hi = copy_range(length, training=training)
        for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist()):
            n = inputs.index(SEPARATOR)
            assert lo <= n <= hi and set(inputs[:n]) <= set(LETTERS)
            assert inputs[n + 1 : 2 * n + 1] == inputs[:n]
            assert 2 * n + 1 == length or inputs[2 * n + 1] == END
            # the k-th copied letter is predicted at position n + k, and nothing else is scored
            assert [t for t in targets if t != IGNORE] == inputs[:n]
            assert all(t == IGNORE for t in targets[:n] + targets[2 * n :])
    # from 2L on every string is longer than any in training
    assert copy_range(64, training=False)[0] > copy_range(32, training=True)[1]


def test_an_induction_row_asks_each_key_again_for_the_value_that_followed_it():
    batch = induction_batch(64, 128, torch.Generator().manual_seed(1), pairs=4)
    for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist()):
        keys = [(i, v) for i, v in enumerate(inputs) if v in KEYS]
        assert len(keys) == 8 and len({v for _, v in keys}) == 4  # 4 distinct keys, each written and asked once
        first = {v: inputs[i + 1] for i, v in keys[:4]}
        assert all(i < 64 for i, _ in keys[:4]) and all(i >= 64 for i, _ in keys[4:])
        asked = {i: v for i, v in keys[4:]}
        assert {i for i, t in enumerate(targets) if t != IGNORE} == set(asked)
        assert all(targets[i] == first[v] and targets[i] in VALUES for i, v in asked.items())
        assert set(inputs) - set(KEYS) <= set(VALUES)


def test_the_rows_depend_on_the_seed_alone_and_training_alternates_the_tasks():
    cfg = ExperimentConfig(task_length=32)
    a, b = task_training_batch(7, cfg, 0, 6), task_training_batch(7, cfg, 0, 6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], task_training_batch(8, cfg, 0, 6)[0])
    assert not torch.equal(a[0], task_training_batch(7, cfg, 1, 6)[0])
    copies = [SEPARATOR in row for row in a[0].tolist()]
    assert copies == [True, False] * 3 and a[0].shape == (6, 32)
    trials = task_trials("induction", 64, ExperimentConfig(task_trials=5))
    assert trials.inputs.shape == (5, 64) and torch.equal(
        trials.inputs, task_trials("induction", 64, ExperimentConfig(task_trials=5)).inputs
    )


def test_an_oracle_gets_every_answer_and_a_model_one_byte_off_gets_none():
    batch = make_batch("copy", 10, 40, torch.Generator().manual_seed(0), training=False)
    answers = batch.targets.clamp(min=0)
    oracle = task_scores(lambda x: F.one_hot(answers[: x.shape[0]], 256).float() * 30, batch, batch_rows=10)
    assert oracle["correct"] == oracle["predictions"] == int(batch.scored.sum()) and oracle["exact"] == 10
    assert oracle["loss"] < 1e-3
    wrong = task_scores(lambda x: F.one_hot((answers[: x.shape[0]] + 1) % 256, 256).float(), batch, batch_rows=10)
    assert wrong["correct"] == 0 and wrong["exact"] == 0 and wrong["trials"] == 10


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: copy_range(8, training=True), "a copy row of 8 tokens holds no string of 4 letters; use at least 9"),
        (lambda: induction_batch(1, 12, torch.Generator(), pairs=4), "cannot hold 4 key-value pairs"),
        (lambda: induction_batch(1, 400, torch.Generator(), pairs=27), "use 1 to 26 pairs"),
        (lambda: make_batch("sort", 1, 32, torch.Generator()), "unknown task 'sort'; known: copy, induction"),
    ],
)
def test_bad_sizes_name_the_value_and_what_to_change(call, needle):
    with pytest.raises(InputError, match="") as info:
        call()
    assert needle in str(info.value)
