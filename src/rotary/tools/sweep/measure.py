"""What the sweep measures on one model at one length: perplexity in two modes, and passkey retrieval.

Perplexity ``first`` (the first ``L`` tokens of each document, every target scored) and ``sliding`` (windows
every ``stride`` tokens scoring their last ``stride``), a token-weighted mean over documents with a 95%
interval from resampling documents. Passkey retrieval follows "Landmark Attention"'s prompt, built to exactly
``L`` tokens, answered greedily, with Wilson intervals. The protocol: docs/sweep.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...errors import InputError

__all__ = [
    "PASSKEY_PREFIX",
    "DocumentLosses",
    "PasskeyPrompts",
    "bootstrap",
    "passkey_length",
    "passkey_prompts",
    "passkey_scores",
    "perplexity",
    "window_losses",
]

PASSKEY_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
PASSKEY_FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
PASSKEY_QUESTION = " What is the pass key? The pass key is"
KEY_DIGITS = 5

#: fp32 logits the output layer produces per call (``chunk * V``), 256 MiB
LOGIT_BUDGET = 2**26


def logit_chunk(vocab_size: int) -> int:
    """Positions per call of the output layer: at most :data:`LOGIT_BUDGET` fp32 logits.

    >>> logit_chunk(256), logit_chunk(128256)
    (262144, 523)
    """
    return max(1, LOGIT_BUDGET // max(1, vocab_size))


def _output(model, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits of ``hidden`` ``[B, n, H]`` as the model's forward makes them (softcapping, scales)."""
    logits = model.get_output_embeddings()(hidden).float()
    c = model.config
    scale = getattr(c, "logit_scale", None)  # Cohere multiplies
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        logits = logits * scale
    divide = getattr(c, "logits_scaling", None)  # Granite divides
    if isinstance(divide, (int, float)) and not isinstance(divide, bool):
        logits = logits / divide
    cap = getattr(c, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@torch.no_grad()
def window_losses(model, windows: torch.Tensor, last: int, *, chunk: int | None = None) -> torch.Tensor:
    """Cross-entropy (nats) of the last ``last`` targets of int64 ``windows`` ``[N, L]``: fp32 ``[N, last]``,
    ``[i, j]`` the loss of token ``L - last + j``; the output layer runs ``chunk`` positions at a time.
    """
    n, length = windows.shape
    if not 1 <= last <= length - 1:
        raise InputError(f"a window of {length} tokens has 1 .. {length - 1} targets to score, got {last}")
    device = model.get_input_embeddings().weight.device
    ids = windows.to(device)
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state  # [N, L, H]
    hidden = hidden[:, length - 1 - last : length - 1]  # the positions that predict the scored targets
    targets = ids[:, length - last :]
    step = chunk or max(1, logit_chunk(model.config.get_text_config().vocab_size) // n)
    out = []
    for a in range(0, last, step):
        logits = _output(model, hidden[:, a : a + step])  # [N, step, V] fp32
        out.append(
            F.cross_entropy(logits.transpose(1, 2), targets[:, a : a + step].to(logits.device), reduction="none")
        )
    return torch.cat(out, dim=1).float().cpu()


@dataclass(frozen=True)
class DocumentLosses:
    """Summed loss (float64 nats) and scored tokens (int64) per document long enough, both ``[D]``."""

    sums: torch.Tensor
    counts: torch.Tensor

    @property
    def loss(self) -> float:
        """Token-weighted mean loss (nats)."""
        return float(self.sums.sum() / self.counts.sum())


def perplexity(
    model,
    documents: Sequence[torch.Tensor],
    length: int,
    mode: str,
    *,
    stride: int | None = None,
    max_windows: int = 8,
    rows: int = 1,
) -> DocumentLosses:
    """Per-document losses at ``length`` in ``mode`` ``"first"`` or ``"sliding"`` (see the module docstring).

    Args:
        documents: int64 ``[T_d]`` token ids each; those shorter than ``length`` are left out.
        stride, max_windows, rows: tokens a sliding window scores; windows per document; windows per forward.

    Raises:
        rotary.errors.InputError: no document has ``length`` tokens; a bad mode or stride.
    """
    usable = [d for d in documents if d.numel() >= length]
    if not usable:
        longest = max((d.numel() for d in documents), default=0)
        raise InputError(
            f"no document has {length} tokens (the longest has {longest}); give longer text "
            "with --data or shorter --lengths"
        )
    if mode == "first":
        wins = [(i, d[:length]) for i, d in enumerate(usable)]
        last = length - 1
    elif mode == "sliding":
        if stride is None or not 1 <= stride <= length - 1:
            raise InputError(f"--stride must be in 1 .. {length - 1} for windows of {length}, got {stride}")
        wins = []
        for i, d in enumerate(usable):
            ends = range(length, d.numel() + 1, stride)
            wins += [(i, d[end - length : end]) for end in list(ends)[:max_windows]]
        last = stride
    else:
        raise InputError(f"unknown perplexity mode {mode!r}; use 'first' or 'sliding'")
    sums = torch.zeros(len(usable), dtype=torch.float64)
    counts = torch.zeros(len(usable), dtype=torch.int64)
    for a in range(0, len(wins), rows):
        batch = wins[a : a + rows]
        losses = window_losses(model, torch.stack([w for _, w in batch]), last)  # [b, last]
        for (doc, _), row in zip(batch, losses):
            sums[doc] += row.double().sum()
            counts[doc] += row.numel()
    return DocumentLosses(sums, counts)


def bootstrap(losses: DocumentLosses, *, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the perplexity from resampling documents (one document: the value itself).

    >>> d = DocumentLosses(torch.tensor([10.0, 30.0], dtype=torch.float64), torch.tensor([10, 10]))
    >>> low, high = bootstrap(d)
    >>> e1, e2, e3 = (round(math.exp(x), 3) for x in (1.0, 2.0, 3.0))
    >>> e1 <= round(low, 3) <= e2 <= round(high, 3) <= e3
    True
    """
    d = losses.sums.numel()
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(d, (resamples, d), generator=g)  # [R, D]
    means = losses.sums[picks].sum(1) / losses.counts[picks].sum(1).double()
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return _exp(low), _exp(high)


def _exp(loss: float) -> float:
    return math.inf if loss > 700 else math.exp(loss)


@dataclass(frozen=True)
class PasskeyPrompts:
    """Passkey prompts of one length: ``ids`` int64 ``[N, length]``, each prompt's ``keys`` and ``depths`` (0 to 1)."""

    ids: torch.Tensor
    keys: list[str]
    depths: list[float]


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def passkey_length(tokenizer) -> int:
    """The shortest passkey prompt with ``tokenizer``, in tokens (no filler, the longest key sentence).

    >>> from rotary.tools.sweep.export import byte_tokenizer
    >>> passkey_length(byte_tokenizer())
    245
    """
    bos = 1 if getattr(tokenizer, "bos_token_id", None) is not None else 0
    needle = max(len(_encode(tokenizer, PASSKEY_NEEDLE.format(key=str(d) * KEY_DIGITS))) for d in range(10))
    return bos + len(_encode(tokenizer, PASSKEY_PREFIX)) + needle + len(_encode(tokenizer, PASSKEY_QUESTION))


def passkey_prompts(tokenizer, length: int, depths: Sequence[float], trials: int, *, seed: int = 0) -> PasskeyPrompts:
    """``trials`` prompts per depth of exactly ``length`` tokens; InputError when ``length`` cannot hold the
    prefix, the key sentence and the question.
    """
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    prefix, question = bos + _encode(tokenizer, PASSKEY_PREFIX), _encode(tokenizer, PASSKEY_QUESTION)
    filler_once = _encode(tokenizer, PASSKEY_FILLER)
    g = torch.Generator().manual_seed(seed * 1_000_003 + length)
    ids, keys, where = [], [], []
    for depth in depths:
        for _ in range(trials):
            key = f"{int(torch.randint(10**KEY_DIGITS, (1,), generator=g)):0{KEY_DIGITS}d}"
            needle = _encode(tokenizer, PASSKEY_NEEDLE.format(key=key))
            room = length - len(prefix) - len(needle) - len(question)
            if room < 0:
                raise InputError(
                    f"a passkey prompt needs at least {length - room} tokens with this tokenizer, got length {length}; "
                    "give longer --lengths or --no-passkey"
                )
            filler = filler_once * (room // max(1, len(filler_once)) + 1)
            before = round(depth * room)
            prompt = prefix + filler[:before] + needle + filler[: room - before] + question
            ids.append(torch.tensor(prompt, dtype=torch.int64))
            keys.append(key)
            where.append(float(depth))
    return PasskeyPrompts(torch.stack(ids), keys, where)


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation ``[B, new_tokens]`` of unpadded ``prompts`` ``[B, S]`` on the model's KV cache."""
    device = model.get_input_embeddings().weight.device
    out = model(input_ids=prompts.to(device), use_cache=True, logits_to_keep=1)
    past, tokens = out.past_key_values, [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        out = model(input_ids=tokens[-1], past_key_values=past, use_cache=True)
        past = out.past_key_values
        tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, dim=1).cpu()


def answer_matches(text: str, key: str) -> bool:
    """The answer is right when its first digits, after spaces, are the key (and no digit follows).

    >>> answer_matches(" 41279. Rem", "41279"), answer_matches("412790", "41279"), answer_matches("x", "41279")
    (True, False, False)
    """
    text = text.lstrip()
    digits = ""
    for ch in text:
        if not ch.isdigit():
            break
        digits += ch
    return digits == key


def passkey_scores(model, tokenizer, prompts: PasskeyPrompts, *, rows: int = 1) -> dict[float, tuple[int, int]]:
    """``{depth: (correct, trials)}`` of greedy answers to ``prompts``."""
    new_tokens = max(len(_encode(tokenizer, k)) for k in prompts.keys) + 2
    counts: dict[float, list[int]] = {}
    for a in range(0, len(prompts.keys), rows):
        generated = greedy(model, prompts.ids[a : a + rows], new_tokens)
        for i, row in enumerate(generated.tolist()):
            text = tokenizer.decode(row, skip_special_tokens=True)
            depth = prompts.depths[a + i]
            c = counts.setdefault(depth, [0, 0])
            c[0] += answer_matches(text, prompts.keys[a + i])
            c[1] += 1
    return {d: (c[0], c[1]) for d, c in sorted(counts.items())}
