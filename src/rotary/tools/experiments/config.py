"""What one experiment run is: :class:`ExperimentConfig`, the presets, and the checks on both.

A configuration is plain data (``config.json`` in every run directory); ``--resume`` compares the stored one
with the command's, setting by setting.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from rotary.errors import InputError
from rotary.models import POSITION_ENCODINGS

__all__ = [
    "COMPILE_MODES",
    "DEFAULT_ENCODINGS",
    "EXTEND_SCALINGS",
    "ExperimentConfig",
    "ExperimentError",
    "MAX_EVAL_LENGTH",
    "PRECISIONS",
    "PRESETS",
    "SCALINGS",
    "STUDIES",
    "default_encodings",
]


class ExperimentError(InputError):
    """Bad input to the experiment; the message names the value and what to change."""


#: inference-time scalings of a trained RoPE model, each evaluated with factor E / L
SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn")

#: scalings the extension stage fine-tunes with ("none": direct fine-tuning at the longer length);
#: dynamic NTK is left out: it changes with the length by itself and is published without fine-tuning
EXTEND_SCALINGS = ("none", "linear", "ntk", "yarn")

#: ``--precision``: ``auto`` is bf16 autocast on CUDA and fp32 on the CPU; ``fp32`` everywhere; ``bf16``
#: autocast on any device. Weights and optimizer state stay fp32 in every mode (autocast casts per op).
PRECISIONS = ("auto", "fp32", "bf16")

#: ``--compile``: ``off``; ``auto`` compiles the training step on CUDA and leaves the CPU eager; ``on``
#: compiles it on every device (on a CPU the minute of compiling only pays off for long runs)
COMPILE_MODES = ("off", "auto", "on")

#: the studies beside the main comparison (``--study``)
STUDIES = ("base", "transfer")

#: encodings trained by default, in this order; xpos joins when it is registered
DEFAULT_ENCODINGS = ("none", "learned", "sinusoidal", "alibi", "rope")

#: The longest window the experiment builds models for. Attention over one window holds a
#: [heads, E, E] score matrix (fp32 with ALiBi or a learned bias): at E = 32768 and 4 heads that is
#: 16 GiB for a single window, which is already past what a 24 GB machine can evaluate.
MAX_EVAL_LENGTH = 32768

#: retrieval distances as multiples of L, inside and past it (the last is clipped to the longest length)
RETRIEVAL_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def default_encodings() -> tuple[str, ...]:
    """The default ``--encodings``: NoPE, learned, sinusoidal, ALiBi, RoPE, and xPos once registered.

    >>> default_encodings()[:5]
    ('none', 'learned', 'sinusoidal', 'alibi', 'rope')
    """
    return DEFAULT_ENCODINGS + (("xpos",) if "xpos" in POSITION_ENCODINGS else ())


#: shortest copy string in training
MIN_COPY = 4


def min_task_length(pairs: int) -> int:
    """The shortest task row (copy: ``2 * MIN_COPY + 2`` bytes; induction: ``pairs`` pairs a half).

    >>> min_task_length(4)
    16
    """
    return max(2 * MIN_COPY + 2, 4 * pairs)


@dataclass
class ExperimentConfig:
    """Every setting of a run, each described by its ``#:`` comment; lengths are in tokens (bytes).

    >>> ExperimentConfig(train_length=64).eval_lengths  # None: L, 2L, 4L, 8L
    (64, 128, 256, 512)
    """

    #: the preset the settings started from (``tiny``, ``default``, ``large``).
    preset: str = "default"
    #: None for the main comparison, or one of :data:`STUDIES`: ``base`` (RoPE at each of ``bases``) or ``transfer``
    #: (sinusoidal -> RoPE by copying the other weights).
    study: str | None = None
    #: ``L``, the length of every training window.
    train_length: int = 128
    #: evaluation lengths ``E``, ``L`` among them and none below it; None (the default): ``L, 2L, 4L, 8L``.
    eval_lengths: tuple[int, ...] | None = None
    #: position encodings to train (keys of ``rotary.models.POSITION_ENCODINGS``); None (the default):
    #: :func:`default_encodings`. An empty tuple is an error, not the default.
    encodings: tuple[str, ...] | None = None
    #: inference-time scalings applied to the RoPE-based models (:data:`SCALINGS`).
    scalings: tuple[str, ...] = SCALINGS
    #: how many times every method is trained (seeds ``seed .. seed + seeds - 1``); the tables show the mean and half
    #: the range over them.
    seeds: int = 2
    #: fine-tuning steps of the extension stage at ``extend_length`` (0: no stage).
    extend_steps: int = 48
    #: the length the extension stage fine-tunes at (and the RoPE model trained from scratch is trained at); None:
    #: ``4L``. Must be longer than ``L``.
    extend_length: int | None = None
    #: the scalings fine-tuned (:data:`EXTEND_SCALINGS`), factor ``extend_length / L``.
    extend_scalings: tuple[str, ...] = EXTEND_SCALINGS
    #: rows per step at ``extend_length``; None: the pretraining batch's tokens, ``batch_size * L // extend_length``
    #: rows (at least 1).
    extend_batch_size: int | None = None
    #: peak learning rate of every fine-tuning (extension, transfer): warm-up over a tenth of its steps, then cosine
    #: decay to ``min_learning_rate``.
    finetune_learning_rate: float = 1e-3
    #: RoPE bases of ``--study base``.
    bases: tuple[float, ...] = (20.0, 100.0, 1000.0, 10000.0, 100000.0)
    #: RoPE fine-tuning steps after the transfer (``--study transfer``); the sinusoidal model it starts from trains
    #: ``steps - transfer_steps``. None: ``steps // 10``.
    transfer_steps: int | None = None
    #: (hidden_size, num_layers, num_heads) the ``Decoder``'s shape (SwiGLU width 8/3 E).
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    #: RoPE's base ``theta``.
    rope_base: float = 10000.0
    #: rows per optimizer step (all ranks together).
    batch_size: int = 12
    #: optimizer steps per model.
    steps: int = 480
    #: (learning_rate, min_learning_rate, warmup_steps) linear warm-up, then cosine decay.
    learning_rate: float = 3e-3
    min_learning_rate: float = 3e-4
    warmup_steps: int = 24
    #: AdamW's decay on the linear layers (embeddings, norms and biases are not decayed, so the rows of a learned table
    #: past ``L`` stay exactly as initialised).
    weight_decay: float = 0.1
    #: global gradient-norm clip.
    grad_clip: float = 1.0
    #: fraction of training rows that end with a passkey sample (<= L tokens).
    passkey_fraction: float = 0.5
    #: passkey prompts per evaluation length (spread evenly over the depths; 0: no passkey evaluation).
    passkey_trials: int = 40
    #: where the key sits in the filler, 0 = start, 1 = just before the question.
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    #: held-out tokens evaluated at every length in non-overlapping windows (a multiple of the longest length);
    #: ``None``: all of the held-out text.
    eval_tokens: int | None = 16384
    #: the stride of the sliding-window evaluation: every scored token sees at least ``E - eval_stride`` tokens of
    #: context. None: ``L // 2``.
    eval_stride: int | None = None
    #: tokens scored by the sliding-window evaluation at every length (0: none), whole strides spread over the non-
    #: overlapping windows' text past its first window.
    sliding_tokens: int = 4096
    #: random spans per distance of the retrieval probe (0: no probe).
    retrieval_trials: int = 16
    #: length of each span (bytes).
    retrieval_span: int = 16
    #: distances between the two copies; None: ``L/4 .. 8L`` (see :attr:`distances`).
    retrieval_distances: tuple[int, ...] | None = None
    #: how many of the seeds (the first ones) also train task models; None: every seed.
    task_seeds: int | None = None
    #: optimizer steps of each task model (:mod:`.tasks`: copy and associative recall, one model per encoding and seed,
    #: trained on both tasks at ``task_length``); 0: no task models. The main comparison only.
    task_steps: int = 1000
    #: ``L`` of the task models; they are evaluated at ``1, 2, 4, 8`` times it.
    task_length: int = 32
    #: width of the task models (their layers and heads are the text models').
    task_hidden_size: int = 64
    #: rows per step of a task model, half copy, half associative recall.
    task_batch_size: int = 32
    #: peak learning rate of the task models (warm-up over a twentieth of their steps, cosine decay to a tenth of it).
    task_learning_rate: float = 3e-3
    #: rows per task, evaluation length and seed.
    task_trials: int = 48
    #: key-value pairs per associative-recall row.
    task_pairs: int = 4
    #: the last part of the text, by position, kept for evaluation.
    held_out_fraction: float = 0.1
    #: the first seed: model initialisation and training batches of the first run of every method, and every evaluation
    #: prompt.
    seed: int = 0
    #: steps between checkpoints (and at the end of training).
    checkpoint_every: int = 200
    #: ``cpu`` or ``cuda``; None: CUDA when available (chosen when the run starts).
    device: str | None = None
    #: :data:`PRECISIONS`: ``auto`` (bf16 autocast on CUDA, fp32 on the CPU), ``fp32`` or ``bf16``; training and
    #: evaluation alike, fp32 weights and optimizer state in every mode.
    precision: str = "auto"
    #: :data:`COMPILE_MODES`: ``off``, ``auto`` (``torch.compile`` of the model in training on CUDA, eager on the CPU)
    #: or ``on`` (every device). Evaluation stays eager (its shapes change with every length); a compile that fails
    #: falls back to eager with one line.
    compile: str = "off"
    #: torch CPU threads of each model (results are bit-identical only at the same count); None: chosen when the run
    #: starts (one per model when models train side by side on the CPU, ``--jobs``; else torch's default). How many
    #: models train at a time is no setting: it changes no number.
    threads: int | None = None
    #: files, directories or glob patterns of UTF-8 text, or a built-in corpus (``builtin:pydoc``, ``builtin:stdlib``);
    #: None: ``builtin:pydoc``.
    data: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        # None means "the default"; an empty list stays empty, for validate() to refuse
        if self.eval_lengths is None:
            self.eval_lengths = tuple(self.train_length * k for k in (1, 2, 4, 8))
        if self.encodings is None:
            self.encodings = default_encodings()
        if isinstance(self.data, str):  # one path, as older configurations stored it
            self.data = (self.data,)
        for name in (
            "eval_lengths",
            "encodings",
            "scalings",
            "passkey_depths",
            "extend_scalings",
            "bases",
            "retrieval_distances",
            "data",
        ):
            if getattr(self, name) is not None:
                setattr(self, name, tuple(getattr(self, name)))

    # ------------------------------------------------------------------------------------------
    @property
    def longest(self) -> int:
        """The longest evaluation length (``8L`` by default): the size of learned tables."""
        return max(self.eval_lengths)

    @property
    def extension_length(self) -> int:
        """The length of the extension stage (``extend_length``, default ``4L``)."""
        return self.extend_length if self.extend_length is not None else 4 * self.train_length

    @property
    def extension_rows(self) -> int:
        """Rows per step at the extension length: ``extend_batch_size``, else ``batch_size * L // E`` (at least 1).

        >>> ExperimentConfig(train_length=128, batch_size=12).extension_rows
        3
        """
        if self.extend_batch_size is not None:
            return self.extend_batch_size
        return max(1, self.batch_size * self.train_length // self.extension_length)

    @property
    def extends(self) -> bool:
        """Whether this run has an extension stage (the main comparison, steps > 0, RoPE trained)."""
        return self.study is None and self.extend_steps > 0 and "rope" in self.encodings

    @property
    def stride(self) -> int:
        """The sliding-window stride (``eval_stride``, default ``L // 2``)."""
        return self.eval_stride if self.eval_stride is not None else max(1, self.train_length // 2)

    @property
    def distances(self) -> tuple[int, ...]:
        """Retrieval distances: ``retrieval_distances``, or L/4 .. 6L and the longest that fits the longest length.

        >>> ExperimentConfig(train_length=128).distances
        (32, 64, 96, 128, 192, 256, 384, 512, 768, 976)
        """
        if self.retrieval_distances is not None:
            return self.retrieval_distances
        from .retrieval import longest_distance

        most = longest_distance(self.longest, self.retrieval_span)
        found = sorted({min(round(f * self.train_length), most) for f in RETRIEVAL_FRACTIONS})
        return tuple(d for d in found if d >= 2 * self.retrieval_span)

    @property
    def has_tasks(self) -> bool:
        """Whether this run trains task models (the main comparison with ``task_steps > 0``)."""
        return self.study is None and self.task_steps > 0

    @property
    def task_lengths(self) -> tuple[int, ...]:
        """The task models' evaluation lengths: ``task_length`` times 1, 2, 4 and 8."""
        return tuple(self.task_length * k for k in (1, 2, 4, 8))

    @property
    def transfer_finetune_steps(self) -> int:
        """RoPE steps after the transfer (``transfer_steps``, default a tenth of ``steps``, at least 1)."""
        return self.transfer_steps if self.transfer_steps is not None else max(1, self.steps // 10)

    def mixed_precision(self, device_type: str) -> bool:
        """Whether training and evaluation run under bf16 autocast on this device type (``auto``: on CUDA)."""
        return self.precision == "bf16" or (self.precision == "auto" and device_type == "cuda")

    def compiles(self, device_type: str) -> bool:
        """Whether training compiles the model on this device type (``auto``: on CUDA)."""
        return self.compile == "on" or (self.compile == "auto" and device_type == "cuda")

    def validate(self) -> ExperimentConfig:
        """Check every setting; raise :class:`ExperimentError` naming the first bad one. Returns self."""
        from .passkey import min_sample_length
        from .retrieval import longest_distance

        def positive(name: str, value: Any, flag: str) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ExperimentError(f"{flag} must be a positive integer, got {value!r}")

        def non_negative(value: Any, flag: str) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ExperimentError(f"{flag} must be an integer >= 0, got {value!r}")

        if self.study is not None and self.study not in STUDIES:
            raise ExperimentError(
                f"unknown --study {self.study!r}; known: {', '.join(STUDIES)} (or no --study for the main comparison)"
            )
        positive("train_length", self.train_length, "--train-length")
        for e in self.eval_lengths:
            if isinstance(e, bool) or not isinstance(e, int) or e <= 0:
                raise ExperimentError(f"--eval-lengths must be positive integers, got {e!r}")
        if len(set(self.eval_lengths)) != len(self.eval_lengths):
            raise ExperimentError(f"--eval-lengths has a repeated length: {list(self.eval_lengths)}")
        listed = ",".join(map(str, self.eval_lengths)) or "nothing"
        if self.train_length not in self.eval_lengths or min(self.eval_lengths) < self.train_length:
            raise ExperimentError(
                f"--eval-lengths must include the training length L = {self.train_length} and nothing shorter (every "
                f"length is measured against L), got {listed}; e.g. --eval-lengths "
                f"{','.join(str(self.train_length * k) for k in (1, 2, 4, 8))}"
            )
        if self.longest > MAX_EVAL_LENGTH:
            raise ExperimentError(
                f"the longest evaluation length is {self.longest} tokens, but models are built for at most "
                f"{MAX_EVAL_LENGTH} (one window's attention is [heads, E, E]); use a --train-length of at most "
                f"{MAX_EVAL_LENGTH // 8} or shorter --eval-lengths"
            )
        needed = min_sample_length()
        if self.train_length < needed:
            raise ExperimentError(
                f"--train-length {self.train_length} is too short for a passkey sample, which needs at least "
                f"{needed} tokens (filler, key sentence, question and 5 digits); use --train-length {needed} or more"
            )
        if self.threads is not None:
            positive("threads", self.threads, "--threads")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ExperimentError(f"--seed must be an integer >= 0, got {self.seed!r}")
        if isinstance(self.seeds, bool) or not isinstance(self.seeds, int) or self.seeds < 1:
            raise ExperimentError(
                f"--seeds must be at least 1 (how many times every method is trained), got {self.seeds!r}; "
                "use --seeds 2 or more to measure the run-to-run spread"
            )
        for name in (
            "hidden_size",
            "num_layers",
            "num_heads",
            "batch_size",
            "steps",
            "checkpoint_every",
            "retrieval_span",
        ):
            positive(name, getattr(self, name), "--" + name.replace("_", "-"))
        non_negative(self.passkey_trials, "--passkey-trials")
        non_negative(self.retrieval_trials, "--retrieval-trials")
        self._validate_tasks()
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ExperimentError(
                f"--hidden-size {self.hidden_size} must split into --num-heads {self.num_heads} heads of an even width"
            )
        known = sorted(POSITION_ENCODINGS)
        if not self.encodings:
            raise ExperimentError(f"--encodings is empty; choose from {', '.join(known)}")
        unknown = [n for n in self.encodings if n not in POSITION_ENCODINGS]
        if unknown:
            raise ExperimentError(f"unknown --encodings {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        if len(set(self.encodings)) != len(self.encodings):
            raise ExperimentError(f"--encodings names an encoding twice: {','.join(self.encodings)}")
        self._validate_scalings()
        self._validate_extension()
        self._validate_studies()
        if not (isinstance(self.passkey_fraction, (int, float)) and 0.0 <= self.passkey_fraction <= 1.0):
            raise ExperimentError(f"--passkey-fraction must be in [0, 1], got {self.passkey_fraction!r}")
        if not (isinstance(self.held_out_fraction, (int, float)) and 0.0 < self.held_out_fraction < 1.0):
            raise ExperimentError(f"--held-out-fraction must be in (0, 1), got {self.held_out_fraction!r}")
        for name in ("learning_rate", "min_learning_rate", "finetune_learning_rate", "grad_clip", "rope_base"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ExperimentError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value!r}")
        if not self.rope_base > 1:  # as --bases: frequencies base ** (-2i/d) fall from 1 rad/token
            raise ExperimentError(f"--rope-base must be > 1 (RoPE's base theta), got {self.rope_base!r}")
        if not (
            isinstance(self.weight_decay, (int, float)) and math.isfinite(self.weight_decay) and self.weight_decay >= 0
        ):
            raise ExperimentError(f"--weight-decay must be a finite number >= 0, got {self.weight_decay!r}")
        non_negative(self.warmup_steps, "--warmup-steps")
        if not self.passkey_depths or any(not (0.0 <= d <= 1.0) for d in self.passkey_depths):
            shown = ",".join(f"{d:g}" for d in self.passkey_depths) or "nothing"
            raise ExperimentError(f"--passkey-depths must lie in [0, 1], got {shown}")
        if self.eval_tokens is not None:
            positive("eval_tokens", self.eval_tokens, "--eval-tokens")
            if self.eval_tokens < self.longest:
                raise ExperimentError(
                    f"--eval-tokens {self.eval_tokens} is shorter than one window of the longest evaluation length "
                    f"{self.longest}; use at least {self.longest}"
                )
            if self.eval_tokens < self.longest + self.sliding_tokens:
                need = self.longest * math.ceil((self.longest + self.sliding_tokens) / self.longest)
                raise ExperimentError(
                    f"--eval-tokens {self.eval_tokens} leaves no room for --sliding-tokens {self.sliding_tokens} past "
                    f"the first window of {self.longest}; use --eval-tokens {need} or fewer --sliding-tokens"
                )
        self._validate_sliding_and_retrieval(longest_distance)
        if self.device not in ("cpu", "cuda"):
            raise ExperimentError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ExperimentError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.compile not in COMPILE_MODES:
            raise ExperimentError(f"--compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        return self

    def _validate_tasks(self) -> None:
        def positive(value: Any, flag: str) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ExperimentError(f"{flag} must be a positive integer, got {value!r}")

        steps = self.task_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ExperimentError(f"--task-steps must be an integer >= 0 (0: no task models), got {steps!r}")
        for name in ("task_length", "task_hidden_size", "task_batch_size", "task_trials", "task_pairs"):
            positive(getattr(self, name), "--" + name.replace("_", "-"))
        if self.task_seeds is not None:
            positive(self.task_seeds, "--task-seeds")
            if self.task_seeds > self.seeds:
                raise ExperimentError(
                    f"--task-seeds {self.task_seeds} is more than the run's --seeds "
                    f"{self.seeds}; use at most {self.seeds}"
                )
        if self.task_pairs > 26:
            raise ExperimentError(f"--task-pairs {self.task_pairs} is more than the 26 keys (A-Z); use at most 26")
        needed = min_task_length(self.task_pairs)
        if self.task_length < needed:
            raise ExperimentError(
                f"--task-length {self.task_length} is too short for a copy row and {self.task_pairs} key-value pairs "
                f"in each half of a recall row; use --task-length {needed} or more"
            )
        if 8 * self.task_length > MAX_EVAL_LENGTH:
            raise ExperimentError(
                f"--task-length {self.task_length} is evaluated up to 8 times that, past the {MAX_EVAL_LENGTH} tokens "
                f"models are built for; use at most {MAX_EVAL_LENGTH // 8}"
            )
        if self.task_hidden_size % self.num_heads or (self.task_hidden_size // self.num_heads) % 2:
            raise ExperimentError(
                f"--task-hidden-size {self.task_hidden_size} must split into --num-heads {self.num_heads} heads of an "
                "even width"
            )
        lr = self.task_learning_rate
        if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0):
            raise ExperimentError(f"--task-learning-rate must be a finite number > 0, got {lr!r}")

    def _validate_scalings(self) -> None:
        unknown = [s for s in self.scalings if s not in SCALINGS]
        if unknown:
            raise ExperimentError(f"unknown --scalings {', '.join(map(repr, unknown))}; known: {', '.join(SCALINGS)}")
        if not self.scalings or "none" not in self.scalings:
            raise ExperimentError(
                f"--scalings must include 'none' (the trained model as it is), got {','.join(self.scalings)}"
            )
        if len(set(self.scalings)) != len(self.scalings):
            raise ExperimentError(f"--scalings names a scaling twice: {','.join(self.scalings)}")

    def _validate_extension(self) -> None:
        if isinstance(self.extend_steps, bool) or not isinstance(self.extend_steps, int) or self.extend_steps < 0:
            raise ExperimentError(
                f"--extend-steps must be an integer >= 0 (0: no extension stage), got {self.extend_steps!r}"
            )
        if self.extend_length is not None:
            if (
                isinstance(self.extend_length, bool)
                or not isinstance(self.extend_length, int)
                or self.extend_length <= 0
            ):
                raise ExperimentError(f"--extend-length must be a positive integer, got {self.extend_length!r}")
            if self.extend_length <= self.train_length:
                raise ExperimentError(
                    f"--extend-length {self.extend_length} is not longer than the training length L = "
                    f"{self.train_length}: the extension stage fine-tunes at a longer length; use e.g. "
                    f"--extend-length {4 * self.train_length}, or --extend-steps 0 to skip the stage"
                )
            if self.extend_length > MAX_EVAL_LENGTH:
                raise ExperimentError(
                    f"--extend-length {self.extend_length} is longer than the "
                    f"{MAX_EVAL_LENGTH} tokens models are built for"
                )
        if self.extend_batch_size is not None and (
            isinstance(self.extend_batch_size, bool)
            or not isinstance(self.extend_batch_size, int)
            or self.extend_batch_size <= 0
        ):
            raise ExperimentError(f"--extend-batch-size must be a positive integer, got {self.extend_batch_size!r}")
        unknown = [s for s in self.extend_scalings if s not in EXTEND_SCALINGS]
        if unknown:
            extra = (
                " (dynamic NTK changes with the length by itself; it is evaluated without fine-tuning)"
                if "dynamic" in unknown
                else ""
            )
            raise ExperimentError(
                f"unknown --extend-scalings {', '.join(map(repr, unknown))}; known: {', '.join(EXTEND_SCALINGS)}{extra}"
            )
        if len(set(self.extend_scalings)) != len(self.extend_scalings):
            raise ExperimentError(f"--extend-scalings names a scaling twice: {','.join(self.extend_scalings)}")
        if self.study is None and self.extend_steps > 0 and "rope" not in self.encodings:
            raise ExperimentError(
                f"the extension stage fine-tunes the RoPE model, but --encodings {','.join(self.encodings)} has no "
                "rope; add rope or use --extend-steps 0"
            )

    def _validate_studies(self) -> None:
        if not self.bases:
            raise ExperimentError("--bases is empty; give RoPE bases such as 100,10000")
        for b in self.bases:
            if not (isinstance(b, (int, float)) and math.isfinite(b) and b > 1):
                raise ExperimentError(f"--bases must be finite numbers > 1 (RoPE's base theta), got {b!r}")
        if len(set(self.bases)) != len(self.bases):
            raise ExperimentError(f"--bases names a base twice: {','.join(f'{b:g}' for b in self.bases)}")
        if self.transfer_steps is not None and (
            isinstance(self.transfer_steps, bool)
            or not isinstance(self.transfer_steps, int)
            or self.transfer_steps <= 0
        ):
            raise ExperimentError(f"--transfer-steps must be a positive integer, got {self.transfer_steps!r}")
        if self.study == "transfer" and self.transfer_finetune_steps >= self.steps:
            raise ExperimentError(
                f"--study transfer fine-tunes {self.transfer_finetune_steps} of the --steps {self.steps} with RoPE "
                "(--transfer-steps) and needs at least one sinusoidal step before them; use more --steps or fewer "
                f"--transfer-steps (e.g. --steps {self.transfer_finetune_steps + 1})"
            )

    def _validate_sliding_and_retrieval(self, longest_distance) -> None:
        if isinstance(self.sliding_tokens, bool) or not isinstance(self.sliding_tokens, int) or self.sliding_tokens < 0:
            raise ExperimentError(
                "--sliding-tokens must be an integer >= 0 (0: no sliding-window "
                f"evaluation), got {self.sliding_tokens!r}"
            )
        if self.eval_stride is not None:
            if isinstance(self.eval_stride, bool) or not isinstance(self.eval_stride, int) or self.eval_stride <= 0:
                raise ExperimentError(f"--eval-stride must be a positive integer, got {self.eval_stride!r}")
            if self.eval_stride > self.train_length:
                raise ExperimentError(
                    f"--eval-stride {self.eval_stride} is longer than L = {self.train_length}: at E = L a window "
                    f"would skip tokens; use at most {self.train_length} (L // 2 = {self.train_length // 2} by default)"
                )
        if self.sliding_tokens and self.sliding_tokens < self.stride:
            raise ExperimentError(
                f"--sliding-tokens {self.sliding_tokens} is fewer than one stride ({self.stride}); use at "
                f"least {self.stride}, or 0 for none"
            )
        most = longest_distance(self.longest, self.retrieval_span)
        if most < 2 * self.retrieval_span:
            raise ExperimentError(
                f"--retrieval-span {self.retrieval_span} is too long for sequences of at most {self.longest} tokens; "
                f"use at most {self.longest // 4}"
            )
        if self.retrieval_distances is not None:
            bad = [
                d
                for d in self.retrieval_distances
                if isinstance(d, bool) or not isinstance(d, int) or not 2 * self.retrieval_span <= d <= most
            ]
            if bad or not self.retrieval_distances:
                raise ExperimentError(
                    f"--retrieval-distances must lie in {2 * self.retrieval_span}..{most} (twice the span, up to what "
                    f"fits in {self.longest} tokens), got {', '.join(map(str, bad)) or 'nothing'}"
                )

    # ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready settings (tuples become lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise :class:`ExperimentError`."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ExperimentError(f"unknown settings {unknown} in a stored configuration")
        return cls(**data)


#: name -> settings; ``ExperimentConfig(**PRESETS[name])`` is that preset
PRESETS: dict[str, dict[str, Any]] = {
    # seconds, for tests: a model too small to learn much, every code path exercised
    "tiny": dict(
        preset="tiny",
        train_length=112,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        batch_size=8,
        steps=12,
        warmup_steps=2,
        learning_rate=3e-3,
        min_learning_rate=3e-4,
        passkey_trials=10,
        eval_tokens=1792,
        checkpoint_every=4,
        threads=1,
        extend_steps=4,
        sliding_tokens=224,
        retrieval_trials=4,
        bases=(100.0, 10000.0),
        transfer_steps=4,
        task_steps=8,
        task_length=32,
        task_hidden_size=32,
        task_batch_size=8,
        task_trials=8,
    ),
    # what `make demo` runs: about 9 minutes on 2 idle CPU cores (docs/experiment.md); the passkey and the
    # retrieval probe, which no model of this size learns from text, are left to the large preset: their
    # time trains the task models instead, one seed of them (two would take it past 10 minutes)
    "default": dict(preset="default", passkey_trials=0, retrieval_trials=0, task_seeds=1),
    # for one GPU, within 20 minutes (docs/experiment.md, "Presets", has the arithmetic): a bigger model at
    # L = 512, evaluated to 8L = 4096, on the standard library's sources; bf16 autocast, a compiled training step
    "large": dict(
        preset="large",
        train_length=512,
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        batch_size=32,
        steps=1500,
        warmup_steps=100,
        learning_rate=1e-3,
        min_learning_rate=1e-4,
        finetune_learning_rate=3e-4,
        passkey_trials=100,
        eval_tokens=262144,
        sliding_tokens=16384,
        retrieval_trials=64,
        checkpoint_every=500,
        seeds=2,
        extend_steps=75,
        data=("builtin:stdlib",),
        compile="auto",
    ),
}
