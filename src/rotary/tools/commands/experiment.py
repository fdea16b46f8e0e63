"""``rotary experiment``: train short, test long — position encodings and RoPE scalings compared past
the training length (also ``python -m rotary experiment`` and ``torchrun ... -m rotary experiment``)."""

from __future__ import annotations

import argparse
import math
import os

from rotary.tools.experiments.config import (
    COMPILE_MODES,
    EXTEND_SCALINGS,
    PRECISIONS,
    PRESETS,
    SCALINGS,
    STUDIES,
    ExperimentConfig,
    ExperimentError,
    default_encodings,
)

from .argument_types import count, positive_float, positive_int, seed
from .output import output_path
from .printing import print_json

__all__ = ["register", "config_from_args"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated integers such as 128,256,512,1024, got {text!r}"
        ) from None
    bad = [v for v in values if v <= 0]
    if bad:
        raise argparse.ArgumentTypeError(f"must be positive integers, got {', '.join(map(str, bad))}")
    return values


def _float_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers such as 0,0.5,1, got {text!r}") from None
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise argparse.ArgumentTypeError(f"must be finite numbers, got {', '.join(map(str, bad))}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _seeds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer, the times every method is trained, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be at least 1 (how many times every method is trained; 2 or more measure the spread), got {text}"
        )
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


