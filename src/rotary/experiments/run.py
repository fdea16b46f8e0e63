"""One run end to end: check every input, train each model, evaluate it, write the outputs.

Layout of a run directory::

    config.json                      the settings and the text's sha256 (what --resume compares)
    models/<name>/checkpoint.pt      model + optimizer + step, every checkpoint_every steps
    models/<name>/evaluation.json    that model's rows, once evaluated
    figures/*.png, figures/*.svg     perplexity, position buckets, passkey
    results.csv, report.md
    results.json                     written last: a directory without it is not a finished run

Every check on the input happens before the directory is created, so bad input leaves nothing
behind.
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .config import ExperimentConfig, ExperimentError, command_line, differences
from .data import Corpus, evaluation_tokens, load_corpus
from .evaluate import bucket_edges, evaluate_model
from .progress import Reporter, table_console
from .report import (
    csv_text,
    draw_figures,
    render_table,
    report_markdown,
    results_json,
    separation,
    spread,
    write_atomic,
)
from .train import Distributed, ModelSpec, build_model, model_specs, train_model

__all__ = ["RUN_FORMAT", "environment", "prepare_run_dir", "require_report_packages", "run_experiment"]

RUN_FORMAT = 1


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def environment(config: ExperimentConfig, dist: Distributed) -> dict[str, Any]:
    """Library and torch versions, Python, the machine, threads, device, processes."""
    import rotary

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "rotary": rotary.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "cpu": cpu, "logical_cpus": os.cpu_count(),
        "threads": torch.get_num_threads(), "device": config.device, "world_size": dist.world_size,
        "cuda": torch.cuda.get_device_name(0) if config.device == "cuda" else None,
    }


def require_report_packages() -> None:
    """Import matplotlib (the figures) and rich (the table, the progress bars) now, not after training.

    Raises:
        ImportError: one of them is missing or broken; ``name`` is the package, and the message names
            the extra that installs both, ``rotary[plot]``.

    Example:
        >>> require_report_packages()  # both are installed here
    """
    import importlib

    for package in ("matplotlib", "rich"):
        try:
            importlib.import_module(package)
        except ImportError as exc:
            raise ImportError(
                f"rotary experiment draws its figures with matplotlib and prints its table with rich, but {package} "
                f"cannot be imported ({exc}); install both with: pip install 'rotary[plot]'",
                name=package,
            ) from None


def _load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none): other jobs slow a run."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _stored_run(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not directory.is_dir():
        raise ExperimentError(f"--resume {directory}: no such run directory")
    if not path.is_file():
        raise ExperimentError(f"--resume {directory} is not a run of rotary experiment (it has no config.json)")
    try:
        stored = json.loads(path.read_text())
        if stored.get("format") != RUN_FORMAT or not isinstance(stored.get("config"), dict):
            raise ValueError("unknown format")
    except (ValueError, OSError) as exc:
        raise ExperimentError(f"--resume {directory}: config.json is corrupted ({exc}); the run cannot be continued") from None
    return stored


def _writable(directory: Path) -> None:
    """Create ``directory`` (and parents) and prove a file can be written in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".rotary-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ExperimentError(
            f"--out {directory} is not writable ({exc.strerror or exc}); choose a directory you can write to"
        ) from None


