"""The text: builtin:pydoc by default, or files, directories and glob patterns, or the standard library's
sources, as bytes split by position; batches by step."""

import hashlib
import sysconfig

import pytest
import torch

from rotary.tools.experiments.config import PRESETS, ExperimentConfig, ExperimentError
from rotary.tools.experiments.data import (
    evaluation_tokens,
    first_invalid_utf8,
    load_corpus,
    required_bytes,
    sliding_starts,
    split,
    training_batch,
    windows,
)
from rotary.tools.experiments.passkey import QUESTION
from rotary.tools.experiments.sources import read_sources


def tiny(**overrides) -> ExperimentConfig:
    return ExperimentConfig(**{**PRESETS["tiny"], **overrides})


def test_default_text_is_pydoc_topics_split_by_position():
    from pydoc_data.topics import topics

    corpus = load_corpus(tiny())
    data = "\n\n".join(topics[k] for k in sorted(topics)).encode()
    assert corpus.source == "builtin:pydoc" and corpus.num_bytes == len(data) and corpus.files == 1
    assert bytes(corpus.train.tolist()) + bytes(corpus.held_out.tolist()) == data
    assert corpus.held_out.numel() == int(len(data) * 0.1)
    assert corpus.sha256 == hashlib.sha256(data).hexdigest()


def test_user_file_round_trips(tmp_path):
    text = ("Grüße aus dem Text. " * 2000).encode("utf-8")
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    corpus = load_corpus(tiny(data=(str(path),)))
    assert corpus.source == str(path)
    assert bytes(torch.cat([corpus.train, corpus.held_out]).tolist()) == text


