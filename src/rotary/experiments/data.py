"""The text the models learn from and are measured on, as bytes (vocabulary 256, no tokenizer).

The default is the English documentation CPython ships in ``pydoc_data.topics`` (about 0.47 MB, PSF
licence): it is on every machine with Python, so nothing is downloaded. ``--data FILE`` takes any
UTF-8 text instead. Either way the text is split by position: the first part trains, the last
``held_out_fraction`` is only ever evaluated.

Training batches are drawn per step from a generator seeded by ``(seed, step)``, so step ``k``'s batch
is the same whether a run started at 0 or resumed at ``k``, and whatever the number of processes:
each rank takes its own contiguous rows of the same global batch.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ExperimentConfig, ExperimentError
from .passkey import FILLER, make_sample, min_sample_length, random_key

__all__ = [
    "DEFAULT_SOURCE",
    "Corpus",
    "derived_seed",
    "evaluation_tokens",
    "first_invalid_utf8",
    "load_corpus",
    "read_text",
    "required_bytes",
    "split",
    "training_batch",
    "windows",
]

DEFAULT_SOURCE = "pydoc_data.topics"


@dataclass(frozen=True)
class Corpus:
    """A text as bytes, split by position.

    Attributes:
        source: ``"pydoc_data.topics"`` or the path given with ``--data``.
        sha256: hex digest of the whole text (identifies it in results and on ``--resume``).
        train: uint8 ``[N_train]`` byte values, the first part of the text (one byte per token in
            memory; :func:`training_batch` widens each batch to int64).
        held_out: uint8 ``[N_held_out]``, the rest (:func:`evaluation_tokens` widens what is evaluated).
    """

    source: str
    sha256: str
    train: torch.Tensor
    held_out: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return self.train.numel() + self.held_out.numel()


def read_text(path: str | None) -> tuple[bytes, str]:
    """The raw bytes of ``path`` (checked to be non-empty UTF-8) or of ``pydoc_data.topics``.

    Returns:
        ``(data, source)``.

    Raises:
        ExperimentError: a missing file, a directory, an unreadable, empty or non-UTF-8 file.

    Example:
        >>> data, source = read_text(None)
        >>> source, len(data) > 100_000
        ('pydoc_data.topics', True)
    """
    if path is None:
        from pydoc_data.topics import topics

        # sorted: the order of a dict literal is the file's, but be explicit about it
        return "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8"), DEFAULT_SOURCE
    file = Path(path)
    if not file.exists():
        raise ExperimentError(f"--data {path}: no such file")
    if file.is_dir():
        raise ExperimentError(f"--data {path} is a directory; give a UTF-8 text file")
    if not file.is_file():  # /dev/zero, a pipe, a socket: reading could never end
        raise ExperimentError(f"--data {path} is not a regular file (a device, pipe or socket); give a UTF-8 text file")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ExperimentError(f"--data {path} cannot be read ({exc.strerror}); check its permissions") from None
    if not data:
        raise ExperimentError(f"--data {path} is empty; give a UTF-8 text file")
    bad = first_invalid_utf8(data)
    if bad is not None:
        raise ExperimentError(
            f"--data {path} is not UTF-8 text (byte 0x{data[bad]:02x} at offset {bad}); convert it, e.g. with iconv -t UTF-8"
        )
    return data, str(path)


#: bytes decoded at a time when checking a text: the check never holds the whole text as a str
UTF8_CHUNK = 1 << 20


def first_invalid_utf8(data: bytes, chunk: int | None = None) -> int | None:
    r"""The offset of the first byte that is not valid UTF-8, or None; decodes ``chunk`` bytes at a
    time (default :data:`UTF8_CHUNK`), so a large text is never held twice (once as a str).

    Example:
        >>> first_invalid_utf8("Grüße".encode()), first_invalid_utf8(b"caf\xe9 au lait"), first_invalid_utf8(b"ab\xc3", chunk=2)
        (None, 3, 2)
    """
    import codecs

    size = chunk or UTF8_CHUNK
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for start in range(0, len(data), size):
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
        try:
            decoder.decode(view[start : start + size], final=start + size >= len(data))
        except UnicodeDecodeError as exc:
            return start - pending + exc.start
    return None


def _split_sizes(num_bytes: int, held_out_fraction: float) -> tuple[int, int]:
    held_out = math.floor(num_bytes * held_out_fraction)
    return num_bytes - held_out, held_out


def required_bytes(config: ExperimentConfig) -> int:
    """The fewest bytes a text needs: the held-out part must hold one window of the longest length
    and the training part one row of ``L + 1`` tokens.

    Example:
        >>> required_bytes(ExperimentConfig(train_length=128, held_out_fraction=0.1))
        10240
    """
    n = max(math.ceil(config.longest / config.held_out_fraction), config.train_length + 1)
    while True:  # floor() in the split can leave one byte short: step up to the first size that fits
        train, held_out = _split_sizes(n, config.held_out_fraction)
        if held_out >= config.longest and train >= config.train_length + 1:
            return n
        n += 1


def split(data: bytes, source: str, held_out_fraction: float) -> Corpus:
    """Split ``data`` by position: the last ``floor(len * held_out_fraction)`` bytes are held out.

    Example:
        >>> c = split(b"abcdefghij", "x", 0.2)
        >>> bytes(c.train.tolist()), bytes(c.held_out.tolist())
        (b'abcdefgh', b'ij')
    """
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # one copy of the text, one byte per token
    n_train, _ = _split_sizes(len(data), held_out_fraction)
    return Corpus(source, hashlib.sha256(data).hexdigest(), tokens[:n_train], tokens[n_train:])


def load_corpus(config: ExperimentConfig) -> Corpus:
    """Read, check and split the text ``config.data`` names.

    Raises:
        ExperimentError: as :func:`read_text`, or a text too short for the windows asked for (the
            message says how many bytes are needed).
    """
    data, source = read_text(config.data)
    needed = required_bytes(config)
    if len(data) < needed:
        name = f"--data {config.data}" if config.data else DEFAULT_SOURCE
        raise ExperimentError(
            f"{name} has {len(data)} bytes, too short: evaluating windows of {config.longest} tokens on the held-out "
            f"{config.held_out_fraction:g} of the text needs at least {needed} bytes; give a longer text or a "
            "smaller --train-length / --eval-lengths"
        )
    return split(data, source, config.held_out_fraction)


def evaluation_tokens(corpus: Corpus, config: ExperimentConfig) -> torch.Tensor:
    """The held-out tokens every evaluation length is measured on: the longest multiple of the
    longest length that fits in ``eval_tokens`` (or in the whole held-out part), so that every length
    sees the same text. int64 ``[T]``."""
    available = corpus.held_out.numel() if config.eval_tokens is None else min(config.eval_tokens, corpus.held_out.numel())
    usable = available // config.longest * config.longest
    return corpus.held_out[:usable].to(torch.int64)


def windows(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows ``[N, length]`` of ``tokens [T]`` (a shorter tail is dropped).

    Example:
        >>> windows(torch.arange(7), 3)
        tensor([[0, 1, 2],
                [3, 4, 5]])
    """
    count = tokens.numel() // length
    return tokens[: count * length].view(count, length)


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes and Python versions, unlike ``hash``).

    Example:
        >>> derived_seed(0, "batch", 7) == derived_seed(0, "batch", 7) != derived_seed(0, "batch", 8)
        True
    """
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def training_batch(train: torch.Tensor, step: int, config: ExperimentConfig, seed: int) -> torch.Tensor:
    """The global training batch of ``step``: int64 ``[batch_size, L + 1]`` (inputs and shifted targets)
    from the uint8 (or int64) text ``train [N]``; only the batch is widened to int64.

    Every row is a random window of the training text; a ``passkey_fraction`` of the rows (chosen at
    random) end with a passkey sample of random length in ``[min_sample_length(), L]``, random depth
    and random key, so the model can learn to retrieve keys over distances up to ``L``.

    Example:
        >>> cfg = ExperimentConfig(preset="tiny", train_length=128, batch_size=4, passkey_fraction=0.5)
        >>> batch = training_batch(torch.randint(256, (1000,)), 0, cfg, seed=0)
        >>> batch.shape
        torch.Size([4, 129])
    """
    g = torch.Generator().manual_seed(derived_seed(seed, "batch", step))
    rows, length = config.batch_size, config.train_length + 1
    starts = torch.randint(train.numel() - length + 1, (rows,), generator=g)
    batch = torch.stack([train[s : s + length] for s in starts.tolist()]).to(torch.int64)
    with_passkey = torch.randperm(rows, generator=g)[: round(rows * config.passkey_fraction)]
    for row in sorted(with_passkey.tolist()):
        size = int(torch.randint(min_sample_length(), config.train_length + 1, (1,), generator=g))
        depth = float(torch.rand((), generator=g))
        key = random_key(g)
        offset = int(torch.randint(len(FILLER), (1,), generator=g))
        batch[row, length - size :] = make_sample(size, key, depth, offset).tokens
    return batch