def prepare_run_dir(
    config: ExperimentConfig, corpus: Corpus, *, out: str | None, resume: str | None, dist: Distributed
) -> tuple[Path, bool]:
    """The run directory and whether it is resumed; checks it, creates it (rank 0) if new.

    Raises:
        ExperimentError: ``--resume`` on a directory of another configuration (names every setting that
            differs), not a run, or corrupted; ``--out`` holding files or not writable.
    """
    if resume is not None:
        directory = Path(resume)
        if out is not None and Path(out).resolve() != directory.resolve():
            raise ExperimentError(f"--out {out} and --resume {resume} differ; --resume DIR writes into DIR, drop --out")
        stored = _stored_run(directory)
        diffs = differences(stored["config"], config.to_dict())
        if stored.get("data", {}).get("sha256") != corpus.sha256:
            diffs.append(f"data: the run's text has sha256 {stored.get('data', {}).get('sha256', '?')[:12]}…, this one {corpus.sha256[:12]}…")
        if diffs:
            raise ExperimentError(
                f"--resume {directory} was started with other settings: {'; '.join(diffs)}. "
                f"Continue it with the command it was started with: {stored.get('command', '?')} --resume {directory}"
            )
        if dist.is_main:
            _writable(directory)
        return directory, True
    directory = Path(out) if out is not None else Path("runs") / f"experiment-{_utc_now():%Y%m%dT%H%M%SZ}"
    if directory.exists() and not directory.is_dir():
        raise ExperimentError(f"--out {directory} is a file; give a directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise ExperimentError(
            f"--out {directory} already holds files; choose a new directory, or continue a run there with --resume {directory}"
        )
    if dist.is_main:
        _writable(directory)
    return directory, False


def run_experiment(
    config: ExperimentConfig,
    *,
    out: str | None = None,
    resume: str | None = None,
    reporter: Reporter | None = None,
    console: Any = None,
) -> Path:
    """Run the experiment ``config`` describes and return its directory.

    Works the same on one process and under torchrun (rank 0 writes; the others only train).

    Args:
        config: the settings (``device`` / ``threads`` None: chosen here).
        out: the run directory (default ``runs/experiment-<UTC time>``).
        resume: continue the run in this directory (its settings must equal ``config``).
        reporter: progress output (default: bars on a terminal, lines otherwise; silent off rank 0).
        console: a rich console for the final table (default: one on stdout).

    Raises:
        ExperimentError: any bad input, before anything is written; a training that diverges
            (:class:`~rotary.experiments.train.TrainingDiverged`).
        ImportError: matplotlib or rich missing (:func:`require_report_packages`), before anything is written.
    """
    started, wall = _utc_now(), time.perf_counter()
    load_at_start = _load_average()
    dist = Distributed.from_env()
    if config.device is None:
        config.device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.threads is None:
        config.threads = torch.get_num_threads()
    config.validate()
    if config.device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ExperimentError(f"--device cuda: CUDA is not available (torch {torch.__version__}, {build}); use --device cpu")
    require_report_packages()  # before anything is trained or written: the figures and the table need them
    if config.batch_size % dist.world_size:
        raise ExperimentError(
            f"torchrun runs {dist.world_size} processes but --batch-size {config.batch_size} does not split into "
            f"{dist.world_size} equal shards; use a batch size divisible by {dist.world_size}"
        )
    torch.set_num_threads(config.threads)
    reporter = reporter or Reporter(enabled=dist.is_main)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    corpus = load_corpus(config)
    tokens = evaluation_tokens(corpus, config)
    command = command_line(config)
    # the run directory is rank 0's to check and create; the ranks then agree, so that bad input stops
    # every process (none is left waiting for the others) and only rank 0 names it
    dist.start(config.device)
    failure: ExperimentError | None = None
    directory, resumed = Path(resume or out or "."), resume is not None
    if dist.is_main:
        try:
            directory, resumed = prepare_run_dir(config, corpus, out=out, resume=resume, dist=dist)
            if not resumed:
                write_atomic(directory / "config.json", json.dumps({
                    "format": RUN_FORMAT, "command": command, "config": config.to_dict(),
                    "data": {"source": corpus.source, "sha256": corpus.sha256, "bytes": corpus.num_bytes},
                }, indent=1) + "\n")
        except ExperimentError as exc:
            failure = exc
    if not dist.agree(failure is None, dist.device(config.device)):
        dist.stop(sync=dist.device(config.device))
        raise failure or ExperimentError("rank 0 stopped on bad input")
    timings["load data"] = time.perf_counter() - t
    reporter.log(f"rotary experiment: {len(config.encodings)} encodings, L = {config.train_length}, "
                 f"evaluated at {', '.join(map(str, sorted(config.eval_lengths)))}; writing {directory}")

    try:
        specs = model_specs(config)
        trained = {}
        for spec in specs:
            outcome = train_model(spec, config, corpus.train, run_dir=directory, resume=resumed, reporter=reporter, dist=dist)
            trained[spec.name] = outcome
            timings[f"train {spec.name}"] = outcome.seconds
        # the last collective is behind every rank: they leave the group together, and rank 0
        # evaluates and writes the report alone
        dist.stop(sync=dist.device(config.device))
        if not dist.is_main:
            return directory
        rows, models = [], []
        for spec in specs:
            outcome = trained[spec.name]
            model_rows, seconds = _evaluate_cached(spec, outcome.model, tokens, config, directory, resumed, reporter)
            timings[f"evaluate {spec.name}"] = seconds
            rows += model_rows
            models.append(_model_record(spec, outcome, config))
        t = time.perf_counter()
        results = {
            "format": RUN_FORMAT, "command": command, "config": config.to_dict(),
            "data": {
                "source": corpus.source, "sha256": corpus.sha256, "bytes": corpus.num_bytes,
                "train_bytes": corpus.train.numel(), "held_out_bytes": corpus.held_out.numel(), "eval_tokens": tokens.numel(),
            },
            "environment": {**environment(config, dist), "load_average_at_start": load_at_start, "load_average_at_end": _load_average()},
            "models": models, "results": rows,
            "spread": spread(rows, config), "separation": separation(rows, config),
            "started": started.isoformat(timespec="seconds"), "timings": timings,
        }
        figures = draw_figures(rows, config, directory / "figures")
        timings["report"] = time.perf_counter() - t
        results["finished"] = _utc_now().isoformat(timespec="seconds")
        results["wall_seconds"] = time.perf_counter() - wall
        write_atomic(directory / "results.csv", csv_text(rows, bucket_edges(config)))
        write_atomic(directory / "report.md", report_markdown(results, config, figures, directory))
        write_atomic(directory / "results.json", results_json(results))  # last: marks the run finished
        if console is None:
            console = table_console()
        render_table(rows, config, console)
        console.print(f"wrote {directory}/report.md, results.json, results.csv and figures/ in {results['wall_seconds']:.0f} s")
        return directory
    finally:
        dist.stop()