#: ExperimentConfig field -> (argparse type, help); every setting is a flag, so every run has a command
SETTINGS: dict[str, tuple] = {
    "study": (
        str,
        "a study beside the main comparison: base (RoPE at each of --bases) or transfer (sinusoidal -> RoPE); "
        "not part of make demo",
    ),
    "train_length": (positive_int, "L: tokens (bytes) per training window"),
    "eval_lengths": (_int_list, "evaluation lengths E, comma-separated (default L,2L,4L,8L)"),
    "encodings": (
        _names,
        "position encodings to train, comma-separated (default: "
        + ",".join(default_encodings())
        + "; also rope_alibi, rope_relative, any registered name)",
    ),
    "scalings": (
        _names,
        "scalings of the RoPE models at evaluation, comma-separated, none (the model as trained) among them "
        "(default: " + ",".join(SCALINGS) + ")",
    ),
    "seeds": (_seeds, "times every method is trained (seeds --seed, --seed + 1, ...); tables give the mean and spread"),
    "extend_steps": (_non_negative_int, "fine-tuning steps of the extension stage at --extend-length (0: no stage)"),
    "extend_length": (positive_int, "length the extension stage fine-tunes at, longer than L (default 4L)"),
    "extend_scalings": (
        _names,
        "scalings fine-tuned at --extend-length, comma-separated (default: "
        + ",".join(EXTEND_SCALINGS)
        + "; none = direct fine-tuning)",
    ),
    "extend_batch_size": (
        positive_int,
        "rows per step at --extend-length (default: the pretraining batch's tokens, batch-size x L / extend-length)",
    ),
    "finetune_learning_rate": (positive_float, "peak learning rate of the fine-tunes (extension, transfer)"),
    "bases": (_float_list, "RoPE bases of --study base, comma-separated"),
    "transfer_steps": (
        positive_int,
        "RoPE fine-tuning steps after the transfer in --study transfer (default steps / 10)",
    ),
    "hidden_size": (positive_int, "model width"),
    "num_layers": (positive_int, "transformer blocks"),
    "num_heads": (positive_int, "attention heads"),
    "rope_base": (positive_float, "RoPE base theta, > 1 (default 10000)"),
    "batch_size": (positive_int, "rows per optimizer step, all processes together"),
    "steps": (positive_int, "optimizer steps per model"),
    "learning_rate": (positive_float, "peak learning rate"),
    "min_learning_rate": (positive_float, "learning rate at the last step (cosine decay)"),
    "warmup_steps": (_non_negative_int, "linear warm-up steps"),
    "weight_decay": (_float, "AdamW weight decay on linear layers"),
    "grad_clip": (positive_float, "gradient-norm clip"),
    "passkey_fraction": (_float, "fraction of training rows ending with a passkey sample"),
    "passkey_trials": (_non_negative_int, "passkey prompts per evaluation length and seed (0: no passkey evaluation)"),
    "passkey_depths": (_float_list, "key positions in the filler, fractions in [0, 1]"),
    "eval_tokens": (positive_int, "held-out tokens evaluated at every length in non-overlapping windows"),
    "eval_stride": (positive_int, "stride of the sliding-window evaluation (default L / 2)"),
    "sliding_tokens": (
        _non_negative_int,
        "held-out tokens scored by the sliding-window evaluation at every length (0: none)",
    ),
    "retrieval_trials": (_non_negative_int, "random spans per distance of the retrieval probe (0: no probe)"),
    "retrieval_span": (positive_int, "bytes per span of the retrieval probe"),
    "retrieval_distances": (_int_list, "distances of the retrieval probe, comma-separated (default L/4 .. 8L)"),
    "task_steps": (
        _non_negative_int,
        "steps of each task model (copy and associative recall, one per encoding and seed; 0: no task models)",
    ),
    "task_seeds": (positive_int, "how many of the seeds (the first) also train task models (default: all)"),
    "task_length": (positive_int, "training length of the task models (evaluated at 1, 2, 4 and 8 times it)"),
    "task_hidden_size": (positive_int, "width of the task models"),
    "task_batch_size": (positive_int, "rows per step of a task model, half copy, half recall"),
    "task_learning_rate": (positive_float, "peak learning rate of the task models"),
    "task_trials": (positive_int, "evaluation rows per task, length and seed"),
    "task_pairs": (positive_int, "key-value pairs per associative-recall row"),
    "held_out_fraction": (_float, "last fraction of the text kept for evaluation"),
    "seed": (
        seed,
        "first seed: initialisation and batches of the first run of every method, and every evaluation prompt",
    ),
    "checkpoint_every": (positive_int, "steps between checkpoints"),
    "device": (str, "cpu or cuda (default: cuda when available)"),
    "precision": (
        str,
        "auto (bf16 autocast on cuda, fp32 on the cpu), fp32 or bf16 (autocast on any device); weights stay fp32",
    ),
    "compile": (
        str,
        "torch.compile the training step: off, auto (on cuda only; the large preset's) or on (every device)",
    ),
    "threads": (
        count(max(64, 4 * (os.cpu_count() or 1)), f"4 x the {os.cpu_count()} logical CPUs, at least 64"),
        "torch CPU threads of each model (default: 1 when models train side by side, see --jobs, else torch's "
        "choice); the numbers are bit-identical at equal counts",
    ),
    "data": (
        str,
        "UTF-8 text: files, directories or glob patterns, or builtin:pydoc (the default, CPython's "
        "pydoc_data.topics) or builtin:stdlib (the standard library's sources, tens of MB)",
    ),
}


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The preset, overridden by every flag given."""
    settings = dict(PRESETS[args.preset])
    for name in SETTINGS:
        value = getattr(args, name)
        if value is not None:
            settings[name] = tuple(value) if isinstance(value, list) else value
    return ExperimentConfig(**settings)


def _experiment(args: argparse.Namespace) -> int:
    from rotary.tools.experiments.run import run_experiment

    quiet: dict = {}
    if args.json:  # stdout holds the JSON alone: progress and the table go to stderr
        import sys

        from rich.console import Console

        from rotary.tools.experiments.progress import Reporter

        quiet = {
            "reporter": Reporter(enabled=os.environ.get("RANK", "0") == "0", stream=sys.stderr),
            "console": Console(file=sys.stderr, width=120),
        }
    try:
        directory = run_experiment(
            config_from_args(args), out=args.out, resume=args.resume, jobs=args.jobs, figures=args.figures, **quiet
        )
    except ExperimentError:
        if os.environ.get("RANK", "0") != "0":  # under torchrun every rank finds the same error; rank 0 alone says it
            return 2
        raise
    except ImportError:  # matplotlib or rich missing: rotary's one line (status 1) from rank 0 alone
        if os.environ.get("RANK", "0") != "0":
            return 1
        raise
    if args.json and os.environ.get("RANK", "0") == "0":
        print_json(
            {
                "directory": str(directory),
                "files": [
                    str(directory / name)
                    for name in (
                        "report.md",
                        "results.json",
                        "results.csv",
                        "positions.csv",
                        "passkey.csv",
                        "retrieval.csv",
                        "tasks.csv",
                        "config.json",
                    )
                ],
                "figures": sorted(str(f) for f in (directory / "figures").glob("*.png")),
            }
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="train short, test long: position encodings and RoPE scalings compared past the training length",
        description="Trains small Decoders per position encoding at length L on byte-level text, --seeds times each, "
        "evaluates each at L, 2L, 4L, 8L (perplexity in non-overlapping and sliding windows, loss by position, and "
        "where asked a retrieval probe and passkey retrieval) with the RoPE model also under inference-time scalings, "
        "fine-tuned at --extend-length with each scaling and trained from scratch there; trains a small model per "
        "encoding on synthetic copy and associative-recall tasks and measures them at 1 to 8 times their length; and "
        "writes results.json, CSV files, figures and report.md. --study base and --study transfer run the two studies "
        "instead.",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="default",
        help="tiny (seconds, for tests), default (what make demo runs; about 9 min on 2 idle CPU cores), large (one "
        "GPU within 20 minutes: bf16, compiled; builtin:stdlib)",
    )
    p.add_argument(
        "-o", "--out", type=output_path, metavar="DIR", help="run directory (default runs/experiment-<UTC time>)"
    )
    p.add_argument("--resume", metavar="DIR", help="continue an interrupted run in DIR (same settings)")
    p.add_argument(
        "--jobs",
        type=count(max(64, 4 * (os.cpu_count() or 1)), f"4 x the {os.cpu_count()} logical CPUs, at least 64"),
        default=None,
        help="models trained and evaluated at a time on the CPU, each in a process of its own on --threads threads "
        "(default: as many as torch's threads hold, 2 on 2 cores, one thread each; 1 under torchrun or on cuda). "
        "The numbers do not depend on it: --jobs 1 gives the same bytes at the same --threads",
    )
    p.add_argument(
        "--figures",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="draw figures/*.png and *.svg (matplotlib; a third of a tiny run's time). --no-figures writes the numbers "
        "and report.md without them; the same command with --resume DIR draws them later, without training again",
    )
    p.add_argument(
        "--json", action="store_true", help="print the run directory and the files written as JSON (progress on stderr)"
    )
    choices = {
        "device": ["cpu", "cuda"],
        "study": list(STUDIES),
        "precision": list(PRECISIONS),
        "compile": list(COMPILE_MODES),
    }
    for name, (kind, text) in SETTINGS.items():  # default None: the preset's value
        extra = {"nargs": "+", "metavar": "SOURCE"} if name == "data" else {}
        if name in choices:
            extra["choices"] = choices[name]
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text, **extra)
    p.set_defaults(func=_experiment)
