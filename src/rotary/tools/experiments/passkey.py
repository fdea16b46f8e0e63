"""Passkey retrieval ("Landmark Attention: Random-Access Infinite Context Length for Transformers"): a random
5-digit key hidden in filler.

A sample of an exact length: filler, "The pass key is 41279. Remember it. 41279 is the pass key. ", filler,
"What is the pass key? The pass key is ", then the answer. ``depth`` is the fraction of the filler before the key
sentence; the filler has no digit. Scored by exact match of the generated digits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...errors import InputError

__all__ = [
    "FILLER",
    "KEY_DIGITS",
    "NEEDLE",
    "QUESTION",
    "PasskeySample",
    "make_sample",
    "make_trials",
    "min_sample_length",
    "passkey_accuracy",
    "random_key",
    "score",
]

KEY_DIGITS = 5
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is "
FILLER = (
    "The grass grows by the river. The sky turns grey before the rain. A cat sleeps on the warm wall. "
    "The train leaves the station on time. Leaves fall slowly in the park. "
)
#: the shortest filler a sample may have
MIN_FILLER = 8

# the promise the scorer relies on: nothing but the key sentence can put digits into a prompt
assert not any(c.isdigit() for c in FILLER + QUESTION + NEEDLE.format(key=""))


def min_sample_length() -> int:
    """Tokens (bytes) of the shortest sample: key sentence, question, answer and a little filler."""
    return len(NEEDLE.format(key="0" * KEY_DIGITS)) + len(QUESTION) + KEY_DIGITS + MIN_FILLER


@dataclass(frozen=True)
class PasskeySample:
    """One trial: ``tokens`` int64 ``[length]`` (prompt, then the key's digits), the ``key``, its ``depth``, and
    ``needle_start``, the key sentence's first byte.
    """

    tokens: torch.Tensor
    key: str
    depth: float
    needle_start: int

    @property
    def prompt(self) -> torch.Tensor:
        """int64 ``[length - KEY_DIGITS]``: everything before the answer."""
        return self.tokens[:-KEY_DIGITS]


def _filler(offset: int, length: int) -> str:
    start = offset % len(FILLER)
    repeats = (start + length) // len(FILLER) + 1
    return (FILLER * repeats)[start : start + length]


def make_sample(length: int, key: str, depth: float, filler_offset: int = 0) -> PasskeySample:
    """A sample of exactly ``length`` tokens (answer included) with ``key`` at ``depth`` in [0, 1].

    >>> s = make_sample(120, "12345", 0.5)
    >>> s.tokens.shape, bytes(s.tokens.tolist()).decode()[-10:]
    (torch.Size([120]), 'y is 12345')
    """
    if len(key) != KEY_DIGITS or not key.isdigit() or not key.isascii():
        raise InputError(f"key must be {KEY_DIGITS} decimal digits, got {key!r}")
    if not 0.0 <= depth <= 1.0:
        raise InputError(f"depth must be in [0, 1], got {depth!r}")
    needle = NEEDLE.format(key=key)
    filler_length = length - len(needle) - len(QUESTION) - KEY_DIGITS
    if filler_length < MIN_FILLER:
        raise InputError(f"a passkey sample needs at least {min_sample_length()} tokens, got length {length}")
    before = round(depth * filler_length)
    text = (
        _filler(filler_offset, before)
        + needle
        + _filler(filler_offset + before, filler_length - before)
        + QUESTION
        + key
    )
    data = text.encode("ascii")
    assert len(data) == length
    return PasskeySample(torch.tensor(list(data), dtype=torch.int64), key, float(depth), before)


def random_key(generator: torch.Generator) -> str:
    """A uniformly random key of ``KEY_DIGITS`` digits (leading zeros allowed)."""
    return f"{int(torch.randint(10**KEY_DIGITS, (1,), generator=generator)):0{KEY_DIGITS}d}"


def make_trials(length: int, trials: int, depths: Sequence[float], generator: torch.Generator) -> list[PasskeySample]:
    """``trials`` samples of ``length`` tokens with random keys; trial ``i`` at ``depths[i % len(depths)]``.

    >>> [t.depth for t in make_trials(120, 4, [0.0, 1.0], torch.Generator().manual_seed(0))]
    [0.0, 1.0, 0.0, 1.0]
    """
    samples = []
    for i in range(trials):
        key = random_key(generator)
        offset = int(torch.randint(len(FILLER), (1,), generator=generator))
        samples.append(make_sample(length, key, float(depths[i % len(depths)]), offset))
    return samples


def score(answers: Sequence[str], keys: Sequence[str]) -> float:
    """Fraction of ``answers`` that equal their key exactly.

    >>> score(["12345", "12346", "1234"], ["12345", "12345", "12345"])
    0.3333333333333333
    """
    if len(answers) != len(keys):
        raise InputError(f"{len(answers)} answers for {len(keys)} keys")
    if not keys:
        raise InputError("no trials to score")
    return sum(a == k for a, k in zip(answers, keys)) / len(keys)


def passkey_accuracy(
    answer: Callable[[torch.Tensor], torch.Tensor], samples: Sequence[PasskeySample], *, batch_size: int = 16
) -> dict:
    """Score ``answer`` (``prompts [B, S] int64 -> [B, KEY_DIGITS] int64``) on ``samples`` of one length:
    ``{"accuracy", "correct", "trials", "by_depth": {depth: accuracy}, "counts": {depth: (correct, trials)}}``.

    >>> trials = make_trials(120, 4, [0.0, 1.0], torch.Generator().manual_seed(0))
    >>> guess = lambda prompts: torch.full((prompts.shape[0], KEY_DIGITS), ord("0"))  # always "00000"
    >>> passkey_accuracy(guess, trials, batch_size=4)["accuracy"]
    0.0
    """
    answers: list[str] = []
    for start in range(0, len(samples), batch_size):
        chunk = samples[start : start + batch_size]
        prompts = torch.stack([s.prompt for s in chunk])
        generated = answer(prompts)
        if generated.shape != (len(chunk), KEY_DIGITS):
            raise InputError(f"answer returned shape {tuple(generated.shape)}, expected {(len(chunk), KEY_DIGITS)}")
        answers.extend(bytes(row).decode("latin-1") for row in generated.clamp(0, 255).tolist())
    keys = [s.key for s in samples]
    by_depth: dict[float, list[bool]] = {}
    for s, a in zip(samples, answers):
        by_depth.setdefault(s.depth, []).append(a == s.key)
    return {
        "accuracy": score(answers, keys),
        "correct": sum(a == k for a, k in zip(answers, keys)),
        "trials": len(samples),
        "by_depth": {d: sum(v) / len(v) for d, v in sorted(by_depth.items())},
        "counts": {d: (sum(v), len(v)) for d, v in sorted(by_depth.items())},
    }
