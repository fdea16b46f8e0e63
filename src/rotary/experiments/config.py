"""What one experiment run is: :class:`ExperimentConfig`, the presets, and the checks on both.

A configuration is plain data (JSON in ``config.json`` of every run directory). ``--resume`` compares
the stored one with the command's, setting by setting, so a run is never continued with other
settings than it was started with.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..models import POSITION_ENCODINGS

__all__ = [
    "DEFAULT_ENCODINGS",
    "command_line",
    "ExperimentConfig",
    "ExperimentError",
    "MAX_EVAL_LENGTH",
    "PRESETS",
    "SCALINGS",
    "default_encodings",
    "differences",
]


class ExperimentError(ValueError):
    """Bad input to the experiment; the message names the value and what to change."""


#: inference-time scalings of a trained RoPE model, each evaluated with factor E / L
SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn")

#: encodings trained by default, in this order; xpos joins when it is registered
DEFAULT_ENCODINGS = ("none", "learned", "sinusoidal", "alibi", "rope")

#: The longest window the experiment builds models for. Attention over one window holds a
#: [heads, E, E] score matrix (fp32 with ALiBi or a learned bias): at E = 32768 and 4 heads that is
#: 16 GiB for a single window, which is already past what a 24 GB machine can evaluate.
MAX_EVAL_LENGTH = 32768


def default_encodings() -> tuple[str, ...]:
    """The default ``--encodings``: NoPE, learned, sinusoidal, ALiBi, RoPE, and xPos once registered.

    Example:
        >>> default_encodings()[:5]
        ('none', 'learned', 'sinusoidal', 'alibi', 'rope')
    """
    return DEFAULT_ENCODINGS + (("xpos",) if "xpos" in POSITION_ENCODINGS else ())


@dataclass
class ExperimentConfig:
    """Every setting of a run. Lengths are in tokens, and tokens are bytes (vocabulary 256).

    Attributes:
        preset: the preset the settings started from (``tiny``, ``default``, ``large``).
        train_length: ``L``, the length of every training window.
        eval_lengths: evaluation lengths ``E``, ``L`` among them and none below it; None (the default):
            ``L, 2L, 4L, 8L``.
        encodings: position encodings to train (keys of ``rotary.models.POSITION_ENCODINGS``); None
            (the default): :func:`default_encodings`. An empty tuple is an error, not the default.
        scalings: inference-time scalings applied to the RoPE-based models (:data:`SCALINGS`).
        spread_encodings: encodings trained a second time with ``seed + 1`` to measure the
            run-to-run spread.
        hidden_size, num_layers, num_heads: the ``Decoder``'s shape (SwiGLU width 8/3 E).
        rope_base: RoPE's base ``theta``.
        batch_size: rows per optimizer step (all ranks together).
        steps: optimizer steps per model.
        learning_rate, min_learning_rate, warmup_steps: linear warm-up, then cosine decay.
        weight_decay: AdamW's decay on the linear layers (embeddings, norms and biases are not
            decayed, so the rows of a learned table past ``L`` stay exactly as initialised).
        grad_clip: global gradient-norm clip.
        passkey_fraction: fraction of training rows that end with a passkey sample (<= L tokens).
        passkey_trials: passkey prompts per evaluation length (spread evenly over the depths).
        passkey_depths: where the key sits in the filler, 0 = start, 1 = just before the question.
        eval_tokens: held-out tokens evaluated at every length (a multiple of the longest length);
            ``None``: all of the held-out text.
        held_out_fraction: the last part of the text, by position, kept for evaluation.
        seed: seed of the model initialisation and of the training batches.
        checkpoint_every: steps between checkpoints (and at the end of training).
        device: ``cpu`` or ``cuda``; None: CUDA when available (chosen when the run starts).
        threads: torch CPU threads (results are bit-identical only at the same count); None: torch's default.
        data: path of the text, or ``None`` for CPython's ``pydoc_data.topics``.
    """

    preset: str = "default"
    train_length: int = 128
    eval_lengths: tuple[int, ...] | None = None
    encodings: tuple[str, ...] | None = None
    scalings: tuple[str, ...] = SCALINGS
    spread_encodings: tuple[str, ...] = ("rope",)
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    rope_base: float = 10000.0
    batch_size: int = 12
    steps: int = 1200
    learning_rate: float = 3e-3
    min_learning_rate: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    passkey_fraction: float = 0.5
    passkey_trials: int = 50
    passkey_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    eval_tokens: int | None = 32768
    held_out_fraction: float = 0.1
    seed: int = 0
    checkpoint_every: int = 200
    device: str | None = None
    threads: int | None = None
    data: str | None = None

    def __post_init__(self) -> None:
        # None means "the default"; an empty list stays empty, for validate() to refuse
        if self.eval_lengths is None:
            self.eval_lengths = tuple(self.train_length * k for k in (1, 2, 4, 8))
        if self.encodings is None:
            self.encodings = default_encodings()
        for name in ("eval_lengths", "encodings", "scalings", "spread_encodings", "passkey_depths"):
            setattr(self, name, tuple(getattr(self, name)))

    # ------------------------------------------------------------------------------------------
    @property
    def longest(self) -> int:
        """The longest evaluation length (``8L`` by default): the size of learned tables."""
        return max(self.eval_lengths)

    def validate(self) -> ExperimentConfig:
        """Check every setting; raise :class:`ExperimentError` naming the first bad one. Returns self."""
        from .passkey import min_sample_length

        def positive(name: str, value: Any, flag: str) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ExperimentError(f"{flag} must be a positive integer, got {value!r}")

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
        for name in ("hidden_size", "num_layers", "num_heads", "batch_size", "steps", "passkey_trials", "checkpoint_every"):
            positive(name, getattr(self, name), "--" + name.replace("_", "-"))
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 2:
            raise ExperimentError(
                f"--hidden-size {self.hidden_size} must split into --num-heads {self.num_heads} heads of an even width"
            )
        known = sorted(POSITION_ENCODINGS)
        if not self.encodings:
            raise ExperimentError(f"--encodings is empty; choose from {', '.join(known)}")
        for group, names in (("--encodings", self.encodings), ("--spread-encodings", self.spread_encodings)):
            unknown = [n for n in names if n not in POSITION_ENCODINGS]
            if unknown:
                raise ExperimentError(f"unknown {group} {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
            if len(set(names)) != len(names):
                raise ExperimentError(f"{group} names an encoding twice: {','.join(names)}")
        missing = [n for n in self.spread_encodings if n not in self.encodings]
        if missing:
            raise ExperimentError(
                f"--spread-encodings {','.join(missing)} must also be in --encodings ({','.join(self.encodings)})"
            )
        unknown = [s for s in self.scalings if s not in SCALINGS]
        if unknown:
            raise ExperimentError(f"unknown --scalings {', '.join(map(repr, unknown))}; known: {', '.join(SCALINGS)}")
        if not self.scalings or "none" not in self.scalings:
            raise ExperimentError(f"--scalings must include 'none' (the trained model as it is), got {','.join(self.scalings)}")
        if len(set(self.scalings)) != len(self.scalings):
            raise ExperimentError(f"--scalings names a scaling twice: {','.join(self.scalings)}")
        if not (isinstance(self.passkey_fraction, (int, float)) and 0.0 <= self.passkey_fraction <= 1.0):
            raise ExperimentError(f"--passkey-fraction must be in [0, 1], got {self.passkey_fraction!r}")
        if not (isinstance(self.held_out_fraction, (int, float)) and 0.0 < self.held_out_fraction < 1.0):
            raise ExperimentError(f"--held-out-fraction must be in (0, 1), got {self.held_out_fraction!r}")
        for name in ("learning_rate", "min_learning_rate", "grad_clip", "rope_base"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ExperimentError(f"--{name.replace('_', '-')} must be a finite number > 0, got {value!r}")
        if not (isinstance(self.weight_decay, (int, float)) and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ExperimentError(f"--weight-decay must be a finite number >= 0, got {self.weight_decay!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ExperimentError(f"--warmup-steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not self.passkey_depths or any(not (0.0 <= d <= 1.0) for d in self.passkey_depths):
            raise ExperimentError(f"passkey depths must lie in [0, 1], got {list(self.passkey_depths)}")
        if self.eval_tokens is not None:
            positive("eval_tokens", self.eval_tokens, "--eval-tokens")
            if self.eval_tokens < self.longest:
                raise ExperimentError(
                    f"--eval-tokens {self.eval_tokens} is shorter than one window of the longest evaluation length "
                    f"{self.longest}; use at least {self.longest}"
                )
        if self.device not in ("cpu", "cuda"):
            raise ExperimentError(f"--device must be cpu or cuda, got {self.device!r}")
        return self

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


def differences(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Settings whose values differ, each as ``"name: run has A, this command B"``.

    Example:
        >>> differences({"steps": 40, "seed": 0}, {"steps": 80, "seed": 0})
        ['steps: the run has 40, this command 80']
    """
    out = []
    for key in sorted(set(stored) | set(current)):
        a, b = stored.get(key, "(absent)"), current.get(key, "(absent)")
        if a != b:
            out.append(f"{key}: the run has {a!r}, this command {b!r}")
    return out


