"""What a run leaves behind besides its rows: ``report.md`` (its tables are :mod:`.tables`) and the
text of ``results.json``.

The report is built from the run's :class:`~rotary.tools.experiments.results.Results` (the numbers) and
its :class:`~rotary.tools.experiments.claims.Assessment` list (the published claims checked against them);
this module only arranges them into prose and tables. Every number in it comes from the rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .caveats import caveats
from .claims import Assessment, claims_table, fmt
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
    names = {"windows": "non-overlapping windows", "sliding": "sliding windows"}
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
                    f"At {e} tokens ({e / L:g}L), {names[mode]}: the lowest perplexity is {ranked[0][1]}'s, "
                    f"{fmt(ranked[0][0])}; the highest {ranked[-1][1]}'s, {fmt(ranked[-1][0])}."
                )
    longest = results.lengths[-1]
    for m in methods:
        if m.scaling == "none" and m.stage == "pretrain":
            parts = []
            for mode in results.modes:
                a, b = results.perplexity(m.model, "none", longest, mode), results.perplexity(m.model, "none", L, mode)
                if a is not None and b is not None and b.mean > 0:
                    parts.append(f"{a.mean / b.mean:.2f}x with {names[mode]}")
            if parts:
                lines.append(
                    f"{m.label}: perplexity at {longest / L:g}L is " + " and ".join(parts) + " its value at L."
                )
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
                f"On {longest}-token windows, the loss at positions [{last[-2]}, {last[-1]}) "
                f"minus the loss at [0, {L}) (nats): " + ", ".join(f"{label} {d:+.3f}" for d, label in deltas) + "."
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
            lines.append(
                "No method retrieves the planted span at any distance, inside L or past it: the largest mean "
                f"retrieval gain is {largest[0]:.2f} nats per byte ({largest[1]} at distance {largest[2]}), against "
                "up to 4.1 for a model that copies: at this budget the probe, like passkey "
                "retrieval, finds nothing to rank."
            )
        if gains:
            lines.append(
                "Retrieval gain (nats per byte), mean over the distances up to L / past L: "
                + ", ".join(f"{label} {a:.2f} / {b:.2f}" for a, b, label in gains)
                + "."
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
                f"At the extension length {ext} ({names[mode]}), against RoPE trained from "
                f"scratch there ({fmt(scratch.mean)}): " + ", ".join(parts) + "."
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
                lines.append(
                    f"{name} at {e} bytes ({e / base:g}L of the task models), accuracy per byte: "
                    + ", ".join(f"{label} {a:.0%}" for a, label in found)
                    + "."
                )
    for e in results.lengths:
        found = [(v, m.label) for m in methods if (v := results.passkey_interval(m.model, m.scaling, e)) is not None]
        if found:
            best = max(v[0] for v, _ in found)
            leaders = [label for v, label in found if v[0] == best]
            lines.append(
                f"Passkey retrieval at {e} tokens: best {best:.0%} "
                f"({', '.join(leaders[:4])}{' ...' if len(leaders) > 4 else ''})."
            )
    return lines


# ------------------------------------------------------------------------------------------------
# report.md


def _title(results: Results) -> str:
    c = results.config
    if c.study == "base":
        return f"RoPE's base: {len(c.bases)} bases, trained at L = {c.train_length} and tested longer"
    if c.study == "transfer":
        return "From sinusoidal positions to RoPE: copy every other weight, fine-tune, compare"
    extension = f", fine-tuned at {c.extension_length / c.train_length:g}L" if c.extends else ""
    return f"Train short, test long: {len(c.encodings)} position encodings, {len(c.scalings)} RoPE scalings{extension}"


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
        f"- **Text**: {data['source']} ({data['bytes']:,} bytes from {data['files']:,} file(s)"
        + (f", {data['skipped']:,} skipped as not UTF-8 text" if data.get("skipped") else "")
        + f", sha256 `{data['sha256'][:16]}…`), one token per byte (vocabulary 256). The first "
        f"{1 - c.held_out_fraction:.0%} "
        f"trains; the last {c.held_out_fraction:.0%} is held out.",
        f"- **Models**: `rotary.models.Decoder`, {c.num_layers} layers, width {c.hidden_size}, {c.num_heads} heads of "
        f"{c.hidden_size // c.num_heads}, SwiGLU, RMSNorm; parameters: {sizes}.",
        f"- **Training**: L = {L} tokens, {c.steps} AdamW steps of {c.batch_size} rows "
        f"({c.steps * c.batch_size * L:,} tokens per model), learning rate {c.learning_rate:g} → "
        f"{c.min_learning_rate:g} (cosine, {c.warmup_steps} warm-up steps). {c.passkey_fraction:.0%} of the rows end "
        "with a passkey sample no longer than the row.",
        f"- **Seeds**: every method is trained {c.seeds} time(s), seeds {c.seed} to {c.seed + c.seeds - 1} "
        "(initialisation and batch order); tables give the mean ± half the range over the seeds, and every comparison "
        "with a paper is made seed by seed.",
    ]
    if c.extends:
        E, rows, n = c.extension_length, c.extension_rows, c.extend_steps
        lines.append(
            f"- **Extension stage**: the RoPE model of each seed fine-tuned at E = {E} ({E / L:g}L) for {n} steps of "
            f"{rows} rows ({n / c.steps:.0%} of the pretraining steps, "
            f"{n * rows * E / (c.steps * c.batch_size * L):.0%} of its tokens), fresh AdamW, {max(1, n // 10)} "
            f"warm-up steps to {c.finetune_learning_rate:g}, cosine to {c.min_learning_rate:g}; with "
            + ", ".join(
                "no scaling (direct fine-tuning)" if s == "none" else f"{SCALING_LABELS[s]} at factor {E / L:g}"
                for s in c.extend_scalings
            )
            + f". Beside them, RoPE trained from scratch at E: {c.steps} steps of {rows} rows "
            f"({c.steps * rows * E:,} tokens)."
        )
    if c.study == "transfer":
        tune = c.transfer_finetune_steps
        lines.append(
            f"- **Transfer**: a sinusoidal model of {c.steps - tune} steps moved to RoPE by "
            "`rotary.models.transfer_position_encoding` (every weight outside the position encoding copied), "
            f"measured as it is and after {tune} more steps (fresh AdamW, {max(1, tune // 10)} warm-up steps to "
            f"{c.finetune_learning_rate:g}, the batches the sinusoidal model would have seen next)."
        )
    if c.has_tasks:
        task_sizes = ", ".join(
            f"{m['model']} {m['parameters']:,}" for m in run["models"] if m["seed"] == c.seed and m["stage"] == "task"
        )
        lines.append(
            "- **Task models**: beside the text models, one per position encoding and seed"
            + (
                f" (the first {c.task_seeds} of the {c.seeds} seeds, seed "
                f"{c.seed}{f' to {c.seed + c.task_seeds - 1}' if c.task_seeds > 1 else ''})"
                if c.task_seeds is not None and c.task_seeds < c.seeds
                else ""
            )
            + " trained from scratch on the "
            f"synthetic copy and associative-recall tasks (`rotary.tools.experiments.tasks`, generated on the fly): "
            f"width {c.task_hidden_size}, {c.num_layers} layers, {c.num_heads} heads, {c.task_steps} steps of "
            f"{c.task_batch_size} rows of {c.task_length} bytes (half copy, half recall; loss on the answers only), "
            f"learning rate {c.task_learning_rate:g} → {c.task_learning_rate / 10:g}. Evaluated at "
            f"{', '.join(f'{e} ({e / c.task_length:g}L)' for e in c.task_lengths)} bytes on {c.task_trials} rows per "
            "task, length and seed (the same rows for every model), RoPE's with each scaling "
            f"at factor E / {c.task_length}." + (f" Parameters: {task_sizes}." if task_sizes else "")
        )
    evaluation = (
        f"- **Evaluation** at E = {', '.join(f'{e} ({e / L:g}L)' for e in results.lengths)}: perplexity on "
        f"{data['eval_tokens']:,} held-out bytes in non-overlapping windows of E"
    )
    if "sliding" in results.modes:
        evaluation += (
            f", and {data['sliding_tokens']:,} of the same bytes (strides of {c.stride} spread over them) in sliding "
            f"windows of E, each scoring its last {c.stride} (every scored byte sees at least E "
            f"− {c.stride} bytes of context)"
        )
    evaluation += f"; the loss by query position in bins of {max(1, L // 8)} on the {results.lengths[-1]}-token windows"
    if c.passkey_trials:
        evaluation += (
            f"; passkey retrieval ({c.passkey_trials} prompts per length and seed at depths "
            f"{', '.join(f'{d:g}' for d in c.passkey_depths)}, greedy decoding, all 5 digits exact)"
        )
    if c.retrieval_trials:
        evaluation += (
            f"; the retrieval probe at distances {', '.join(str(d) for d in results.distances)} "
            f"({c.retrieval_trials} random {c.retrieval_span}-byte spans each)"
        )
    evaluation += "."
    lines.append(evaluation)
    if c.study is None:
        lines.append(
            f"- **RoPE scalings** of the pretrained RoPE model at inference time, factor E / L, weights unchanged: "
            f"{', '.join(SCALING_LABELS[s] or 'none' for s in c.scalings)}."
        )
    for m in run["models"]:
        if m.get("untrained_rows_unchanged") is not None and m["seed"] == c.seed:
            state = (
                "identical to their initial values"
                if m["untrained_rows_unchanged"]
                else "NOT identical to their initial values"
            )
            lines.append(
                f"- **Learned absolute table**: sized to {results.lengths[-1]} positions; rows "
                f"{L}..{results.lengths[-1] - 1} never receive a gradient and are not weight-decayed: "
                f"checked after training, {state}."
            )
    return lines


def _main_sections(results: Results, figures: dict[str, list[Path]]) -> list[str]:
    L = results.config.train_length
    longest = results.lengths[-1]
    lines = [
        "",
        "## Perplexity against evaluation length",
        "",
        f"![perplexity](figures/{figures['perplexity'][0].name})",
        "",
        "Non-overlapping windows (each window predicted from its own bytes only):",
        "",
        mode_table(results, "windows"),
        "",
    ]
    if "sliding" in results.modes:
        lines += [
            f"Sliding windows (stride {results.config.stride}: every scored byte sees at least E − "
            f"{results.config.stride} bytes):",
            "",
            mode_table(results, "sliding"),
            "",
        ]
    lines += [
        f"## Loss by position on {longest}-token windows",
        "",
        f"![positions](figures/{figures['buckets'][0].name})",
        "",
        bucket_table(results),
        "",
        "Mean next-byte loss (nats) of queries in each range of positions. A method that only lacks context gets "
        "better to the right; a method that breaks at positions it never saw gets worse.",
        "",
    ]
    if results.distances:
        lines += [
            "## Retrieval at a distance",
            "",
            f"![retrieval](figures/{figures['retrieval'][0].name})",
            "",
            retrieval_table(results),
            "",
            f"Retrieval gain in nats per byte (control loss minus copy loss on the second copy of a random "
            f"{results.config.retrieval_span}-byte span) at each distance between the copies; 0 means nothing is "
            f"retrieved. Distances past L = {L} put the second copy past L as well.",
            "",
        ]
    if "passkey" in figures:
        lines += [
            "## Passkey retrieval",
            "",
            f"![passkey](figures/{figures['passkey'][0].name})",
            "",
            passkey_table(results),
            "",
            "Accuracy over every seed's prompts with its Wilson 95% interval.",
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
        f"![tasks](figures/{figures['tasks'][0].name})",
        "",
        f"The task models (Setup) trained at L = {c.task_length} bytes. **Copy**: a string of random lowercase "
        "letters, '|', the string again; at E bytes the strings have more than (E − 1) / 4 and at most (E − 1) / 2 "
        "letters, so from 2L on every string is longer than any in training; scored: the copied letters (chance "
        f"{CHANCE['copy']:.1%}). **Recall**: random letters a–p in which {c.task_pairs} uppercase keys are each "
        "followed by a value in the first half and asked again in the second half; scored: the byte after each "
        f"repeated key (chance {CHANCE['induction']:.2%}); at E the keys are up to E apart. Accuracy per answer byte "
        "(teacher forcing, top-1), every seed's rows pooled, with its Wilson 95% interval (the bytes of one row are "
        "not independent, so the interval is narrower than the seed-to-seed spread can be); exact "
        "match: rows with every answer right.",
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
            f"Not learned within L (below {LEARNED_TASK_ACCURACY:.0%} per byte at {c.task_length} bytes): "
            + ", ".join(f"{label} on {'copy' if t == 'copy' else 'recall'}" for label, t in weak)
            + ". Their accuracies past L say nothing about extrapolation, and the comparisons with the papers "
            "leave them out.",
            "",
        ]
    return lines


def _spread_section(results: Results) -> list[str]:
    lines = ["## Run-to-run spread", ""]
    if len(results.seeds) < 2:
        return lines + [
            "Every method was trained once (`--seeds 1`): the spread is unknown, and each comparison rests on one run.",
            "",
        ]
    header, body = spread_table(results, "windows")
    lines += [
        f"Half the range of the loss over seeds {', '.join(map(str, results.seeds))} (nats), non-overlapping windows:",
        "",
        markdown_table(header, body),
        "",
        "A comparison between two methods is made on their per-seed differences (seed k against seed k: the same "
        "training batches), so each pair is held to its own spread: it agrees or disagrees only when every seed "
        "points the same way beyond the threshold, and is within run-to-run spread otherwise. With two seeds this "
        "is a weak test: two methods that are equal point the same way in both seeds half the time, so the "
        "threshold (2%) and the size of the difference carry much of the weight.",
        "",
    ]
    return lines


def _claims_section(assessments: Sequence[Assessment], warnings: Sequence[str] = (), tasks: bool = False) -> list[str]:
    withheld = [w for w in warnings if w.startswith("Not learned")]
    return [
        "## Compared with the published findings",
        "",
        *([f"**Verdicts withheld.** {withheld[0]}", ""] if withheld else []),
        claims_table(assessments),
        "",
        "The papers trained far larger models on far more text (and the NoPE study used synthetic tasks, not language "
        "modelling); a verdict says whether this run's numbers point the same way, at this scale. **not measured** "
        "means the run lacks what the claim needs."
        + (
            " The claims on copying and recall (Gu & Dao, Kazemnejad et al., Jelassi et al.) are checked on the task "
            "models, and only on those that learned their task within L (at least 50% per answer at their training "
            "length); the others' items are **withheld**."
            if tasks
            else ""
        ),
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
        f"Pair i of a head of width d = {d} rotates by base^(−2i/d) per token, a period of 2π·base^(2i/d) tokens. "
        f'Liu et al. ("Scaling Laws of RoPE-based Extrapolation") count the dimensions whose pairs complete a period '
        "within the training length, the critical dimension d_extra = 2·ceil((d/2)·log_base(L/2π)); the next pair is "
        "the first whose period exceeds L, and its period T_extra = 2π·base^(d_extra/d) is their extrapolation "
        f"bound. Below base (L/2π)^(d/(d−2)) = {critical:.1f} every pair completes a period within L = {L}.",
        "",
        f"![perplexity](figures/{figures['perplexity'][0].name})",
        "",
        f"![positions](figures/{figures['buckets'][0].name})",
        "",
        markdown_table(header, body),
        "",
        '"Rise observed at": per seed, the first position at or past L/2 where two '
        f"consecutive bins of {max(1, L // 8)} "
        f"positions lie more than {RISE_NATS} nats above the mean loss of [L/2, L) on the {results.lengths[-1]}-token "
        'windows; "none": no rise up to there.',
        "",
        f"Best at L: {best_at(results, list(results.specs), L)}. Best at {results.lengths[-1] / L:g}L: "
        f"{best_at(results, list(results.specs), results.lengths[-1])}.",
        "",
        "A table of bases 100, 1,000, 10,000 and 100,000 circulates with write-ups of "
        "RoFormer as that paper's ablation. It "
        'is not in the RoFormer paper ("RoFormer: Enhanced Transformer with Rotary '
        'Position Embedding") and could not be '
        "verified, so it is not compared with here; the table above measures those bases.",
        "",
    ]


def _transfer_sections(results: Results, figures: dict[str, list[Path]]) -> list[str]:
    return [
        "",
        "## Perplexity against evaluation length",
        "",
        f"![perplexity](figures/{figures['perplexity'][0].name})",
        "",
        mode_table(results, "windows"),
        "",
        f"![training loss](figures/{figures['training'][0].name})",
        "",
        "The transferred model's curve starts where the sinusoidal model it came from stopped; the RoPE and sinusoidal "
        "models trained for the whole budget are beside it.",
        "",
        f"![positions](figures/{figures['buckets'][0].name})",
        "",
        bucket_table(results),
        "",
        "No paper we cite measures this transfer, so the questions below are this study's own, checked the same way as "
        "the papers' claims of the main comparison.",
        "",
    ]


def report_markdown(
    run: dict[str, Any], results: Results, assessments: Sequence[Assessment], figures: dict[str, list[Path]]
) -> str:
    """The whole ``report.md`` of a run: setup, figures, tables, observations and the claims.

    Args:
        run: the run's ``results.json`` content (command, environment, data, models, timings).
        results: its rows.
        assessments: its claims checked (:func:`~rotary.tools.experiments.claims.assess`).
        figures: figure name -> paths (the PNG is linked).
    """
    c = results.config
    env = run["environment"]
    load = ""
    if env.get("load_average_at_start"):
        load = (
            f" Load average (1 min) {env['load_average_at_start'][0]:g} at the start, "
            f"{env['load_average_at_end'][0]:g} at the end."
        )
    lines = [
        f"# {_title(results)}",
        "",
        f"Command: `{run['command']}`  ",
        f"Finished {run['finished']} in {run['wall_seconds'] / 60:.1f} min on {env['cpu']} ({threads_used(env)}, "
        f"{env['device']}, {env['world_size']} process(es)); torch {env['torch']}, rotary {env['rotary']}.{load}",
        "",
    ]
    warnings = [f"> **{c.split(':', 1)[0]}**:{c.split(':', 1)[1]}" for c in caveats(results)]
    lines += [line for w in warnings for line in (w, ">")][:-1] + ([""] if warnings else [])
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
        lines += [
            "- Dynamic NTK is transformers' `dynamic` rope_type with factor E / L: at n tokens it raises RoPE's base "
            "as static NTK with alpha = factor·n/L − (factor − 1) would, i.e. alpha = factor² − factor + 1 at n = E "
            "(static NTK uses alpha = factor). Keys cached during decoding keep the "
            "frequencies they were rotated with.",
            "- YaRN uses beta_fast = 32, beta_slow = 1 and the attention temperature 0.1·ln(factor) + 1.",
            "- A fine-tuned scaling keeps its factor (extension length / L) at every evaluation length, as a model "
            "extended that way would be used; past the extension length it extrapolates again.",
        ]
    if c.preset in BUDGET_NOTES and c.study is None:
        lines.append(f"- Budget: {BUDGET_NOTES[c.preset]}")
    lines.append(
        f"- Wall time: {_wall_time(run['timings'], results)} (each model under Wall time; every phase in results.json)"
        + (
            f"; the models' phases are summed over the models, which took {run['parallel']['seconds']:.0f} s of wall "
            f"time {run['parallel']['jobs']} at a time."
            if run.get("parallel")
            else "."
        )
    )
    lines.append("")
    return "\n".join(lines)


#: what a preset trades for its budget, said in its reports
BUDGET_NOTES = {
    "default": (
        "the default preset is what `make demo` runs within 10 minutes on 2 CPU cores. To train every method with two "
        "seeds, fine-tune four scalings, train RoPE at 4L and train a task model per encoding and seed, it trains each "
        "text model 480 steps where a single seed had 1,200, evaluates 16,384 bytes in non-overlapping windows (32,768 "
        "before) and 4,096 in sliding windows, fine-tunes for 48 steps (10% of pretraining), and trains the task "
        "models 1,000 steps at 32 bytes, width 64, for the first seed only (both seeds would take the run past 10 "
        "minutes; `--task-seeds 2` adds the second). Passkey retrieval and the retrieval probe on text, which no "
        "model of this size learned (0% and a gain of 0.00 for every method in every earlier run), are left to the "
        "large preset (`--passkey-trials 40 --retrieval-trials 16` restore them here); the copy and recall tasks "
        "measure retrieval instead. Two seeds make a weak test of each difference (see Run-to-run spread)."
    ),
    "large": (
        "the large preset is sized for one GPU within 20 minutes (docs/experiment.md, Presets, has the arithmetic): "
        "two seeds of every method at 1,500 steps of 32 × 512 tokens (24.6 M tokens per model, a quarter of the "
        "first form's 6,000 steps and a third fewer seeds), fine-tunes of 75 steps (5%), bf16 autocast and a "
        "compiled training step; the Wall time table says what the run took."
    ),
}


def _timing_section(run: dict[str, Any]) -> list[str]:
    """The measured wall time of every model: training (with its first, compiling steps when it was
    compiled) and evaluation, and the run's total."""
    timings = run["timings"]
    lines = [
        "## Wall time",
        "",
        "| model | steps | train (s) | ms / step | compiled (first 2 steps, s) | evaluate (s) |",
        "| --- | ---: | ---: | ---: | --- | ---: |",
    ]

    def cell(value: float | None, digits: int = 1) -> str:
        return "–" if value is None else f"{value:.{digits}f}"

    for m in run["models"]:  # runs written before a field existed lack it: shown as –
        name = m.get("name", f"{m['model']}-{m['seed']}")
        steps = m.get("spec", {}).get("steps")
        seconds = m.get("train_seconds", timings.get(f"train {name}"))
        per_step = 1000 * seconds / steps if steps and seconds is not None else None
        compiled = f"yes ({m['compile_seconds']:.1f})" if m.get("compiled") else "no"
        lines.append(
            f"| {name} | {'–' if steps is None else steps} | {cell(seconds)} | {cell(per_step)} | {compiled} | "
            f"{cell(timings.get(f'evaluate {name}'))} |"
        )
    train = sum(v for k, v in timings.items() if k.startswith("train "))
    evaluate = sum(v for k, v in timings.items() if k.startswith("evaluate "))
    parallel = run.get("parallel")
    if parallel:  # the models overlapped: their times add up to more than the wall time they took
        spent = (
            f"the models took {parallel['seconds']:.0f} s, {parallel['jobs']} at a time (each in a process of its own "
            f"on {parallel['threads']} torch thread(s)): training {train:.0f} s and evaluation {evaluate:.0f} s summed "
            f"over them; the rest {max(0.0, run['wall_seconds'] - parallel['seconds']):.0f} s"
        )
    else:
        spent = (
            f"training {train:.0f} s, evaluation {evaluate:.0f} s, the rest "
            f"{max(0.0, run['wall_seconds'] - train - evaluate):.0f} s"
        )
    lines += [
        "",
        f"Total {run['wall_seconds']:.0f} s: {spent} (loading the text, the report). A model resumed from a "
        "checkpoint counts the time of its earlier sessions.",
        "",
    ]
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
