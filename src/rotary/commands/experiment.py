"""``rotary experiment``: train short, test long — position encodings and RoPE scalings compared past
the training length (also ``python -m rotary experiment`` and ``torchrun ... -m rotary experiment``)."""

from __future__ import annotations

import argparse
import math
import os

from rotary.experiments.config import PRESETS, SCALINGS, ExperimentConfig, ExperimentError, default_encodings

from .common import count, output_path, positive_float, positive_int, print_json, seed

__all__ = ["register", "config_from_args"]


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers such as 128,256,512,1024, got {text!r}") from None
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
    "train_length": (positive_int, "L: tokens (bytes) per training window"),
    "eval_lengths": (_int_list, "evaluation lengths E, comma-separated (default L,2L,4L,8L)"),
    "encodings": (_names, "position encodings to train, comma-separated (default: " + ",".join(default_encodings()) + "; also rope_alibi, rope_relative, any registered name)"),
    "scalings": (_names, "scalings of the RoPE models at evaluation, comma-separated (default: " + ",".join(SCALINGS) + ")"),
    "spread_encodings": (_names, "encodings trained a second time (--seed + 1) to measure the run-to-run spread; '' for none (default rope)"),
    "hidden_size": (positive_int, "model width"),
    "num_layers": (positive_int, "transformer blocks"),
    "num_heads": (positive_int, "attention heads"),
    "rope_base": (positive_float, "RoPE base theta (default 10000)"),
    "batch_size": (positive_int, "rows per optimizer step, all processes together"),
    "steps": (positive_int, "optimizer steps per model"),
    "learning_rate": (positive_float, "peak learning rate"),
    "min_learning_rate": (positive_float, "learning rate at the last step (cosine decay)"),
    "warmup_steps": (_non_negative_int, "linear warm-up steps"),
    "weight_decay": (_float, "AdamW weight decay on linear layers"),
    "grad_clip": (positive_float, "gradient-norm clip"),
    "passkey_fraction": (_float, "fraction of training rows ending with a passkey sample"),
    "passkey_trials": (positive_int, "passkey prompts per evaluation length (at least 50 recommended)"),
    "passkey_depths": (_float_list, "key positions in the filler, fractions in [0, 1]"),
    "eval_tokens": (positive_int, "held-out tokens evaluated at every length"),
    "held_out_fraction": (_float, "last fraction of the text kept for evaluation"),
    "seed": (seed, "seed of initialisation, batches and passkey prompts"),
    "checkpoint_every": (positive_int, "steps between checkpoints"),
    "device": (str, "cpu or cuda (default: cuda when available; mixed precision there)"),
    "threads": (
        count(max(64, 4 * (os.cpu_count() or 1)), f"4 x the {os.cpu_count()} logical CPUs, at least 64"),
        "torch CPU threads (default: torch's choice; numbers are bit-identical at equal counts)",
    ),
    "data": (str, "a UTF-8 text file to train and evaluate on (default: CPython's pydoc_data.topics)"),
}


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The preset, overridden by every flag given."""
    settings = dict(PRESETS[args.preset])
    for name in SETTINGS:
        value = getattr(args, name)
        if value is not None:
            settings[name] = value
    return ExperimentConfig(**settings)


def _experiment(args: argparse.Namespace) -> int:
    from rotary.experiments.run import run_experiment

    quiet: dict = {}
    if args.json:  # stdout holds the JSON alone: progress and the table go to stderr
        import sys

        from rich.console import Console

        from rotary.experiments.progress import Reporter

        quiet = {"reporter": Reporter(enabled=os.environ.get("RANK", "0") == "0", stream=sys.stderr),
                 "console": Console(file=sys.stderr, width=120)}  # fmt: skip
    try:
        directory = run_experiment(config_from_args(args), out=args.out, resume=args.resume, **quiet)
    except ExperimentError:
        if os.environ.get("RANK", "0") != "0":  # under torchrun every rank finds the same error; rank 0 alone says it
            return 2
        raise
    except ImportError:  # matplotlib or rich missing: rotary's one line (status 1) from rank 0 alone
        if os.environ.get("RANK", "0") != "0":
            return 1
        raise
    if args.json and os.environ.get("RANK", "0") == "0":
        print_json({
            "directory": str(directory),
            "files": [str(directory / name) for name in ("report.md", "results.json", "results.csv", "config.json")],
            "figures": sorted(str(f) for f in (directory / "figures").glob("*.png")),
        })  # fmt: skip
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "experiment",
        help="train short, test long: position encodings and RoPE scalings compared past the training length",
        description="Trains one small Decoder per position encoding at length L on byte-level text, evaluates each at "
        "L, 2L, 4L, 8L (perplexity, bits per byte, loss by position, passkey retrieval) with the RoPE model also under "
        "inference-time scalings, and writes results.json, results.csv, figures and report.md.",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="tiny (seconds, for tests), default (what make demo runs; <= 10 min on 2 CPU cores), large (a GPU)")
    p.add_argument("-o", "--out", type=output_path, metavar="DIR", help="run directory (default runs/experiment-<UTC time>)")
    p.add_argument("--resume", metavar="DIR", help="continue an interrupted run in DIR (same settings)")
    p.add_argument("--json", action="store_true", help="print the run directory and the files written as JSON (progress on stderr)")
    for name, (kind, text) in SETTINGS.items():  # default None: the preset's value
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=text,
                       **({"choices": ["cpu", "cuda"]} if name == "device" else {}))
    p.set_defaults(func=_experiment)