def _evaluate_cached(
    spec: ModelSpec, model: torch.nn.Module, tokens: torch.Tensor, config: ExperimentConfig, directory: Path,
    resumed: bool, reporter: Reporter,
) -> tuple[list[dict], float]:
    path = directory / "models" / spec.name / "evaluation.json"
    if resumed and path.is_file():
        try:
            cached = json.loads(path.read_text())
            if cached.get("config") == config.to_dict():
                reporter.log(f"evaluate {spec.name}: already done")
                return cached["rows"], float(cached["seconds"])
        except (ValueError, KeyError, OSError):
            pass  # an unreadable cache is recomputed, never trusted
    t = time.perf_counter()
    rows = evaluate_model(spec, model, tokens, config, reporter)
    seconds = time.perf_counter() - t
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"config": config.to_dict(), "seconds": seconds, "rows": rows}) + "\n")
    return rows, seconds


def _model_record(spec: ModelSpec, outcome: Any, config: ExperimentConfig) -> dict[str, Any]:
    model = outcome.model
    record = {
        "name": spec.name, "encoding": spec.encoding, "seed": spec.seed,
        "parameters": sum(p.numel() for p in model.parameters()), "train_seconds": outcome.seconds,
        "tokens_per_second": outcome.tokens_per_second, "resumed_at_step": outcome.resumed_at,
        "final_loss": sum(outcome.losses[-20:]) / len(outcome.losses[-20:]), "losses": outcome.losses,
    }
    # a learned table is sized to the longest evaluation length; its rows past L must be untouched
    table = [k for k, v in model.state_dict().items() if "embed_positions" in k and v.dim() == 2 and v.shape[0] == config.longest]
    if table:
        initial = build_model(spec, config).state_dict()[table[0]]
        trained = model.state_dict()[table[0]].cpu()
        record["untrained_rows_unchanged"] = bool(torch.equal(trained[config.train_length :], initial[config.train_length :]))
        record["trained_rows_changed"] = bool(not torch.equal(trained[: config.train_length], initial[: config.train_length]))
    return record