def test_several_files_directories_and_patterns_are_joined_in_the_order_given(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.txt").write_text("bee")
    (tmp_path / "d" / "sub" / "a.txt").write_text("ay")
    (tmp_path / "d" / ".hidden").write_text("never")
    (tmp_path / "d" / "binary.bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "d" / "__pycache__").mkdir()
    (tmp_path / "d" / "__pycache__" / "x.txt").write_text("never")
    (tmp_path / "one.md").write_text("one")
    (tmp_path / "two.md").write_text("two")
    text = read_sources([str(tmp_path / "one.md"), str(tmp_path / "d"), str(tmp_path / "*.md")])
    # the file, then the directory's files in sorted order (b.txt before sub/a.txt), then the pattern's matches
    assert text.data == b"one\nbee\nay\none\ntwo" and text.files == 5 and text.skipped == 1
    assert text.source == f"{tmp_path / 'one.md'} {tmp_path / 'd'} {tmp_path / '*.md'}"


def test_the_standard_library_corpus_is_every_py_file_of_the_running_python():
    text = read_sources(["builtin:stdlib"])
    assert text.files > 500 and len(text.data) > 10_000_000  # tens of MB, on every Python
    assert first_invalid_utf8(text.data) is None and b"def " in text.data[:100_000]
    root = sysconfig.get_paths()["stdlib"]
    assert (open(f"{root}/argparse.py", "rb").read()) in text.data
    assert read_sources(["builtin:stdlib"]).data == text.data  # the same bytes every time


def _file(directory, name: str, data: bytes):
    path = directory / name
    path.write_bytes(data)
    return path


def _empty_dir(directory):
    (directory / "empty").mkdir()
    (directory / "empty" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    return directory / "empty"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.txt", "no such file or directory"),
        (lambda d: d / "missing*.txt", "the pattern matches no file"),
        (_empty_dir, r"the directory holds no UTF-8 text \(1 file\(s\), none of them non-empty UTF-8 text\)"),
        (lambda d: _file(d, "empty.txt", b""), "is empty"),
        (
            lambda d: _file(d, "latin1.txt", "caf\xe9 ".encode("latin-1") * 5000),
            r"not UTF-8 text \(byte 0xe9 at offset 3\)",
        ),
        (lambda d: "builtin:nosuch", "unknown built-in corpus; known: builtin:pydoc, builtin:stdlib"),
    ],
)
def test_bad_sources_are_named(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(ExperimentError, match=message):
        load_corpus(tiny(data=(str(path),)))


def test_too_short_text_says_how_many_bytes(tmp_path):
    cfg = tiny()
    needed = required_bytes(cfg)
    path = tmp_path / "short.txt"
    path.write_bytes(b"x" * (needed - 1))
    with pytest.raises(ExperimentError, match=f"has {needed - 1} bytes, too short.*at least {needed} bytes"):
        load_corpus(tiny(data=(str(path),)))
    path.write_bytes(b"x" * needed)  # exactly enough is enough
    corpus = load_corpus(tiny(data=(str(path),)))
    assert corpus.held_out.numel() >= cfg.longest + cfg.sliding_tokens
    tokens = evaluation_tokens(corpus, cfg)
    assert tokens.numel() == 2 * cfg.longest  # whole windows of the longest length, room for the sliding strides
    assert len(sliding_starts(cfg, tokens.numel())) * cfg.stride == cfg.sliding_tokens


def test_the_training_part_must_hold_one_batch(tmp_path):
    """A text whose held-out part is long enough but whose training part holds less than one batch."""
    cfg = tiny(held_out_fraction=0.9, sliding_tokens=0)
    rows = cfg.batch_size * (cfg.train_length + 1)
    needed = required_bytes(cfg)
    assert split(b"x" * needed, "x", 0.9).train.numel() >= rows > split(b"x" * (needed - 1), "x", 0.9).train.numel()
    path = tmp_path / "t.txt"
    path.write_bytes(b"y" * (cfg.longest * 2))
    with pytest.raises(
        ExperimentError, match=f"one training batch \\({cfg.batch_size} rows of {cfg.train_length + 1} bytes"
    ):
        load_corpus(tiny(held_out_fraction=0.9, sliding_tokens=0, data=(str(path),)))


def test_evaluation_tokens_are_whole_windows_of_the_longest_length():
    cfg = tiny(eval_tokens=3 * 896 + 100)
    tokens = evaluation_tokens(load_corpus(cfg), cfg)
    assert tokens.numel() == 3 * 896
    assert windows(tokens, 112).shape == (24, 112)


def test_split_is_by_position_not_shuffled():
    corpus = split(bytes(range(100)), "x", 0.25)
    assert corpus.train.tolist() == list(range(75)) and corpus.held_out.tolist() == list(range(75, 100))


def test_batches_depend_on_seed_and_step_only():
    cfg = tiny(batch_size=8, passkey_fraction=0.5)
    train = load_corpus(cfg).train
    a = training_batch(train, 5, cfg, seed=0)
    assert torch.equal(a, training_batch(train, 5, cfg, seed=0))
    assert not torch.equal(a, training_batch(train, 6, cfg, seed=0))
    assert not torch.equal(a, training_batch(train, 5, cfg, seed=1))
    assert a.shape == (8, cfg.train_length + 1) and a.dtype == torch.int64
    # half the rows end with a passkey question and its 5-digit answer, fitting inside L tokens
    texts = [bytes(row.tolist()).decode("utf-8", errors="replace") for row in a]
    with_key = [t for t in texts if QUESTION in t[-(cfg.train_length) :]]
    assert len(with_key) == 4
    assert all(t[-5:].isdigit() for t in with_key)


def test_no_passkey_rows_when_the_fraction_is_zero():
    cfg = tiny(batch_size=16, passkey_fraction=0.0)
    batch = training_batch(load_corpus(cfg).train, 0, cfg, seed=0)
    assert not any(QUESTION.encode() in bytes(row.tolist()) for row in batch)


def test_text_is_held_as_one_byte_per_token_and_widened_per_batch():
    cfg = tiny(batch_size=8, passkey_fraction=0.5)
    corpus = load_corpus(cfg)
    assert corpus.train.dtype == corpus.held_out.dtype == torch.uint8
    assert corpus.train.element_size() * corpus.train.numel() + corpus.held_out.numel() == corpus.num_bytes
    narrow = training_batch(corpus.train, 3, cfg, seed=0)
    wide = training_batch(corpus.train.to(torch.int64), 3, cfg, seed=0)
    assert narrow.dtype == torch.int64 and torch.equal(narrow, wide)
    tokens = evaluation_tokens(corpus, cfg)
    assert tokens.dtype == torch.int64 and torch.equal(tokens, corpus.held_out[: tokens.numel()].to(torch.int64))


def test_a_device_or_pipe_is_not_read(tmp_path):
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):  # /dev/zero never ends; a pipe with no writer would block
        with pytest.raises(ExperimentError, match="is not a regular file"):
            load_corpus(tiny(data=(path,)))


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 64])
def test_the_chunked_utf8_check_finds_the_byte_a_whole_decode_finds(chunk):
    gen = torch.Generator().manual_seed(chunk)
    pieces = ["a", "é", "€", "𝄞", "\n"]
    for trial in range(200):
        text = "".join(pieces[int(i)] for i in torch.randint(len(pieces), (20,), generator=gen)).encode()
        data = bytearray(text)
        if trial % 4:  # corrupt one byte (three times in four): a stray continuation, a lead byte, 0xff
            data[int(torch.randint(len(data), (1,), generator=gen))] = [0x80, 0xC3, 0xFF][trial % 3]
        if trial % 5 == 0:
            data = data[:-1]  # perhaps a character cut at the end
        try:
            bytes(data).decode("utf-8")
            expected = None
        except UnicodeDecodeError as exc:
            expected = exc.start
        assert first_invalid_utf8(bytes(data), chunk=chunk) == expected, (bytes(data), chunk)
