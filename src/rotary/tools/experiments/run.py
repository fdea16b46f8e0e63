"""One run end to end: check every input (before the directory is created, so bad input leaves nothing behind),
train each model, evaluate it, write the outputs::

    config.json                      the settings and the text's sha256 (what --resume compares)
    models/<name>/checkpoint.pt      model + optimizer + step, every checkpoint_every steps
    models/<name>/evaluation.json    that model's rows, once evaluated
    figures/*.png, figures/*.svg     perplexity, position buckets, passkey
    results.csv, report.md
    results.json                     written last: a directory without it is not a finished run
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError
from ..io import write_atomic
from .caveats import caveats
from .claims import Assessment, assess
from .config import ExperimentConfig, ExperimentError
from .data import Corpus, evaluation_tokens, load_corpus, sliding_starts
from .distributed import Distributed
from .evaluate import EvaluationText
from .figures import draw_figures, loss_curves
from .jobs import ModelResult, evaluate_cached, model_record
from .parallel import choose_jobs, run_in_parallel
from .plan import ModelSpec, model_specs
from .progress import Reporter, table_console
from .report import report_markdown, results_json
from .reproduce import command_line, differences
from .results import Results
from .rows import Measurements
from .studies import predicted_limits, study_claims
from .tables import render_table
from .train import train_model

__all__ = [
    "RUN_FORMAT",
    "environment",
    "load_run",
    "prepare_run_dir",
    "require_report_packages",
    "load_text",
    "open_run_dir",
    "print_summary",
    "run_experiment",
    "run_record",
    "settle_config",
    "train_and_evaluate",
    "write_figures",
    "write_run",
]

RUN_FORMAT = 2


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def environment(config: ExperimentConfig, dist: Distributed, jobs: int = 1) -> dict[str, Any]:
    """Versions, the machine, threads per model, models at a time, device and processes."""
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
        "rotary": rotary.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "jobs": jobs,
        "device": config.device,
        "world_size": dist.world_size,
        "cuda": torch.cuda.get_device_name(0) if config.device == "cuda" else None,
    }


def require_report_packages(figures: bool = True) -> None:
    """Import matplotlib (for the figures; not with figures=False) and rich now, not after training.

    Raises:
        ImportError: one is missing or broken; the message names the extra ``rotary[plot]``.

    >>> require_report_packages()  # both are installed here
    """
    import importlib

    for package in ("matplotlib", "rich") if figures else ("rich",):
        try:
            importlib.import_module(package)
        except ImportError as exc:
            raise ImportError(
                f"rotary experiment draws its figures with matplotlib and prints its table with rich, but {package} "
                f"cannot be imported ({exc}); install both with: pip install 'rotary[plot]'",
                name=package,
            ) from None


def _load_average() -> list[float] | None:
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
            raise InputError("unknown format")
    except (ValueError, OSError) as exc:
        raise ExperimentError(
            f"--resume {directory}: config.json is corrupted ({exc}); the run cannot be continued"
        ) from None
    return stored


def _command_of(stored: dict[str, Any]) -> str:
    """The command that continues a stored run: its preset and the settings that differ from that preset now."""
    try:
        return command_line(ExperimentConfig.from_dict(stored["config"]))
    except (InputError, KeyError, TypeError, ValueError):  # settings of another version: what it recorded
        return stored.get("command", "?")


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
        ExperimentError: ``--resume`` on a directory of another configuration (naming every setting that
            differs), not a run, or corrupted; ``--out`` holding files or not writable.
    """
    if resume is not None:
        directory = Path(resume)
        if out is not None and Path(out).resolve() != directory.resolve():
            raise ExperimentError(f"--out {out} and --resume {resume} differ; --resume DIR writes into DIR, drop --out")
        stored = _stored_run(directory)
        diffs = differences(stored["config"], config.to_dict())
        if stored.get("data", {}).get("sha256") != corpus.sha256:
            diffs.append(
                f"data: the run's text has sha256 {stored.get('data', {}).get('sha256', '?')[:12]}…, "
                f"this one {corpus.sha256[:12]}…"
            )
        if diffs:
            raise ExperimentError(
                f"--resume {directory} was started with other settings: {'; '.join(diffs)}. "
                f"Continue it with the command it was started with: {_command_of(stored)} --resume {directory}"
            )
        if dist.is_main:
            _writable(directory)
        return directory, True
    directory = Path(out) if out is not None else Path("runs") / f"experiment-{_utc_now():%Y%m%dT%H%M%SZ}"
    if directory.exists() and not directory.is_dir():
        raise ExperimentError(f"--out {directory} is a file; give a directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise ExperimentError(
            f"--out {directory} already holds files; choose a new directory, or continue a run "
            f"there with --resume {directory}"
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
    jobs: int | None = None,
    figures: bool = True,
) -> Path:
    """Run the experiment ``config`` describes and return its directory; ``config`` is left as given.

    The same on one process and under torchrun (rank 0 writes). The steps: :func:`settle_config`,
    :func:`load_text`, :func:`open_run_dir`, :func:`train_and_evaluate`, :func:`run_record`, :func:`write_run`,
    :func:`print_summary`.

    Args:
        config: the settings (``device`` / ``threads`` None: chosen for this run).
        out: the run directory (default ``runs/experiment-<UTC time>``).
        resume: continue the run in this directory (its settings must equal ``config``).
        reporter, console: progress output and the rich console of the final table (defaults: stdout).
        jobs: models at a time, each in its own process (None: :func:`choose_jobs`).
        figures: draw ``figures/`` (False: the numbers and the report without them, matplotlib not needed).

    Raises:
        ExperimentError: bad input, before anything is written; a training that diverges.
        ImportError: matplotlib or rich missing, before anything is written.

    Example (minutes of training, so not run here)::

        directory = run_experiment(ExperimentConfig(**PRESETS["tiny"]), out="runs/tiny")  # runs/tiny/report.md, ...
    """
    started, wall = _utc_now(), time.perf_counter()
    load_at_start = _load_average()
    dist = Distributed.from_env()
    config, specs, jobs = settle_config(config, dist, jobs, figures=figures)
    torch.set_num_threads(config.threads)
    reporter = reporter or Reporter(enabled=dist.is_main)
    t = time.perf_counter()
    corpus, text = load_text(config)
    command = command_line(config)
    directory, resumed = open_run_dir(config, corpus, command, out=out, resume=resume, dist=dist)
    timings = {"load data": time.perf_counter() - t}
    reporter.log(_announcement(config, specs, directory, jobs))
    try:
        t = time.perf_counter()
        done = train_and_evaluate(specs, config, corpus, text, directory, resumed, reporter, dist, jobs)
        if done is None:  # a rank other than 0: it trained its shards, rank 0 writes
            return directory
        models_seconds = time.perf_counter() - t if jobs > 1 else None
        # one model's phases after another's, in plan order, however many ran at a time
        for phase in ("train", "evaluate"):
            for spec in specs:
                timings[f"{phase} {spec.name}"] = getattr(done[spec.name], f"{phase}_seconds")
        t = time.perf_counter()
        measurements = Measurements()
        for spec in specs:
            measurements.extend(done[spec.name].rows)
        results = Results(measurements, specs, config)
        assessments = assess(study_claims(config), results)
        machine = {
            **environment(config, dist, jobs),
            "load_average_at_start": load_at_start,
            "load_average_at_end": _load_average(),
        }
        run = run_record(
            results, specs, done, assessments, corpus, text, command=command, environment=machine, started=started
        )
        run["timings"] = timings
        if jobs > 1:  # the models' phases overlapped: their sum is more than the wall time they took
            run["parallel"] = {"jobs": jobs, "threads": config.threads, "seconds": models_seconds}
        drawn = write_figures(run, results, directory / "figures") if figures else {}
        timings["report"] = time.perf_counter() - t
        run["finished"] = _utc_now().isoformat(timespec="seconds")
        run["wall_seconds"] = time.perf_counter() - wall
        write_run(run, results, assessments, drawn, directory)
        print_summary(run, results, directory, console if console is not None else table_console(), figures=figures)
        return directory
    finally:
        dist.stop()


