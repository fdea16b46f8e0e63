"""A smooth long-range retrieval probe: a random span repeated at distance ``d``.

Passkey retrieval is all or nothing and cannot rank encodings that all score 0%; this probe measures the same
ability as a loss. A copy is held-out text with a span of random letters and digits written in twice, ``d``
bytes apart; its control has a different first span at the same places. The scored bytes are the 2nd to last
of the second span, so ``gain = loss(control) - loss(copy)`` (nats per byte, 0 to ln 62) isolates retrieval:
a model that breaks past its training length loses on both alike.
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
    """The longest distance whose trial fits in ``length`` tokens: ``length - PREFIX - span``."""
    return length - PREFIX - span


@dataclass(frozen=True)
class RetrievalTrials:
    """The trials of one ``distance`` (first byte of the first span to first byte of the second): ``copy``
    and ``control`` int64 ``[N, PREFIX + distance + span]``, the control with another first span.
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
    """``trials`` copies and controls at ``distance`` from uint8 or int64 ``text`` ``[T]`` at random offsets.

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
    """Loss and top-1 accuracy on the second span of the copies and the controls, given ``logits``:
    ``tokens [B, S] int64 -> [B, S', V]`` (the last ``S' >= span - 1`` positions);
    the keys of :class:`~.rows.RetrievalRow`.
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
