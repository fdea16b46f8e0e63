"""What a run leaves besides its rows: ``report.md`` (tables: :mod:`.tables`) and the text of ``results.json``.

The report arranges the run's ``Results`` and its checked claims into prose and tables; every number in it
comes from the rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import report_templates as T
from .caveats import caveats
from .claims import Assessment, claims_table, fmt
from .config import ExperimentConfig
from .plan import SCALING_LABELS
from .results import Results
from .studies import RISE_NATS, base_table, best_at
from .tables import (
    bucket_table,
    markdown_table,
    mode_table,
    passkey_table,
    retrieval_table,
    spread_table,
    task_table,
)

__all__ = [
    "observations",
    "report_markdown",
    "results_json",
    "threads_used",
]


def results_json(results: dict[str, Any]) -> str:
    """``results.json`` text (inf / nan written as null, which JSON has no other way to say)."""

    def clean(obj: Any) -> Any:
        if isinstance(obj, float) and not math.isfinite(obj):
            return None
        if isinstance(obj, dict):
            return {str(k): clean(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        return obj

    return json.dumps(clean(results), indent=1) + "\n"


# ------------------------------------------------------------------------------------------------
# what the run shows, in sentences


def observations(results: Results) -> list[str]:
    """Plain statements of what this run measured (no expectations), one per line of the report."""
    L = results.config.train_length
    lines = []
    names = T.MODE_NAMES
    methods = results.methods()
    for mode in results.modes:
        for e in results.lengths:
            ranked = sorted(
                (s.mean, m.label)
                for m in methods
                if (s := results.perplexity(m.model, m.scaling, e, mode)) is not None and s.finite
            )
            if ranked:
                lines.append(
                    T.OBSERVED_RANGE.format(
                        length=e,
                        factor=e / L,
                        mode=names[mode],
                        lowest=ranked[0][1],
                        lowest_value=fmt(ranked[0][0]),
                        highest=ranked[-1][1],
                        highest_value=fmt(ranked[-1][0]),
                    )
                )
    longest = results.lengths[-1]
    for m in methods:
        if m.scaling == "none" and m.stage == "pretrain":
            parts = []
            for mode in results.modes:
                a, b = results.perplexity(m.model, "none", longest, mode), results.perplexity(m.model, "none", L, mode)
                if a is not None and b is not None and b.mean > 0:
                    parts.append(T.OBSERVED_GROWTH_RATIO.format(ratio=a.mean / b.mean, mode=names[mode]))
            if parts:
                lines.append(T.OBSERVED_GROWTH.format(label=m.label, factor=longest / L, ratios=" and ".join(parts)))
    first, last = results.bucket, results.lengths
    if len(last) > 1:
        deltas = []
        for m in methods:
            a, b = first(m.model, m.scaling, 0, L), first(m.model, m.scaling, last[-2], last[-1])
            if a is not None and b is not None:
                deltas.append((b.minus(a).stat.mean, m.label))
        deltas.sort()
        if deltas:
            lines.append(
                T.OBSERVED_POSITIONS.format(
                    longest=longest,
                    start=last[-2],
                    end=last[-1],
                    L=L,
                    deltas=", ".join(f"{label} {d:+.3f}" for d, label in deltas),
                )
            )
    inside = [d for d in results.distances if d <= L]
    past = [d for d in results.distances if d > L]
    if inside and past:
        gains = []
        for m in methods:
            a, b = results.retrieval_mean(m.model, m.scaling, inside), results.retrieval_mean(m.model, m.scaling, past)
            if a is not None and b is not None:
                gains.append((a.stat.mean, b.stat.mean, m.label))
        gains.sort(reverse=True)
        largest = max(
            (abs(v.stat.mean), m.label, d)
            for m in methods
            for d in results.distances
            if (v := results.retrieval(m.model, m.scaling, d)) is not None
        )
        if largest[0] < 0.25:
            lines.append(T.OBSERVED_NO_RETRIEVAL.format(gain=largest[0], label=largest[1], distance=largest[2]))
        if gains:
            lines.append(
                T.OBSERVED_RETRIEVAL.format(gains=", ".join(f"{label} {a:.2f} / {b:.2f}" for a, b, label in gains))
            )
    if results.config.extends and results.has("rope-scratch"):
        ext = results.config.extension_length
        scratch = results.perplexity("rope-scratch", "none", ext, "sliding") or results.perplexity(
            "rope-scratch", "none", ext, "windows"
        )
        mode = "sliding" if results.perplexity("rope-scratch", "none", ext, "sliding") else "windows"
        parts = []
        for m in methods:
            if m.stage == "extend":
                s = results.perplexity(m.model, m.scaling, ext, mode)
                if s is not None and scratch is not None and scratch.mean > 0:
                    parts.append(f"{m.label} {s.mean / scratch.mean:.2f}x")
        if parts:
            lines.append(
                T.OBSERVED_EXTENSION.format(E=ext, mode=names[mode], scratch=fmt(scratch.mean), ratios=", ".join(parts))
            )
    base = results.config.task_length
    for task in results.tasks:
        name = "Copy" if task == "copy" else "Associative recall"
        for e in results.task_lengths:
            found = sorted(
                (
                    (v[0], m.label)
                    for m in results.task_methods()
                    if (v := results.task_interval(m.model, m.scaling, task, e))
                ),
                reverse=True,
            )
            if found:
                accuracies = ", ".join(f"{label} {a:.0%}" for a, label in found)
                lines.append(T.OBSERVED_TASK.format(name=name, length=e, factor=e / base, accuracies=accuracies))
    for e in results.lengths:
        found = [(v, m.label) for m in methods if (v := results.passkey_interval(m.model, m.scaling, e)) is not None]
        if found:
            best = max(v[0] for v, _ in found)
            leaders = [label for v, label in found if v[0] == best]
            more = " ..." if len(leaders) > 4 else ""
            lines.append(T.OBSERVED_PASSKEY.format(length=e, best=best, leaders=", ".join(leaders[:4]), more=more))
    return lines


# ------------------------------------------------------------------------------------------------
# report.md


def _title(results: Results) -> str:
    c = results.config
    if c.study == "base":
        return T.TITLE_BASE.format(bases=len(c.bases), L=c.train_length)
    if c.study == "transfer":
        return T.TITLE_TRANSFER
    extension = T.TITLE_EXTENSION.format(factor=c.extension_length / c.train_length) if c.extends else ""
    return T.TITLE_MAIN.format(encodings=len(c.encodings), scalings=len(c.scalings), extension=extension)


def _setup(run: dict[str, Any], results: Results) -> list[str]:
    c = results.config
    L = c.train_length
    data = run["data"]
    sizes = ", ".join(
        f"{m['model']} {m['parameters']:,}" for m in run["models"] if m["seed"] == c.seed and m["stage"] == "pretrain"
    )
    lines = [
        "## Setup",
        "",
        T.SETUP_TEXT.format(
            source=data["source"],
            bytes=data["bytes"],
            files=data["files"],
            skipped=T.SETUP_SKIPPED.format(skipped=data["skipped"]) if data.get("skipped") else "",
            sha256=data["sha256"][:16],
            train_fraction=1 - c.held_out_fraction,
            held_out_fraction=c.held_out_fraction,
        ),
        T.SETUP_MODELS.format(
            num_layers=c.num_layers,
            hidden_size=c.hidden_size,
            num_heads=c.num_heads,
            head_dim=c.hidden_size // c.num_heads,
            sizes=sizes,
        ),
        T.SETUP_TRAINING.format(
            L=L,
            steps=c.steps,
            batch_size=c.batch_size,
            tokens=c.steps * c.batch_size * L,
            learning_rate=c.learning_rate,
            min_learning_rate=c.min_learning_rate,
            warmup_steps=c.warmup_steps,
            passkey_fraction=c.passkey_fraction,
        ),
        T.SETUP_SEEDS.format(seeds=c.seeds, first=c.seed, last=c.seed + c.seeds - 1),
    ]
    if c.extends:
        E, rows, n = c.extension_length, c.extension_rows, c.extend_steps
        scalings = ", ".join(
            T.EXTENSION_DIRECT if s == "none" else T.EXTENSION_SCALED.format(label=SCALING_LABELS[s], factor=E / L)
            for s in c.extend_scalings
        )
        lines.append(
            T.SETUP_EXTENSION.format(
                E=E,
                factor=E / L,
                steps=n,
                rows=rows,
                step_share=n / c.steps,
                token_share=n * rows * E / (c.steps * c.batch_size * L),
                warmup=max(1, n // 10),
                finetune_learning_rate=c.finetune_learning_rate,
                min_learning_rate=c.min_learning_rate,
                scalings=scalings,
                scratch_steps=c.steps,
                scratch_tokens=c.steps * rows * E,
            )
        )
    if c.study == "transfer":
        tune = c.transfer_finetune_steps
        lines.append(
            T.SETUP_TRANSFER.format(
                short=c.steps - tune,
                tune=tune,
                warmup=max(1, tune // 10),
                finetune_learning_rate=c.finetune_learning_rate,
            )
        )
    if c.has_tasks:
        lines.append(_task_setup(run, c))
    lines.append(_evaluation_setup(run, results))
    if c.study is None:
        lines.append(T.SETUP_SCALINGS.format(scalings=", ".join(SCALING_LABELS[s] or "none" for s in c.scalings)))
    for m in run["models"]:
        if m.get("untrained_rows_unchanged") is not None and m["seed"] == c.seed:
            state = (
                "identical to their initial values"
                if m["untrained_rows_unchanged"]
                else "NOT identical to their initial values"
            )
            longest = results.lengths[-1]
            lines.append(T.LEARNED_TABLE.format(longest=longest, L=L, last=longest - 1, state=state))
    return lines


def _task_setup(run: dict[str, Any], c: ExperimentConfig) -> str:
    sizes = ", ".join(
        f"{m['model']} {m['parameters']:,}" for m in run["models"] if m["seed"] == c.seed and m["stage"] == "task"
    )
    seeds = ""
    if c.task_seeds is not None and c.task_seeds < c.seeds:
        last = f" to {c.seed + c.task_seeds - 1}" if c.task_seeds > 1 else ""
        seeds = T.TASK_SEEDS.format(task_seeds=c.task_seeds, seeds=c.seeds, seed=c.seed, last=last)
    return T.SETUP_TASKS.format(
        seeds=seeds,
        task_hidden_size=c.task_hidden_size,
        num_layers=c.num_layers,
        num_heads=c.num_heads,
        task_steps=c.task_steps,
        task_batch_size=c.task_batch_size,
        task_length=c.task_length,
        task_learning_rate=c.task_learning_rate,
        final_learning_rate=c.task_learning_rate / 10,
        lengths=", ".join(f"{e} ({e / c.task_length:g}L)" for e in c.task_lengths),
        task_trials=c.task_trials,
        sizes=T.TASK_SIZES.format(sizes=sizes) if sizes else "",
    )


def _evaluation_setup(run: dict[str, Any], results: Results) -> str:
    c, data = results.config, run["data"]
    L = c.train_length
    lengths = ", ".join(f"{e} ({e / L:g}L)" for e in results.lengths)
    evaluation = T.EVALUATION.format(lengths=lengths, eval_tokens=data["eval_tokens"])
    if "sliding" in results.modes:
        evaluation += T.EVALUATION_SLIDING.format(sliding_tokens=data["sliding_tokens"], stride=c.stride)
    evaluation += T.EVALUATION_BUCKETS.format(bin=max(1, L // 8), longest=results.lengths[-1])
    if c.passkey_trials:
        depths = ", ".join(f"{d:g}" for d in c.passkey_depths)
        evaluation += T.EVALUATION_PASSKEY.format(trials=c.passkey_trials, depths=depths)
    if c.retrieval_trials:
        distances = ", ".join(str(d) for d in results.distances)
        evaluation += T.EVALUATION_RETRIEVAL.format(
            distances=distances, trials=c.retrieval_trials, span=c.retrieval_span
        )
    return evaluation + "."


def _figure(figures: dict[str, list[Path]], name: str, alt: str) -> list[str]:
    """The markdown image of the figure ``name`` and a blank line; nothing for a run without figures."""
    return [f"![{alt}](figures/{figures[name][0].name})", ""] if figures else []


def _main_sections(results: Results, figures: dict[str, list[Path]]) -> list[str]:
    L = results.config.train_length
    longest = results.lengths[-1]
    lines = [
        "",
        "## Perplexity against evaluation length",
        "",
        *_figure(figures, "perplexity", "perplexity"),
        T.WINDOWS_CAPTION,
        "",
        mode_table(results, "windows"),
        "",
    ]
    if "sliding" in results.modes:
        lines += [
            T.SLIDING_CAPTION.format(stride=results.config.stride),
            "",
            mode_table(results, "sliding"),
            "",
        ]
    lines += [
        f"## Loss by position on {longest}-token windows",
        "",
        *_figure(figures, "buckets", "positions"),
        bucket_table(results),
        "",
        T.POSITIONS_CAPTION,
        "",
    ]
    if results.distances:
        lines += [
            "## Retrieval at a distance",
            "",
            *_figure(figures, "retrieval", "retrieval"),
            retrieval_table(results),
            "",
            T.RETRIEVAL_CAPTION.format(span=results.config.retrieval_span, L=L),
            "",
        ]
    if results.rows.passkey:
        lines += [
            "## Passkey retrieval",
            "",
            *_figure(figures, "passkey", "passkey"),
            passkey_table(results),
            "",
            T.PASSKEY_CAPTION,
            "",
        ]
    if results.tasks:
        lines += _task_sections(results, figures)
    return lines


def _task_sections(results: Results, figures: dict[str, list[Path]]) -> list[str]:
    from .claims import LEARNED_TASK_ACCURACY
    from .tasks import CHANCE

    c = results.config
    lines = [
        "## Copying and associative recall",
        "",
        *_figure(figures, "tasks", "tasks"),
        T.TASKS_INTRO.format(
            task_length=c.task_length,
            copy_chance=CHANCE["copy"],
            task_pairs=c.task_pairs,
            recall_chance=CHANCE["induction"],
        ),
        "",
    ]
    for task, title in (("copy", "Copy"), ("induction", "Associative recall")):
        if task not in results.tasks:
            continue
        lines += [
            f"### {title}: accuracy per byte",
            "",
            task_table(results, task),
            "",
            f"### {title}: exact match (whole rows)",
            "",
            task_table(results, task, exact=True),
            "",
        ]
    weak = [
        (m.label, task)
        for m in results.task_methods()
        if m.scaling == "none"
        for task in results.tasks
        if (v := results.task_interval(m.model, "none", task, c.task_length)) is not None
        and v[0] < LEARNED_TASK_ACCURACY
    ]
    if weak:
        lines += [
            T.TASKS_NOT_LEARNED.format(
                threshold=LEARNED_TASK_ACCURACY,
                task_length=c.task_length,
                which=", ".join(f"{label} on {'copy' if t == 'copy' else 'recall'}" for label, t in weak),
            ),
            "",
        ]
    return lines


def _spread_section(results: Results) -> list[str]:
    lines = ["## Run-to-run spread", ""]
    if len(results.seeds) < 2:
        return lines + [
            T.SPREAD_ONE_SEED,
            "",
        ]
    header, body = spread_table(results, "windows")
    lines += [
        T.SPREAD_INTRO.format(seeds=", ".join(map(str, results.seeds))),
        "",
        markdown_table(header, body),
        "",
        T.SPREAD_EXPLAINED,
        "",
    ]
    return lines


def _claims_section(assessments: Sequence[Assessment], warnings: Sequence[str] = (), tasks: bool = False) -> list[str]:
    withheld = [w for w in warnings if w.startswith("Not learned")]
    return [
        "## Compared with the published findings",
        "",
        *([T.CLAIMS_WITHHELD.format(warning=withheld[0]), ""] if withheld else []),
        claims_table(assessments),
        "",
        T.CLAIMS_NOTE + (T.CLAIMS_TASKS_NOTE if tasks else ""),
        "",
    ]


def _base_sections(results: Results, figures: dict[str, list[Path]]) -> list[str]:
    c = results.config
    L, d = c.train_length, c.hidden_size // c.num_heads
    header, body = base_table(results)
    critical = (L / (2 * math.pi)) ** (d / (d - 2))
    return [
        "",
        "## The base against its predicted extrapolation limit",
        "",
        T.BASE_INTRO.format(d=d, critical=critical, L=L),
        "",
        *_figure(figures, "perplexity", "perplexity"),
        *_figure(figures, "buckets", "positions"),
        markdown_table(header, body),
        "",
        T.BASE_RISE.format(bin=max(1, L // 8), rise=RISE_NATS, longest=results.lengths[-1]),
        "",
        T.BASE_BEST.format(
            at_L=best_at(results, list(results.specs), L),
            factor=results.lengths[-1] / L,
            at_longest=best_at(results, list(results.specs), results.lengths[-1]),
        ),
        "",
        T.BASE_ROFORMER_TABLE,
        "",
    ]


def _transfer_sections(results: Results, figures: dict[str, list[Path]]) -> list[str]:
    return [
        "",
        "## Perplexity against evaluation length",
        "",
        *_figure(figures, "perplexity", "perplexity"),
        mode_table(results, "windows"),
        "",
        *_figure(figures, "training", "training loss"),
        T.TRANSFER_CURVE,
        "",
        *_figure(figures, "buckets", "positions"),
        bucket_table(results),
        "",
        T.TRANSFER_QUESTIONS,
        "",
    ]


def report_markdown(
    run: dict[str, Any], results: Results, assessments: Sequence[Assessment], figures: dict[str, list[Path]]
) -> str:
    """The whole ``report.md`` of a run from its ``results.json`` content (``run``), rows, checked claims and
    ``figures`` (name -> paths, the PNG linked; empty for a run without figures).
    """
    c = results.config
    env = run["environment"]
    load = ""
    if env.get("load_average_at_start"):
        load = T.LOAD.format(start=env["load_average_at_start"][0], end=env["load_average_at_end"][0])
    lines = [
        f"# {_title(results)}",
        "",
        T.COMMAND.format(command=run["command"]),
        T.FINISHED.format(
            finished=run["finished"],
            minutes=run["wall_seconds"] / 60,
            cpu=env["cpu"],
            threads=threads_used(env),
            device=env["device"],
            world_size=env["world_size"],
            torch=env["torch"],
            rotary=env["rotary"],
            load=load,
        ),
        "",
    ]
    warnings = [f"> **{c.split(':', 1)[0]}**:{c.split(':', 1)[1]}" for c in caveats(results)]
    lines += [line for w in warnings for line in (w, ">")][:-1] + ([""] if warnings else [])
    lines += [T.NO_FIGURES, ""] if not figures else []
    lines += _setup(run, results)
    if c.study == "base":
        lines += _base_sections(results, figures)
    elif c.study == "transfer":
        lines += _transfer_sections(results, figures)
    else:
        lines += _main_sections(results, figures)
    lines += _spread_section(results)
    lines += ["## What this run shows", ""] + [f"- {o}" for o in caveats(results) + observations(results)] + [""]
    lines += _claims_section(assessments, caveats(results), tasks=c.has_tasks)
    lines += _timing_section(run)
    lines += ["## Notes", ""]
    if c.study is None:
        lines += T.SCALING_NOTES
    if c.preset in T.BUDGET_NOTES and c.study is None:
        lines.append(T.BUDGET_NOTE.format(note=T.BUDGET_NOTES[c.preset]))
    parallel = run.get("parallel")
    lines.append(
        T.WALL_TIME_NOTE.format(
            phases=_wall_time(run["timings"], results),
            parallel=T.WALL_TIME_PARALLEL.format(**parallel) if parallel else ".",
        )
    )
    lines.append("")
    return "\n".join(lines)


def _timing_section(run: dict[str, Any]) -> list[str]:
    """The wall time of every model's training (compiling steps noted) and evaluation, and the run's total."""
    timings = run["timings"]
    lines = ["## Wall time", "", *T.TIMING_HEADER]

    def cell(value: float | None, digits: int = 1) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    for m in run["models"]:  # runs written before a field existed lack it: shown as –
        name = m.get("name", f"{m['model']}-{m['seed']}")
        steps = m.get("spec", {}).get("steps")
        seconds = m.get("train_seconds", timings.get(f"train {name}"))
        per_step = 1000 * seconds / steps if steps and seconds is not None else None
        compiled = f"yes ({m['compile_seconds']:.1f})" if m.get("compiled") else "no"
        lines.append(
            T.TIMING_ROW.format(
                name=name,
                steps="–" if steps is None else steps,
                train=cell(seconds),
                per_step=cell(per_step),
                compiled=compiled,
                evaluate=cell(timings.get(f"evaluate {name}")),
            )
        )
    train = sum(v for k, v in timings.items() if k.startswith("train "))
    evaluate = sum(v for k, v in timings.items() if k.startswith("evaluate "))
    parallel = run.get("parallel")
    if parallel:  # the models overlapped: their times add up to more than the wall time they took
        rest = max(0.0, run["wall_seconds"] - parallel["seconds"])
        spent = T.SPENT_PARALLEL.format(**parallel, train=train, evaluate=evaluate, rest=rest)
    else:
        rest = max(0.0, run["wall_seconds"] - train - evaluate)
        spent = T.SPENT_SERIAL.format(train=train, evaluate=evaluate, rest=rest)
    lines += ["", T.TIMING_TOTAL.format(wall=run["wall_seconds"], spent=spent), ""]
    return lines


def threads_used(env: dict[str, Any]) -> str:
    """How the run used the CPU, from its ``environment`` (results.json).

    Example:
        >>> threads_used({"threads": 2}), threads_used({"threads": 1, "jobs": 2})
        ('2 torch threads', '2 models at a time on 1 torch thread(s) each')
    """
    if env.get("jobs", 1) > 1:
        return f"{env['jobs']} models at a time on {env['threads']} torch thread(s) each"
    return f"{env['threads']} torch threads"


def _wall_time(timings: dict[str, float], results: Results) -> str:
    """The timings summed by phase: pretraining, each later stage, evaluation, the rest."""
    names = {
        "pretrain": "pretraining",
        "extend": "fine-tuning",
        "scratch": "training at E",
        "transfer": "fine-tuning after the transfer",
        "task": "task models",
    }
    totals: dict[str, float] = {}
    for key, seconds in timings.items():
        if key.startswith("train "):
            model = key.removeprefix("train ").rsplit("-", 1)[0]
            kind = names[results.specs[model].stage] if model in results.specs else "training"
        elif key.startswith("evaluate "):
            kind = "evaluation"
        else:
            kind = key
        totals[kind] = totals.get(kind, 0.0) + seconds
    return ", ".join(f"{k} {v:.0f} s" for k, v in totals.items())
