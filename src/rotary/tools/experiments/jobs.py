"""One model of a run from start to end: trained, evaluated once (cached in ``models/<name>/evaluation.json``)
and described for ``results.json``, whether models run one at a time or several at once.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rotary.models import Decoder

from ..io import write_atomic
from .config import ExperimentConfig
from .evaluate import EvaluationText, evaluate_model
from .plan import ModelSpec
from .progress import Reporter
from .report import results_json
from .rows import Measurements
from .train import TrainOutcome, build_model

__all__ = ["ModelResult", "evaluate_cached", "model_from_bytes", "model_record", "state_bytes"]


@dataclass
class ModelResult:
    """What the run keeps of one model: its ``results.json`` record, its rows, the seconds of each phase."""

    record: dict[str, Any]
    rows: Measurements
    train_seconds: float
    evaluate_seconds: float


def state_bytes(model: torch.nn.Module) -> bytes:
    """``model``'s state dict as ``torch.save`` writes it: what a process sends another (exact values)."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def model_from_bytes(spec: ModelSpec, config: ExperimentConfig, state: bytes) -> Decoder:
    """The model of ``spec`` with the weights of :func:`state_bytes`, in eval mode (as
    :func:`~.train.start_model` reads a parent).
    """
    model = build_model(spec, config)
    model.load_state_dict(torch.load(io.BytesIO(state), map_location="cpu", weights_only=True))
    return model.eval()


def evaluate_cached(
    spec: ModelSpec,
    model: torch.nn.Module,
    text: EvaluationText,
    config: ExperimentConfig,
    directory: Path,
    resumed: bool,
    reporter: Reporter,
) -> tuple[Measurements, float]:
    """Every measurement of ``model`` and its seconds; a resumed run reads an earlier session's from
    ``evaluation.json`` when its settings match (an unreadable file is measured again).
    """
    path = directory / "models" / spec.name / "evaluation.json"
    if resumed and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("config") == config.to_dict():
                reporter.log(f"evaluate {spec.name}: already done")
                return Measurements.from_json(cached["rows"]), float(cached["seconds"])
        except (ValueError, KeyError, TypeError, OSError):
            pass  # an unreadable cache is recomputed, never trusted
    t = time.perf_counter()
    rows = evaluate_model(spec, model, text, config, reporter)
    seconds = time.perf_counter() - t
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, results_json({"config": config.to_dict(), "seconds": seconds, "rows": rows.to_json()}))
    return rows, seconds


def model_record(spec: ModelSpec, outcome: TrainOutcome, config: ExperimentConfig) -> dict[str, Any]:
    """The ``results.json`` entry of a trained model: spec, size, training time, losses, and whether a learned
    table's rows past ``L`` are as initialised.
    """
    model = outcome.model
    recent = outcome.losses[-20:]
    record = {
        "name": spec.name,
        "model": spec.model,
        "label": spec.label,
        "stage": spec.stage,
        "encoding": spec.encoding,
        "seed": spec.seed,
        "spec": dataclasses.asdict(spec),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": outcome.seconds,
        "tokens_per_second": outcome.tokens_per_second,
        "resumed_at_step": outcome.resumed_at,
        "compiled": outcome.compiled,
        "compile_seconds": outcome.compile_seconds,
        "final_loss": sum(recent) / len(recent) if recent else None,
        "losses": outcome.losses,
    }
    # a learned table is sized to the longest evaluation length; its rows past L must be untouched
    table = [
        k
        for k, v in model.state_dict().items()
        if "embed_positions" in k and v.dim() == 2 and v.shape[0] > config.train_length
    ]
    if table and spec.stage == "pretrain":
        initial = build_model(spec, config).state_dict()[table[0]]
        trained = model.state_dict()[table[0]].cpu()
        record["untrained_rows_unchanged"] = bool(
            torch.equal(trained[config.train_length :], initial[config.train_length :])
        )
        record["trained_rows_changed"] = bool(
            not torch.equal(trained[: config.train_length], initial[: config.train_length])
        )
    return record
