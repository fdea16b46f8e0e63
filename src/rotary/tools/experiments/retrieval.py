"""A smooth long-range retrieval probe: a random span repeated at distance ``d``.

Passkey retrieval is all or nothing per prompt, and a small model learns it abruptly, late in
training or not at all; it cannot rank encodings that all score 0%. This probe measures the same
ability, finding an earlier copy and reading it back, as a loss that moves continuously.

One trial, and its control, are held-out text with a span of random letters and digits written in
twice (the copy) or two different spans at the same places (the control)::

    copy:     text (32 bytes) | span A | text ... | span A        the second A can be read off the first
    control:  text (32 bytes) | span B | text ... | span A        same text, same positions, nothing to read
              <------------------- d ------------------>

The scored bytes are the 2nd to last of the second span (its first byte follows ordinary text and
cannot be retrieved), at the same positions in both. Without retrieval a model can only guess them:
its loss is the same on the copy and on the control. The **retrieval gain** is

    gain = loss(control) - loss(copy)      (nats per byte; 0: nothing retrieved, up to ln 62 ≈ 4.1)

Because the control shares every position with the copy, a model that breaks at positions past its
training length loses on both alike: the gain isolates retrieval from that breakage. Spans use the
62 ASCII letters and digits; span B differs from span A at every byte.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...errors import InputError

__all__ = ["ALPHABET", "PREFIX", "RetrievalTrials", "longest_distance", "make_trials", "retrieval_scores"]

ALPHABET = string.ascii_letters + string.digits
#: bytes of text before the first span, so that it does not sit at position 0
PREFIX = 32


def longest_distance(length: int, span: int) -> int:
    """The longest distance whose trial fits in ``length`` tokens: ``length - PREFIX - span``.

    Example:
        >>> longest_distance(1024, 16)
        976
    """
    return length - PREFIX - span


@dataclass(frozen=True)
class RetrievalTrials:
    """The trials of one distance.

    Attributes:
        distance: from the first byte of the first span to the first byte of the second.
        span: bytes per span.
        copy: int64 ``[N, S]`` with ``S = PREFIX + distance + span``: the sequences with the span twice.
        control: int64 ``[N, S]``: the same sequences with another span first.
    """

    distance: int
    span: int
    copy: torch.Tensor
    control: torch.Tensor

    @property
    def second(self) -> int:
        """Index of the second span's first byte."""
        return PREFIX + self.distance

    @property
    def length(self) -> int:
        """Tokens per sequence."""
        return self.copy.shape[1]


def make_trials(
    text: torch.Tensor, distance: int, *, trials: int, span: int, generator: torch.Generator
) -> RetrievalTrials:
    """``trials`` copies and controls at ``distance``, the text taken from ``text`` at random offsets.

    Args:
        text: uint8 or int64 ``[T]`` held-out bytes, ``T >= PREFIX + distance + span``.
        distance: at least ``span`` (the spans do not overlap).
        trials: sequences.
        span: bytes per span.
        generator: the trials are a function of its state (the same for every model of a run).

    Example:
        >>> text = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 8))
        >>> t = make_trials(text, 20, trials=2, span=4, generator=torch.Generator().manual_seed(0))
        >>> same = torch.equal(t.copy[:, 32:36], t.copy[:, 52:56])
        >>> t.copy.shape, same, bool((t.control[:, 32:36] != t.copy[:, 32:36]).all())
        (torch.Size([2, 56]), True, True)
    """
    if distance < span:
        raise InputError(f"distance {distance} is shorter than the span {span}: the two copies would overlap")
    length = PREFIX + distance + span
    if text.numel() < length:
        raise InputError(f"the text has {text.numel()} tokens, fewer than one trial of {length}")
    alphabet = torch.tensor(list(ALPHABET.encode()), dtype=torch.int64)
    copies, controls = [], []
    for _ in range(trials):
        offset = int(torch.randint(text.numel() - length + 1, (1,), generator=generator))
        sequence = text[offset : offset + length].to(torch.int64).clone()
        a = torch.randint(len(alphabet), (span,), generator=generator)
        b = (a + torch.randint(1, len(alphabet), (span,), generator=generator)) % len(
            alphabet
        )  # differs from a everywhere
        sequence[PREFIX + distance :] = alphabet[a]
        copy, control = sequence.clone(), sequence.clone()
        copy[PREFIX : PREFIX + span] = alphabet[a]
        control[PREFIX : PREFIX + span] = alphabet[b]
        copies.append(copy)
        controls.append(control)
    return RetrievalTrials(distance, span, torch.stack(copies), torch.stack(controls))


@torch.no_grad()
def retrieval_scores(
    logits: Callable[[torch.Tensor], torch.Tensor], trials: RetrievalTrials, *, batch_rows: int = 16
) -> dict[str, float]:
    """Loss and accuracy on the second span of the copies and of the controls.

    Args:
        logits: ``tokens [B, S] int64 -> logits [B, S', V]`` of the last ``S'`` positions, all of them
            (a ``Decoder`` in eval mode, or any model) or at least the ``span - 1`` scored ones (the
            scored queries are the last positions of the tokens it is given).
        trials: from :func:`make_trials`.
        batch_rows: sequences per call.

    Returns:
        ``{"copy_loss", "control_loss", "gain", "copy_accuracy", "control_accuracy", "predictions"}``:
        mean next-byte loss (nats) and top-1 accuracy over the scored bytes, ``gain = control_loss -
        copy_loss``, and the number of scored bytes per kind.
    """
    start, stop = trials.second, trials.second + trials.span  # targets start + 1 .. stop - 1
    out = {}
    for kind, sequences in (("copy", trials.copy), ("control", trials.control)):
        losses, hits = [], []
        for first in range(0, sequences.shape[0], batch_rows):
            chunk = sequences[first : first + batch_rows]
            device_logits = logits(chunk[:, : stop - 1])  # [b, <= stop - 1, V]: query q predicts token q + 1
            # [b, span - 1, V]: queries start .. stop - 2, the last span - 1 of the tokens given
            scored = device_logits[:, device_logits.shape[1] - (stop - 1 - start) :].float().cpu()
            targets = chunk[:, start + 1 : stop]
            losses.append(F.cross_entropy(scored.reshape(-1, scored.shape[-1]), targets.reshape(-1), reduction="none"))
            hits.append((scored.argmax(-1) == targets).reshape(-1).float())
        loss, hit = torch.cat(losses).double(), torch.cat(hits).double()
        out[f"{kind}_loss"] = float(loss.mean())
        out[f"{kind}_accuracy"] = float(hit.mean())
        out["predictions"] = loss.numel()
    gain = out["control_loss"] - out["copy_loss"]
    out["gain"] = gain if math.isfinite(gain) else math.nan
    return out
