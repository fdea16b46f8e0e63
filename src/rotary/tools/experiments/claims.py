"""Published claims, each a declarative entry checked against a run's numbers.

A :class:`Claim` names the paper, what it says, the methods it needs and how this run measures it; its
``check`` turns ``Results`` into a :class:`Finding`; a new claim is one entry in :data:`CLAIMS`. Verdicts
follow :mod:`.stats` (seed by seed; a lead of 2% or less is a tie); the papers trained far larger models,
so a verdict says whether this run points the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .caveats import not_learned
from .plan import ENCODING_LABELS, TASK_PREFIX
from .results import Results, Values
from .stats import AGREE, DISAGREE, NOT_MEASURED, WITHHELD, WITHIN, at_least, at_most, combine, interval_outcome

__all__ = [
    "CLAIMS",
    "LEARNED_TASK_ACCURACY",
    "TASK_CLAIMS",
    "FLAT",
    "PAPERS",
    "Assessment",
    "Claim",
    "Finding",
    "assess",
    "claims_table",
    "fmt",
    "lower",
    "series",
    "task_learned",
]

#: relative difference under which two perplexities count as the same (a tie, not a win)
FLAT = 0.02
FLAT_NATS = math.log(1 + FLAT)
LOWER_NATS = math.log(1 - FLAT)  # "x lower than y" means ln x - ln y below this

#: key -> (authors, title); papers are cited by title
PAPERS = {
    "alibi": (
        "Press, Smith & Lewis 2022",
        "Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation",
    ),
    "nope": ("Kazemnejad et al. 2023", "The Impact of Positional Encoding on Length Generalization in Transformers"),
    "pi": ("Chen et al. 2023", "Extending Context Window of Large Language Models via Positional Interpolation"),
    "yarn": ("Peng et al. 2023", "YaRN: Efficient Context Window Extension of Large Language Models"),
    "liu": ("Liu et al. 2023", "Scaling Laws of RoPE-based Extrapolation"),
    "roformer": ("Su et al. 2021", "RoFormer: Enhanced Transformer with Rotary Position Embedding"),
    "mamba": ("Gu & Dao 2023", "Mamba: Linear-Time Sequence Modeling with Selective State Spaces"),
    "copying": ("Jelassi et al. 2024", "Repeat After Me: Transformers are Better than State Space Models at Copying"),
    "question": ("this study", ""),
}


def citation(paper: str) -> str:
    authors, title = PAPERS[paper]
    return f'{authors}, "{title}"' if title else authors


@dataclass(frozen=True)
class Finding:
    """What a run measured for a claim: the numbers, and the outcome of each item of the claim."""

    values: str
    outcomes: tuple[tuple[str, str | None], ...] = ()
    verdict: str | None = None

    @property
    def overall(self) -> str:
        return self.verdict or combine([o for _, o in self.outcomes])

    @property
    def within(self) -> list[str]:
        return [item for item, o in self.outcomes if o == WITHIN]


@dataclass(frozen=True)
class Claim:
    """One published claim: ``paper`` (a key of :data:`PAPERS`) and its ``claim``; ``needs``, the
    ``(model, scaling)`` pairs the run must have (``("sliding", "")``: that mode); ``check``: ``Results -> Finding``;
    ``past_L``: whether it needs lengths past ``L``.
    """

    paper: str
    claim: str
    needs: tuple[tuple[str, str], ...]
    needs_text: str
    measured: str
    check: Callable[[Results], Finding] = field(repr=False, compare=False)
    past_L: bool = True


@dataclass(frozen=True)
class Assessment:
    """A claim checked against a run (what :func:`claims_table` renders)."""

    paper: str
    claim: str
    needs: str
    measured: str
    values: str
    verdict: str


def _present(results: Results, need: tuple[str, str]) -> bool:
    model, scaling = need
    return "sliding" in results.modes if model == "sliding" else results.has(model, scaling)


def assess(claims: Sequence[Claim], results: Results) -> list[Assessment]:
    """Check every claim: ``not measured`` when the run lacks its methods, ``withheld`` (numbers shown) when the
    run's models have not learned enough (:func:`~.caveats.not_learned`).
    """
    withhold = bool(not_learned(results))
    out = []
    for c in claims:
        missing = [n for n in c.needs if not _present(results, n)]
        if c.past_L and not _longer(results):
            finding = Finding("not measured: this run has no evaluation length past L", verdict=NOT_MEASURED)
        elif missing:
            finding = Finding(
                "not measured: this run has no "
                + ", ".join("sliding-window evaluation" if m == "sliding" else results.label(m, s) for m, s in missing),
                verdict=NOT_MEASURED,
            )
        else:
            finding = c.check(results)
        values = finding.values
        if finding.within:
            values += "; within the run-to-run spread: " + ", ".join(finding.within)
        verdict = finding.overall
        if withhold and verdict != NOT_MEASURED:
            verdict = WITHHELD
        out.append(Assessment(citation(c.paper), c.claim, c.needs_text, c.measured, values, verdict))
    return out


def claims_table(assessments: Sequence[Assessment]) -> str:
    """The assessments as a markdown table.

    >>> a = Assessment('A 2020, "Title"', "x is low", "a model", "loss at L", "x 1.0", "agrees")
    >>> print(claims_table([a]))
    | verdict | paper | claim | needs | measured as | this run |
    |:---|:---|:---|:---|:---|:---|
    | **agrees** | A 2020, "Title" | x is low | a model | loss at L | x 1.0 |
    """

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| verdict | paper | claim | needs | measured as | this run |", "|" + "|".join([":---"] * 6) + "|"]
    for a in assessments:
        lines.append(
            "| "
            + " | ".join([f"**{a.verdict}**", *(cell(x) for x in (a.paper, a.claim, a.needs, a.measured, a.values))])
            + " |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# the pieces checks are made of


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table: 3 significant digits (4 from 1 up), ``–`` for None or not finite.

    >>> fmt(4.28431), fmt(0.0392), fmt(None), fmt(1234.5)
    ('4.284', '0.0392', '–', '1.23e+03')
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if abs(value) >= 1000:
        return f"{value:.3g}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits + 1}g}"


def ppl(results: Results, model: str, scaling: str, length: int, mode: str) -> str:
    """``"4.284"`` or ``"4.284 ± 0.08"`` (mean and half the range over seeds)."""
    stat = results.perplexity(model, scaling, length, mode)
    if stat is None:
        return "–"
    return fmt(stat.mean) if stat.n < 2 else f"{fmt(stat.mean)} ± {fmt(stat.spread, 2)}"


def series(results: Results, model: str, scaling: str, mode: str, lengths: Sequence[int] | None = None) -> str:
    L = results.config.train_length
    return ", ".join(f"{ppl(results, model, scaling, e, mode)} at {e / L:g}L" for e in (lengths or results.lengths))


def lower(results: Results, a: tuple[str, str], b: tuple[str, str], length: int, mode: str) -> str | None:
    """Outcome of "a's perplexity is lower than b's by more than 2%" at ``length``, seed by seed."""
    x, y = results.loss(*a, length, mode), results.loss(*b, length, mode)
    return None if x is None or y is None else at_most(x.minus(y).stat, LOWER_NATS)


def _min(*values: Values | None) -> Values | None:
    if any(v is None for v in values):
        return None
    seeds = set.intersection(*(set(v) for v in values))
    return Values({s: min(v[s] for v in values) for s in sorted(seeds)})


def _at(results: Results, e: int) -> str:
    return f"{e / results.config.train_length:g}L"


def _longer(results: Results) -> list[int]:
    return [e for e in results.lengths if e > results.config.train_length]


def _extension(results: Results) -> tuple[int, list[int], list[int]]:
    """The extension length, the lengths past L up to it, and the lengths past it."""
    ext = results.config.extension_length
    return ext, [e for e in _longer(results) if e <= ext], [e for e in results.lengths if e > ext]


# ------------------------------------------------------------------------------------------------
# Train Short, Test Long (ALiBi)


def _alibi_rises(r: Results) -> Finding:
    L, e = r.config.train_length, _longer(r)[0]
    items = [
        (name, at_least(r.change(m, "none", e, L).stat, -LOWER_NATS))
        for m, name in (("sinusoidal", "sinusoidal"), ("rope", "RoPE"))
    ]
    return Finding(
        f"sinusoidal: {series(r, 'sinusoidal', 'none', 'windows')}; RoPE: {series(r, 'rope', 'none', 'windows')}",
        tuple(items),
    )


def _alibi_flat(r: Results) -> Finding:
    L = r.config.train_length
    items = [(_at(r, e), at_most(r.change("alibi", "none", e, L).stat, FLAT_NATS)) for e in _longer(r)]
    return Finding(f"ALiBi: {series(r, 'alibi', 'none', 'windows')}", tuple(items))


def _alibi_order(r: Results) -> Finding:
    e = _longer(r)[0]
    items = [
        ("ALiBi against RoPE", lower(r, ("alibi", "none"), ("rope", "none"), e, "windows")),
        ("RoPE against sinusoidal", lower(r, ("rope", "none"), ("sinusoidal", "none"), e, "windows")),
    ]
    values = ", ".join(
        f"{name} {ppl(r, m, 'none', e, 'windows')}"
        for m, name in (("rope", "RoPE"), ("sinusoidal", "sinusoidal"), ("alibi", "ALiBi"))
    )
    return Finding(f"at {_at(r, e)}: {values}", tuple(items))


def _alibi_at_L(r: Results) -> Finding:
    L = r.config.train_length
    best = _min(r.loss("sinusoidal", "none", L), r.loss("rope", "none", L))
    d = None if best is None else r.loss("alibi", "none", L).minus(best)
    values = ", ".join(
        f"{name} {ppl(r, m, 'none', L, 'windows')}"
        for m, name in (("alibi", "ALiBi"), ("sinusoidal", "sinusoidal"), ("rope", "RoPE"))
    )
    return Finding(f"at L: {values}", (("at L", None if d is None else at_most(d.stat, FLAT_NATS)),))


def _alibi_sliding(r: Results) -> Finding:
    L = r.config.train_length
    items = [(_at(r, e), at_most(r.change("alibi", "none", L, e, "sliding").stat, FLAT_NATS)) for e in _longer(r)]
    longest = r.lengths[-1]
    gain = {mode: r.change("alibi", "none", L, longest, mode).stat.mean for mode in ("windows", "sliding")}
    values = (
        f"ALiBi, sliding windows: {series(r, 'alibi', 'none', 'sliding')}; non-overlapping: "
        f"{series(r, 'alibi', 'none', 'windows')}; from L to {_at(r, longest)} the loss falls by "
        f"{gain['windows']:.3f} nats with non-overlapping windows and by {gain['sliding']:.3f} nats with sliding ones"
    )
    return Finding(values, tuple(items))


# ------------------------------------------------------------------------------------------------
# NoPE


def _nope_generalises(r: Results) -> Finding:
    e = _longer(r)[0]
    rivals = [m for m in ("alibi", "rope", "learned", "sinusoidal") if r.has(m)]
    items = []
    for m in rivals:
        d = r.loss("none", "none", e).minus(r.loss(m, "none", e))  # NoPE minus the rival: no rival clearly lower
        items.append((f"NoPE against {r.label(m)}", at_most(d.stat, -LOWER_NATS)))
    ranking = sorted(
        ((r.perplexity(m, "none", e, "windows").mean, r.label(m)) for m in ["none", *rivals]),
        key=lambda v: v[0] if math.isfinite(v[0]) else math.inf,
    )
    place = 1 + sum(o == DISAGREE for _, o in items)
    values = (
        f"at {_at(r, e)} NoPE ranks {place} of {len(ranking)} (counting only rivals lower by more "
        f"than {FLAT:.0%} in every seed): " + ", ".join(f"{label} {fmt(v)}" for v, label in ranking)
    )
    return Finding(values, tuple(items))


def _nope_positions(r: Results) -> Finding:
    L = r.config.train_length
    others = [m for m in r.config.encodings if m != "none" and r.has(m)]
    best = min(others, key=lambda m: r.perplexity(m, "none", L, "windows").mean)
    d = r.loss("none", "none", L).minus(r.loss(best, "none", L))
    return Finding(
        f"at L NoPE {ppl(r, 'none', 'none', L, 'windows')}, the best encoding ({r.label(best)}) "
        f"{ppl(r, best, 'none', L, 'windows')}",
        (("at L, against 10% above the best", at_most(d.stat, math.log(1.10))),),
    )


# ------------------------------------------------------------------------------------------------
# Position Interpolation: fine-tuned models


def _pi_beats_direct(r: Results) -> Finding:
    _, inside, _ = _extension(r)
    items = [
        (_at(r, e), lower(r, ("rope-ft-linear", "linear"), ("rope-ft-none", "none"), e, "sliding")) for e in inside
    ]
    return Finding(
        f"fine-tuned with PI: {series(r, 'rope-ft-linear', 'linear', 'sliding')}; fine-tuned without scaling: "
        f"{series(r, 'rope-ft-none', 'none', 'sliding')}",
        tuple(items),
    )


def _no_extension_length(r: Results, ext: int) -> Finding:
    """The finding of a claim at the extension length when the run did not evaluate there."""
    lengths = ", ".join(str(e) for e in r.lengths)
    return Finding(
        f"not measured: this run evaluates at {lengths}, not at the extension length E = {ext}", verdict=NOT_MEASURED
    )


def _pi_uses_window(r: Results) -> Finding:
    L = r.config.train_length
    ext, _, _ = _extension(r)
    if ext not in r.lengths:
        return _no_extension_length(r, ext)
    d = r.change("rope-ft-linear", "linear", ext, L, "sliding")
    return Finding(
        f"fine-tuned with PI: {series(r, 'rope-ft-linear', 'linear', 'sliding')}",
        ((f"{_at(r, ext)} against L", at_most(d.stat, 0.0)),),
    )


def _pi_keeps_quality(r: Results) -> Finding:
    L = r.config.train_length
    d = r.loss("rope-ft-linear", "linear", L, "sliding").minus(r.loss("rope", "none", L, "sliding"))
    return Finding(
        f"at L: {ppl(r, 'rope-ft-linear', 'linear', L, 'sliding')} fine-tuned with PI, "
        f"{ppl(r, 'rope', 'none', L, 'sliding')} as pretrained (mean change {d.stat.mean:+.3f} nats)",
        (("at L", at_most(d.stat, math.log(1.05))),),
    )


def _passkey(r: Results, model: str, scaling: str, lengths: Sequence[int]) -> Finding:
    items, parts = [], []
    for e in lengths:
        found = r.passkey_interval(model, scaling, e)
        if found is None:
            items.append((_at(r, e), None))
            continue
        acc, low, high = found
        parts.append(f"{acc:.0%} [{low:.0%}, {high:.0%}] at {_at(r, e)}")
        items.append((_at(r, e), interval_outcome(low, high, 0.5)))
    return Finding(
        f"{r.label(model, scaling)}: " + ", ".join(parts) + " (all seeds pooled, Wilson 95% interval)", tuple(items)
    )


def _pi_passkey(r: Results) -> Finding:
    _, inside, _ = _extension(r)
    return _passkey(r, "rope-ft-linear", "linear", inside)


# ------------------------------------------------------------------------------------------------
# YaRN


def _ntk_beats_pi(r: Results) -> Finding:
    items = [(_at(r, e), lower(r, ("rope", "ntk"), ("rope", "linear"), e, "sliding")) for e in _longer(r)]
    return Finding(
        f"NTK: {series(r, 'rope', 'ntk', 'sliding')}; PI: {series(r, 'rope', 'linear', 'sliding')}", tuple(items)
    )


def _dynamic_graceful(r: Results) -> Finding:
    items = [(_at(r, e), lower(r, ("rope", "dynamic"), ("rope", "none"), e, "sliding")) for e in _longer(r)]
    return Finding(
        f"dynamic NTK: {series(r, 'rope', 'dynamic', 'sliding')}; as trained: {series(r, 'rope', 'none', 'sliding')}",
        tuple(items),
    )


def _yarn_beats_finetuned(r: Results) -> Finding:
    _, inside, _ = _extension(r)
    others = [(m, s) for m, s in (("rope-ft-linear", "linear"), ("rope-ft-ntk", "ntk")) if r.has(m, s)]
    items = [
        (f"{r.label(*o)} at {_at(r, e)}", lower(r, ("rope-ft-yarn", "yarn"), o, e, "sliding"))
        for e in inside
        for o in others
    ]
    values = "; ".join(
        f"{r.label(m, s)}: {series(r, m, s, 'sliding', inside)}" for m, s in [("rope-ft-yarn", "yarn"), *others]
    )
    return Finding(values, tuple(items))


def _yarn_past_finetuning(r: Results) -> Finding:
    ext, _, past = _extension(r)
    if ext not in r.lengths:
        return _no_extension_length(r, ext)
    items = []
    for e in past:
        yarn, pi = (
            r.change("rope-ft-yarn", "yarn", e, ext, "sliding"),
            r.change("rope-ft-linear", "linear", e, ext, "sliding"),
        )
        items.append((_at(r, e), at_most(yarn.minus(pi).stat, LOWER_NATS)))
    values = "; ".join(
        f"{r.label(m, s)}: {series(r, m, s, 'sliding', [ext, *past])}"
        for m, s in (("rope-ft-yarn", "yarn"), ("rope-ft-linear", "linear"))
    )
    return Finding(values, tuple(items))


# ------------------------------------------------------------------------------------------------
# the synthetic tasks: copy and associative recall (task models, :mod:`.tasks`)

#: in-distribution accuracy per byte (at the task models' L, every seed pooled) from which a task model
#: counts as having learned its task: 13 times chance on copy (1/26), 8 times on recall (1/16). A claim
#: about generalising past L says nothing of a model that never learned the task within L.
LEARNED_TASK_ACCURACY = 0.5

_TASK_NAMES = {"copy": "copy", "induction": "recall"}


def task_learned(r: Results, encoding: str, task: str) -> bool | None:
    """Whether the task model of ``encoding`` reached :data:`LEARNED_TASK_ACCURACY` on ``task`` at
    ``task_length``; None when the run has no such model.
    """
    found = r.task_interval(TASK_PREFIX + encoding, "none", task, r.config.task_length)
    return None if found is None else found[0] >= LEARNED_TASK_ACCURACY


def _task_series(r: Results, encoding: str, task: str, lengths: Sequence[int] | None = None) -> str:
    base = r.config.task_length
    parts = []
    for e in lengths or r.task_lengths:
        found = r.task_interval(TASK_PREFIX + encoding, "none", task, e)
        if found is not None:
            parts.append(f"{found[0]:.0%} [{found[1]:.0%}, {found[2]:.0%}] at {e / base:g}L")
    return f"{ENCODING_LABELS.get(encoding, encoding)} " + ", ".join(parts) if parts else ""


def _above(r: Results, task: str, a: str, b: str | None, length: int, other_length: int | None = None) -> str | None:
    """Outcome of "task model ``a`` is more accurate at ``length`` than ``b`` (or ``a`` at ``other_length``)" by
    Wilson intervals; ``withheld`` when a model did not learn the task within L; None when not measured.
    """
    b = a if b is None else b
    learned = (task_learned(r, a, task), task_learned(r, b, task))
    if None in learned:
        return None
    if not all(learned):
        return WITHHELD
    x = r.task_interval(TASK_PREFIX + a, "none", task, length)
    y = r.task_interval(TASK_PREFIX + b, "none", task, other_length or length)
    if x is None or y is None:
        return None
    if x[1] > y[2]:
        return AGREE
    if x[2] < y[1]:
        return DISAGREE
    return WITHIN


def _task_finding(r: Results, task: str, encodings: Sequence[str], items: list[tuple[str, str | None]]) -> Finding:
    if not r.task_lengths:
        return Finding("not measured: this run trains no task models (--task-steps 0)", verdict=NOT_MEASURED)
    present = [e for e in encodings if task_learned(r, e, task) is not None]
    learned = [e for e in present if task_learned(r, e, task)]
    missed = [ENCODING_LABELS.get(e, e) for e in present if e not in learned]
    values = "; ".join(s for e in present if (s := _task_series(r, e, task)))
    if missed:
        values += f"; not learned within L (below {LEARNED_TASK_ACCURACY:.0%} per byte), so not judged: " + ", ".join(
            missed
        )
    told = [o for _, o in items if o is not None]
    verdict = WITHHELD if told and all(o == WITHHELD for o in told) else None
    return Finding(values or "not measured: no task model of these encodings", tuple(items), verdict=verdict)


def _mamba_induction(r: Results) -> Finding:
    base = r.config.task_length
    longer = [e for e in r.task_lengths if e > base]
    encodings = [e for e in ("rope", "learned", "xpos") if task_learned(r, e, "induction") is not None]
    items = (
        [
            (f"{ENCODING_LABELS[e]} falls by {longer[-1] / base:g}L", _above(r, "induction", e, None, base, longer[-1]))
            for e in encodings
        ]
        if longer
        else []
    )
    items = [(label, outcome) for label, outcome in items]
    two = longer[0] if longer else None
    if two is not None:
        for a, b in (("xpos", "rope"), ("rope", "learned")):
            if a in encodings and b in encodings:
                items.append(
                    (
                        f"{ENCODING_LABELS[a]} above {ENCODING_LABELS[b]} at {two / base:g}L",
                        _above(r, "induction", a, b, two),
                    )
                )
    return _task_finding(r, "induction", encodings, items)


def _kazemnejad_copy(r: Results) -> Finding:
    base = r.config.task_length
    two = next((e for e in r.task_lengths if e > base), None)
    items: list[tuple[str, str | None]] = []
    if two is not None:
        items += [
            (f"NoPE above {ENCODING_LABELS[b]} at 2L", _above(r, "copy", "none", b, two)) for b in ("rope", "learned")
        ]
        items.append(("ALiBi lower at 2L than at L", _above(r, "copy", "alibi", None, base, two)))
    return _task_finding(r, "copy", ("none", "alibi", "rope", "learned", "sinusoidal"), items)


def _jelassi_copy(r: Results) -> Finding:
    base = r.config.task_length
    longer = [e for e in r.task_lengths if e > base]
    items: list[tuple[str, str | None]] = []
    if longer:
        items.append(("RoPE lower at 2L than at L", _above(r, "copy", "rope", None, base, longer[0])))
        for other in ("none", "alibi"):
            items.append(
                (
                    f"{ENCODING_LABELS[other]} holds longer than RoPE: above it at 2L",
                    _above(r, "copy", other, "rope", longer[0]),
                )
            )
    finding = _task_finding(r, "copy", ("rope", "none", "alibi"), items)
    return Finding(finding.values + "; Hard-ALiBi: not in this run (not measured)", finding.outcomes, finding.verdict)


TASK_CLAIMS: list[Claim] = [
    Claim(
        "mamba",
        "Table 11 (induction heads; 2-layer attention, width 128, vocabulary 16, trained at 256 tokens): accuracy "
        "falls past the training length. At 2x / 4x / 8x / 64x the training length: learned absolute 58.6 / 26.6 / "
        "18.8 / 7.8%, RoPE 83.6 / 31.3 / 18.4 / 5.5%, xPos 99.6 / 67.6 / 25.4 / 7.8% (chance about 6%): xPos holds "
        "best, then RoPE, then absolute.",
        (),
        "task models with learned absolute, RoPE and xPos encodings",
        "associative recall (4 keys per row, values from 16 letters, chance 6.25%), accuracy per answer with all seeds "
        "pooled: each model's accuracy at 8L below its accuracy at L, and at 2L xPos above RoPE above learned "
        "absolute, Wilson 95% intervals apart; only models that learned the task within L (at least 50%) are judged. "
        "Differences in setting: the task models are smaller and trained far shorter (Setup), at a shorter length, "
        "with 4 queries per row where the paper has one, and evaluated up to 8x (not 64x)",
        _mamba_induction,
        past_L=False,
    ),
    Claim(
        "nope",
        "On the copy task (trained on lengths up to 20, tested to 40), NoPE and T5's relative bias keep working past "
        "the training length, ALiBi degrades, and RoPE and absolute embeddings fall to about 0.",
        (),
        "task models with NoPE, ALiBi, RoPE and learned absolute encodings",
        "copy accuracy per letter, all seeds pooled: NoPE above RoPE and above learned absolute at 2L, ALiBi lower at "
        "2L than at L, Wilson 95% intervals apart; only models that learned to copy within L (at least 50%) are "
        "judged. Differences in setting: strings of letters in bytes, not their task's tokens; a small model trained "
        "for minutes (Setup); T5's bias is not in this run",
        _kazemnejad_copy,
        past_L=False,
    ),
    Claim(
        "copying",
        "Copying strings in a 'prefix | copy' format: Hard-ALiBi generalises furthest past the trained length; NoPE, "
        "ALiBi and RoPE fall off sooner, RoPE soonest.",
        (),
        "task models with RoPE, NoPE and ALiBi (Hard-ALiBi is not built)",
        "copy accuracy per letter, all seeds pooled: RoPE lower at 2L than at L, NoPE and ALiBi above RoPE at 2L, "
        "Wilson 95% intervals apart; only models that learned to copy within L are judged. Differences in setting: "
        "a far smaller model trained for minutes (Setup), strings up to half the training length, no Hard-ALiBi",
        _jelassi_copy,
        past_L=False,
    ),
]

_E = "the extension length E"
CLAIMS: list[Claim] = [
    Claim(
        "alibi",
        "On WikiText-103 (their Figure 1) the perplexity of sinusoidal and rotary models rises as the evaluation "
        "length grows past L.",
        (("sinusoidal", "none"), ("rope", "none")),
        "sinusoidal and RoPE models",
        "non-overlapping windows, as in their Figure 1: the loss at the first length past L against L, seed by seed; "
        "a rise of more than 2% agrees",
        _alibi_rises,
    ),
    Claim(
        "alibi",
        "ALiBi's perplexity does not degrade past L: it stays flat or improves slightly up to many times L.",
        (("alibi", "none"),),
        "an ALiBi model",
        "non-overlapping windows: at every length past L, the change from L, seed by seed; at most +2% agrees",
        _alibi_flat,
    ),
    Claim(
        "alibi",
        "Rotary extrapolates better than sinusoidal, though far less well than ALiBi.",
        (("alibi", "none"), ("rope", "none"), ("sinusoidal", "none")),
        "ALiBi, RoPE and sinusoidal models",
        "non-overlapping windows at the first length past L: each pair, seed by seed, a lead of more than 2%",
        _alibi_order,
    ),
    Claim(
        "alibi",
        "At the training length ALiBi is on par with or better than sinusoidal and rotary (their Table 2).",
        (("alibi", "none"), ("rope", "none"), ("sinusoidal", "none")),
        "ALiBi, RoPE and sinusoidal models",
        "non-overlapping windows at L: ALiBi against the better of the two, seed by seed; at most 2% above agrees",
        _alibi_at_L,
        past_L=False,
    ),
    Claim(
        "alibi",
        "Appendix B: evaluated with sliding windows, where every token sees a nearly full window, ALiBi gains "
        "little or nothing from windows longer than L; most of its gain with non-overlapping windows comes from giving "
        "early tokens more context (the early token curse), not from using context beyond L.",
        (("alibi", "none"), ("sliding", "")),
        "an ALiBi model and sliding-window evaluation",
        "sliding windows: at every length past L, the loss at L minus the loss there, seed by seed; a gain of at most "
        "2% agrees",
        _alibi_sliding,
    ),
    Claim(
        "nope",
        "Without any position encoding a causal decoder generalises to longer inputs better than with ALiBi, "
        "rotary or absolute embeddings (synthetic reasoning and arithmetic tasks, up to twice the training length).",
        (("none", "none"),),
        "a NoPE model beside other encodings",
        "non-overlapping windows at the first length past L: NoPE against each rival, seed by seed; no rival lower by "
        "more than 2% agrees",
        _nope_generalises,
    ),
    Claim(
        "nope",
        "A decoder without position encoding still learns where tokens are (the causal mask lets it represent "
        "absolute and relative positions).",
        (("none", "none"),),
        "a NoPE model beside other encodings",
        "non-overlapping windows at L: NoPE within 10% of the best encoding, seed by seed",
        _nope_positions,
        past_L=False,
    ),
    Claim(
        "pi",
        "Fine-tuned at the target length, a model extended with PI reaches much lower perplexity at the longer "
        "lengths than one fine-tuned there without interpolation (direct extrapolation), in as many steps.",
        (("rope-ft-linear", "linear"), ("rope-ft-none", "none"), ("sliding", "")),
        f"RoPE fine-tuned at {_E} with PI and without scaling",
        "sliding windows, as the paper evaluates, at the lengths past L up to E: PI "
        "lower by more than 2%, seed by seed",
        _pi_beats_direct,
    ),
    Claim(
        "pi",
        "Models extended with PI and fine-tuned use the longer window: their perplexity falls as the window grows "
        "to the target length.",
        (("rope-ft-linear", "linear"), ("sliding", "")),
        f"RoPE fine-tuned with PI at {_E}",
        "sliding windows: the loss at E against L, seed by seed; lower agrees",
        _pi_uses_window,
    ),
    Claim(
        "pi",
        "A model extended with PI keeps its quality inside the original window relatively well.",
        (("rope-ft-linear", "linear"), ("rope", "none"), ("sliding", "")),
        f"RoPE before and after fine-tuning with PI at {_E}",
        "sliding windows at L: the fine-tuned model at most 5% above the pretrained one, seed by seed",
        _pi_keeps_quality,
        past_L=False,
    ),
    Claim(
        "pi",
        "PI-extended, fine-tuned models retrieve passkeys at the extended lengths.",
        (("rope-ft-linear", "linear"),),
        f"RoPE fine-tuned with PI at {_E}",
        "passkey accuracy at the lengths past L up to E, every seed's trials pooled: a Wilson 95% interval above 50% "
        "agrees, below it disagrees",
        _pi_passkey,
    ),
    Claim(
        "yarn",
        "Without fine-tuning, NTK-aware scaling (high frequencies kept, low ones stretched) degrades less than PI.",
        (("rope", "ntk"), ("rope", "linear"), ("sliding", "")),
        "the pretrained RoPE model with NTK and PI",
        "sliding windows, as the paper evaluates, at every length past L: NTK lower by more than 2%, seed by seed",
        _ntk_beats_pi,
    ),
    Claim(
        "yarn",
        "Dynamic scaling lets a model run past its trained length without fine-tuning, degrading gracefully "
        "instead of failing.",
        (("rope", "dynamic"), ("rope", "none"), ("sliding", "")),
        "the pretrained RoPE model with and without dynamic NTK",
        "sliding windows at every length past L: dynamic NTK lower than RoPE as trained by more than 2%, seed by seed",
        _dynamic_graceful,
    ),
    Claim(
        "yarn",
        "Fine-tuned for the same steps, YaRN reaches lower perplexity than PI and NTK-aware scaling.",
        (("rope-ft-yarn", "yarn"), ("rope-ft-linear", "linear"), ("sliding", "")),
        f"RoPE fine-tuned at {_E} with YaRN, PI (and NTK)",
        "sliding windows at the lengths past L up to E: YaRN lower than each by more than 2%, seed by seed",
        _yarn_beats_finetuned,
    ),
    Claim(
        "yarn",
        "A model fine-tuned with YaRN extrapolates past the length it was fine-tuned at, where PI degrades.",
        (("rope-ft-yarn", "yarn"), ("rope-ft-linear", "linear"), ("sliding", "")),
        f"RoPE fine-tuned at {_E} with YaRN and PI",
        "sliding windows past E: YaRN's rise from E smaller than PI's by more than 2%, seed by seed",
        _yarn_past_finetuning,
    ),
]