def settle_config(
    config: ExperimentConfig, dist: Distributed, jobs: int | None, *, figures: bool = True
) -> tuple[ExperimentConfig, list[ModelSpec], int]:
    """Check every input; return a copy of ``config`` with device and threads chosen where None, the models
    in plan order, and how many train at a time.

    Raises:
        ExperimentError: a bad setting, CUDA asked for and missing, a batch that does not split into torchrun's
            processes, a bad ``jobs``.
        ImportError: matplotlib or rich missing.
    """
    if config.device is None:
        config = dataclasses.replace(config, device="cuda" if torch.cuda.is_available() else "cpu")
    config.validate()
    if config.device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ExperimentError(
            f"--device cuda: CUDA is not available (torch {torch.__version__}, {build}); use --device cpu"
        )
    require_report_packages(figures)  # before anything is trained or written: the figures and the table need them
    if config.batch_size % dist.world_size:
        raise ExperimentError(
            f"torchrun runs {dist.world_size} processes but --batch-size {config.batch_size} does not split into "
            f"{dist.world_size} equal shards; use a batch size divisible by {dist.world_size}"
        )
    specs = model_specs(config)
    odd = next((s for s in specs if s.rows % dist.world_size), None)
    if odd is not None:
        raise ExperimentError(
            f"torchrun runs {dist.world_size} processes but {odd.model} trains on {odd.rows} rows of {odd.length} "
            f"tokens (--batch-size x L / --extend-length), which do not split into {dist.world_size} equal shards; set "
            f"--extend-batch-size to a multiple of {dist.world_size}, or --extend-steps 0"
        )
    jobs, threads = choose_jobs(config, dist, jobs, models=len(specs))
    if threads != config.threads:
        config = dataclasses.replace(config, threads=threads)
    return config, specs, jobs


