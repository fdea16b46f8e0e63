"""The text the models learn from and are measured on, as bytes (vocabulary 256, no tokenizer).

The sources (:mod:`.sources`): CPython's ``pydoc_data.topics`` by default, ``--data`` files or patterns of
UTF-8 text, or ``builtin:stdlib``; nothing is downloaded. The first part trains, the last
``held_out_fraction`` is only evaluated. Batches come from a generator seeded by ``(seed, length, step)``:
step ``k``'s batch is the same after a resume and on any number of processes (each rank takes its rows).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from .config import ExperimentConfig, ExperimentError
from .passkey import FILLER, make_sample, min_sample_length, random_key
from .sources import DEFAULT_SOURCE, first_invalid_utf8, read_sources

__all__ = [
    "DEFAULT_SOURCE",
    "Corpus",
    "derived_seed",
    "evaluation_tokens",
    "first_invalid_utf8",
    "load_corpus",
    "required_bytes",
    "sliding_starts",
    "split",
    "training_batch",
    "windows",
]


@dataclass(frozen=True)
class Corpus:
    """A text as bytes split by position: ``train`` and ``held_out`` uint8; ``sha256`` of the whole (checked on
    ``--resume``); ``files`` read and ``skipped`` (not UTF-8 text).
    """

    source: str
    sha256: str
    train: torch.Tensor
    held_out: torch.Tensor
    files: int = 1
    skipped: int = 0

    @property
    def num_bytes(self) -> int:
        return self.train.numel() + self.held_out.numel()


def _split_sizes(num_bytes: int, held_out_fraction: float) -> tuple[int, int]:
    held_out = math.floor(num_bytes * held_out_fraction)
    return num_bytes - held_out, held_out


def required_bytes(config: ExperimentConfig) -> int:
    """The fewest bytes a text needs: one training (and extension) batch and the evaluation's windows.

    >>> required_bytes(ExperimentConfig(train_length=128, held_out_fraction=0.1, sliding_tokens=0))
    10240
    """
    train_needed = config.batch_size * (config.train_length + 1)
    if config.extends:
        train_needed = max(train_needed, config.extension_rows * (config.extension_length + 1))
    held_needed = config.longest * math.ceil((config.longest + config.sliding_tokens) / config.longest)
    n = max(math.ceil(held_needed / config.held_out_fraction), train_needed)
    while True:  # floor() in the split can leave one byte short: step up to the first size that fits
        train, held_out = _split_sizes(n, config.held_out_fraction)
        if held_out >= held_needed and train >= train_needed:
            return n
        n += 1


def split(data: bytes, source: str, held_out_fraction: float, files: int = 1, skipped: int = 0) -> Corpus:
    """Split ``data`` by position: the last ``floor(len * held_out_fraction)`` bytes are held out.

    >>> c = split(b"abcdefghij", "x", 0.2)
    >>> bytes(c.train.tolist()), bytes(c.held_out.tolist())
    (b'abcdefgh', b'ij')
    """
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # one copy of the text, one byte per token
    n_train, _ = _split_sizes(len(data), held_out_fraction)
    return Corpus(source, hashlib.sha256(data).hexdigest(), tokens[:n_train], tokens[n_train:], files, skipped)


def load_corpus(config: ExperimentConfig) -> Corpus:
    """Read, check and split the text ``config.data`` names; ExperimentError as :func:`~.sources.read_sources`,
    or for a text too short (naming the bytes needed).
    """
    text = read_sources(config.data)
    needed = required_bytes(config)
    if len(text.data) < needed:
        extension = f" and {config.extension_rows} rows of {config.extension_length + 1}" if config.extends else ""
        raise ExperimentError(
            f"--data {text.source} has {len(text.data)} bytes, too short: one training batch ({config.batch_size} "
            f"rows of {config.train_length + 1} bytes{extension}) in the first {1 - config.held_out_fraction:g} of "
            f"the text, and a window of {config.longest} plus {config.sliding_tokens} sliding-window bytes in the "
            f"held-out rest, need at least {needed} bytes; give a longer text, or a smaller --batch-size, "
            "--train-length, --eval-lengths or --sliding-tokens"
        )
    return split(text.data, text.source, config.held_out_fraction, text.files, text.skipped)


def evaluation_tokens(corpus: Corpus, config: ExperimentConfig) -> torch.Tensor:
    """The held-out tokens every length is measured on, int64 ``[T]``: the longest multiple of the longest length
    that fits in ``eval_tokens``.
    """
    available = (
        corpus.held_out.numel() if config.eval_tokens is None else min(config.eval_tokens, corpus.held_out.numel())
    )
    usable = available // config.longest * config.longest
    return corpus.held_out[:usable].to(torch.int64)


def sliding_starts(config: ExperimentConfig, total: int) -> tuple[int, ...]:
    """Where the sliding windows' scored strides begin, spread over the ``total`` tokens past the longest window.

    >>> sliding_starts(ExperimentConfig(train_length=128, eval_stride=64, sliding_tokens=256), 2048)
    (1024, 1280, 1536, 1792)
    """
    candidates = (total - config.longest) // config.stride
    count = min(config.sliding_tokens // config.stride, candidates)
    return tuple(config.longest + (i * candidates // count) * config.stride for i in range(count)) if count else ()


def windows(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows ``[N, length]`` of ``tokens [T]`` (a shorter tail is dropped)."""
    count = tokens.numel() // length
    return tokens[: count * length].view(count, length)


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes and Python versions, unlike ``hash``).

    >>> derived_seed(0, "batch", 7) == derived_seed(0, "batch", 7) != derived_seed(0, "batch", 8)
    True
    """
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def training_batch(
    train: torch.Tensor,
    step: int,
    config: ExperimentConfig,
    seed: int,
    *,
    rows: int | None = None,
    length: int | None = None,
) -> torch.Tensor:
    """The global training batch of ``step``: int64 ``[rows, length + 1]`` from the uint8 (or int64) text ``train``.

    Random windows; a ``passkey_fraction`` of the rows end with a passkey sample. ``rows`` defaults to
    ``batch_size``, ``length`` to ``L``.

    >>> cfg = ExperimentConfig(preset="tiny", train_length=128, batch_size=4, passkey_fraction=0.5)
    >>> training_batch(torch.randint(256, (1000,)), 0, cfg, seed=0, rows=1, length=512).shape
    torch.Size([1, 513])
    """
    rows = config.batch_size if rows is None else rows
    window = config.train_length if length is None else length
    stream = (seed, "batch", step) if window == config.train_length else (seed, "batch", window, step)
    g = torch.Generator().manual_seed(derived_seed(*stream))
    length = window + 1
    starts = torch.randint(train.numel() - length + 1, (rows,), generator=g)
    batch = torch.stack([train[s : s + length] for s in starts.tolist()]).to(torch.int64)
    with_passkey = torch.randperm(rows, generator=g)[: round(rows * config.passkey_fraction)]
    for row in sorted(with_passkey.tolist()):
        size = int(torch.randint(min_sample_length(), window + 1, (1,), generator=g))
        depth = float(torch.rand((), generator=g))
        key = random_key(g)
        offset = int(torch.randint(len(FILLER), (1,), generator=g))
        batch[row, length - size :] = make_sample(size, key, depth, offset).tokens
    return batch