#: name -> settings; ``ExperimentConfig(**PRESETS[name])`` is that preset
PRESETS: dict[str, dict[str, Any]] = {
    # seconds, for tests: a model too small to learn much, every code path exercised
    "tiny": dict(
        preset="tiny", train_length=112, hidden_size=32, num_layers=1, num_heads=2, batch_size=8, steps=12,
        warmup_steps=2, learning_rate=3e-3, min_learning_rate=3e-4, passkey_trials=50, eval_tokens=896,
        checkpoint_every=4, threads=1,
    ),
    # what `make demo` runs: within 10 minutes on 2 CPU cores
    "default": dict(preset="default"),
    # for a GPU: a bigger model at L = 512, evaluated to 8L = 4096
    "large": dict(
        preset="large", train_length=512, hidden_size=512, num_layers=8, num_heads=8, batch_size=32, steps=6000,
        warmup_steps=200, learning_rate=1e-3, min_learning_rate=1e-4, passkey_trials=100, eval_tokens=None,
        checkpoint_every=500, spread_encodings=("rope", "alibi"),
    ),
}


def _format(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(_format(v) for v in value)
    return str(value)


def command_line(config: ExperimentConfig) -> str:
    """The ``rotary experiment`` command that reproduces ``config``: the preset and every setting that
    differs from it.

    Example:
        >>> command_line(ExperimentConfig(**{**PRESETS["tiny"], "steps": 30, "device": "cpu"}))
        'rotary experiment --preset tiny --steps 30 --device cpu'
    """
    import shlex

    preset = dict(PRESETS[config.preset])
    preset["train_length"] = config.train_length  # so the derived lengths compare equal
    base = ExperimentConfig(**preset)
    parts = ["rotary", "experiment", "--preset", config.preset]
    if config.train_length != PRESETS[config.preset].get("train_length", ExperimentConfig.train_length):
        parts += ["--train-length", str(config.train_length)]
    for f in dataclasses.fields(config):
        if f.name in ("preset", "train_length"):
            continue
        value = getattr(config, f.name)
        if value != getattr(base, f.name) and value is not None:
            parts += ["--" + f.name.replace("_", "-"), _format(value)]
    return shlex.join(parts)