def load_text(config: ExperimentConfig) -> tuple[Corpus, EvaluationText]:
    """The training text and the held-out text; ExperimentError when it is missing, not text or too small."""
    corpus = load_corpus(config)
    tokens = evaluation_tokens(corpus, config)
    return corpus, EvaluationText(tokens, sliding_starts(config, tokens.numel()), corpus.held_out)


def open_run_dir(
    config: ExperimentConfig, corpus: Corpus, command: str, *, out: str | None, resume: str | None, dist: Distributed
) -> tuple[Path, bool]:
    """The run directory and whether it is resumed, on every rank (rank 0 checks and creates it); ExperimentError
    on every rank when rank 0 refused the directory (only rank 0 names why).
    """
    # the run directory is rank 0's to check and create; the ranks then agree, so that bad input stops
    # every process (none is left waiting for the others) and only rank 0 names it
    dist.start(config.device)
    failure: ExperimentError | None = None
    directory, resumed = Path(resume or out or "."), resume is not None
    if dist.is_main:
        try:
            directory, resumed = prepare_run_dir(config, corpus, out=out, resume=resume, dist=dist)
            if not resumed:
                stored = {
                    "format": RUN_FORMAT,
                    "command": command,
                    "config": config.to_dict(),
                    "data": {"source": corpus.source, "sha256": corpus.sha256, "bytes": corpus.num_bytes},
                }
                write_atomic(directory / "config.json", json.dumps(stored, indent=1) + "\n")
        except ExperimentError as exc:
            failure = exc
    if not dist.agree(failure is None, dist.device(config.device)):
        dist.stop(sync=dist.device(config.device))
        raise failure or ExperimentError("rank 0 stopped on bad input")
    return directory, resumed


def _announcement(config: ExperimentConfig, specs: list[ModelSpec], directory: Path, jobs: int) -> str:
    what = {
        None: f"{len(config.encodings)} encodings",
        "base": f"the base study ({len(config.bases)} bases)",
        "transfer": "the transfer study",
    }[config.study]
    return (
        f"rotary experiment: {what}, {config.seeds} seed(s), {len(specs)} models, L = {config.train_length}, "
        f"evaluated at {', '.join(map(str, sorted(config.eval_lengths)))}; writing {directory}"
        + (f"; {jobs} models at a time, {config.threads} torch thread(s) each" if jobs > 1 else "")
    )


def train_and_evaluate(
    specs: list[ModelSpec],
    config: ExperimentConfig,
    corpus: Corpus,
    text: EvaluationText,
    directory: Path,
    resumed: bool,
    reporter: Reporter,
    dist: Distributed,
    jobs: int,
) -> dict[str, ModelResult] | None:
    """Every model trained (or resumed) and evaluated, by name; None off rank 0.

    ``jobs`` above 1: that many models at a time, each in its own process; otherwise one after the other, every
    rank training its shard and rank 0 evaluating. Raises ExperimentError when a training diverges.
    """
    if jobs > 1:
        return run_in_parallel(specs, config, jobs, corpus.train, text, directory, resumed, reporter)
    trained = {}
    for spec in specs:
        parent = trained[spec.parent_name].model if spec.parent else None
        trained[spec.name] = train_model(
            spec,
            config,
            corpus.train,
            parent=parent,
            run_dir=directory,
            resume=resumed,
            reporter=reporter,
            dist=dist,
        )
    # the last collective is behind every rank: they leave the group together, and rank 0
    # evaluates and writes the report alone
    dist.stop(sync=dist.device(config.device))
    if not dist.is_main:
        return None
    done = {}
    for spec in specs:
        outcome = trained[spec.name]
        rows, seconds = evaluate_cached(spec, outcome.model, text, config, directory, resumed, reporter)
        done[spec.name] = ModelResult(model_record(spec, outcome, config), rows, outcome.seconds, seconds)
    return done


def run_record(
    results: Results,
    specs: list[ModelSpec],
    done: dict[str, ModelResult],
    assessments: Sequence[Assessment],
    corpus: Corpus,
    text: EvaluationText,
    *,
    command: str,
    environment: dict[str, Any],
    started: datetime,
) -> dict[str, Any]:
    """The start of ``results.json`` (command, settings, text, machine, models, rows, claims); the caller adds
    ``timings``, ``parallel``, ``finished`` and ``wall_seconds``.
    """
    config = results.config
    return {
        "format": RUN_FORMAT,
        "command": command,
        "config": config.to_dict(),
        "data": {
            "source": corpus.source,
            "sha256": corpus.sha256,
            "bytes": corpus.num_bytes,
            "files": corpus.files,
            "skipped": corpus.skipped,
            "train_bytes": corpus.train.numel(),
            "held_out_bytes": corpus.held_out.numel(),
            "eval_tokens": text.windows.numel(),
            "sliding_tokens": len(text.sliding) * config.stride,
        },
        "environment": environment,
        "models": [done[spec.name].record for spec in specs],
        "rows": results.rows.to_json(),
        "claims": [dataclasses.asdict(a) for a in assessments],
        "started": started.isoformat(timespec="seconds"),
    }


def write_run(
    run: dict[str, Any],
    results: Results,
    assessments: Sequence[Assessment],
    figures: dict[str, list[Path]],
    directory: Path,
) -> None:
    """Write a run's CSV files, ``report.md`` and, last (it marks the run finished), ``results.json``."""
    for name, content in results.rows.csv_files().items():
        write_atomic(directory / name, content)
    write_atomic(directory / "report.md", report_markdown(run, results, assessments, figures))
    write_atomic(directory / "results.json", results_json(run))


def print_summary(
    run: dict[str, Any], results: Results, directory: Path, console: Any, *, figures: bool = True
) -> None:
    """Print a finished run's table, its caveats and what it wrote in how long, on ``console`` (rich)."""
    render_table(results, console)
    for caveat in caveats(results):
        console.print(f"[bold yellow]{caveat.split(':', 1)[0]}:[/]{caveat.split(':', 1)[1]}")
    timings = run["timings"]
    train = sum(v for k, v in timings.items() if k.startswith("train "))
    evaluate = sum(v for k, v in timings.items() if k.startswith("evaluate "))
    parallel = run.get("parallel")
    if parallel:
        spent = (
            f"{parallel['jobs']} models at a time for {parallel['seconds']:.0f} s: training {train:.0f} s and "
            f"evaluation {evaluate:.0f} s, summed over the models"
        )
    else:
        spent = f"training {train:.0f} s, evaluation {evaluate:.0f} s"
    files = "the CSV files and figures/" if figures else "and the CSV files"
    console.print(f"wrote {directory}/report.md, results.json, {files} in {run['wall_seconds']:.0f} s ({spent})")


def write_figures(run: dict[str, Any], results: Results, directory: Path) -> dict[str, list[Path]]:
    """Every figure of a run, with the base study's predicted limits and the transfer study's training curves."""
    config = results.config
    figures = draw_figures(results, directory, predicted_limits(results) if config.study == "base" else None)
    if config.study == "transfer":
        short = config.steps - config.transfer_finetune_steps
        figures["training"] = loss_curves(
            run["models"],
            directory,
            "training_loss",
            "Training loss: sinusoidal, RoPE, and sinusoidal moved to RoPE",
            {"transfer": short},
        )
    return figures


def load_run(directory: Path) -> tuple[dict[str, Any], Results]:
    """A finished run's ``results.json`` and its :class:`Results`; ExperimentError when there is none or of
    another format.
    """
    path = directory / "results.json"
    if not path.is_file():
        raise ExperimentError(f"{directory} has no results.json: not a finished run")
    run = json.loads(path.read_text())
    if run.get("format") != RUN_FORMAT:
        raise ExperimentError(
            f"{path} is of format {run.get('format')!r}, not {RUN_FORMAT}: run the experiment again with this version"
        )
    config = ExperimentConfig.from_dict(run["config"])
    return run, Results(Measurements.from_json(run["rows"]), _specs(run["models"]), config)


def _specs(models: list[dict[str, Any]]) -> list[ModelSpec]:
    names = {f.name for f in dataclasses.fields(ModelSpec)}
    return [ModelSpec(**{k: v for k, v in m["spec"].items() if k in names}) for m in models]
