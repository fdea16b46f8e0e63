"""What a run leaves behind: ``results.json``, ``results.csv``, the figures, ``report.md`` and the
table printed at the end.

Every sentence of the report that states a result is computed from the rows: the comparisons with
the published findings (:func:`comparisons`) check each paper's claim against this run's numbers
with a stated threshold and say "agrees", "does not agree" or "not measured".
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ExperimentConfig
from .evaluate import SCALING_LABELS

__all__ = [
    "ENCODING_LABELS",
    "Comparison",
    "Method",
    "comparisons",
    "csv_text",
    "draw_figures",
    "method_label",
    "methods",
    "observations",
    "render_table",
    "report_markdown",
    "results_json",
    "separation",
    "spread",
    "spread_by_length",
    "summary_table",
    "write_atomic",
]

#: how each position encoding is called in tables and figures
ENCODING_LABELS = {
    "none": "NoPE",
    "learned": "learned absolute",
    "sinusoidal": "sinusoidal",
    "alibi": "ALiBi",
    "rope": "RoPE",
    "rope_alibi": "RoPE + ALiBi",
    "rope_relative": "RoPE + learned bias",
    "xpos": "RoPE + xPos",
}

#: relative change under which two perplexities count as "the same" in the comparisons
FLAT = 0.02


@dataclass(frozen=True)
class Method:
    """One line of the figures: a trained model, possibly with a RoPE scaling."""

    model: str
    encoding: str
    scaling: str

    @property
    def label(self) -> str:
        return method_label(self.model, self.encoding, self.scaling)

    @property
    def repeat(self) -> bool:
        return self.model != self.encoding


def method_label(model: str, encoding: str, scaling: str) -> str:
    """``"RoPE + YaRN"``, ``"ALiBi"``, ``"RoPE (2nd run)"`` ...

    Example:
        >>> method_label("rope", "rope", "linear"), method_label("rope-2", "rope", "none")
        ('RoPE + PI (linear)', 'RoPE (2nd run)')
    """
    label = ENCODING_LABELS.get(encoding, encoding)
    if scaling != "none":
        label += " + " + SCALING_LABELS.get(scaling, scaling)
    if model != encoding:
        label += " (2nd run)"
    return label


def methods(rows: Sequence[dict]) -> list[Method]:
    """The distinct (model, scaling) pairs of ``rows`` in order of first appearance."""
    seen: dict[tuple[str, str], Method] = {}
    for r in rows:
        seen.setdefault((r["model"], r["scaling"]), Method(r["model"], r["encoding"], r["scaling"]))
    return list(seen.values())


class _Table:
    """rows indexed by (model, scaling, eval_length)."""

    def __init__(self, rows: Sequence[dict]) -> None:
        self.rows = {(r["model"], r["scaling"], r["eval_length"]): r for r in rows}
        self.lengths = sorted({r["eval_length"] for r in rows})

    def get(self, model: str, scaling: str, length: int, key: str) -> Any:
        row = self.rows.get((model, scaling, length))
        return None if row is None else row[key]

    def has(self, model: str, scaling: str = "none") -> bool:
        return any((model, scaling, e) in self.rows for e in self.lengths)


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if abs(value) >= 1000:
        return f"{value:.3g}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{digits + 1}g}"


# ------------------------------------------------------------------------------------------------
# files


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename: never half a file under its real name."""
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


CSV_COLUMNS = [
    "model", "encoding", "seed", "scaling", "eval_length", "factor", "loss", "perplexity", "bits_per_byte", "windows",
    "predictions", "passkey_accuracy", "passkey_correct", "passkey_trials",
]


def csv_text(rows: Sequence[dict], edges: Sequence[int]) -> str:
    """``results.csv``: one row per model x scaling x evaluation length, bucket losses as
    ``loss_<a>_<b>`` columns (empty where the bucket lies past the window).

    Example:
        >>> row = dict(model="rope", encoding="rope", seed=0, scaling="none", eval_length=8, factor=1.0, loss=1.0,
        ...            perplexity=2.7, bits_per_byte=1.4, windows=1, predictions=7, passkey_accuracy=0.5,
        ...            passkey_correct=1, passkey_trials=2, buckets={"0-8": 1.0})
        >>> csv_text([row], [0, 8]).splitlines()[1]
        'rope,rope,0,none,8,1.0,1.0,2.7,1.4,1,7,0.5,1,2,1.0'
    """
    buckets = [f"{a}-{b}" for a, b in zip(edges[:-1], edges[1:])]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS + [f"loss_{b.replace('-', '_')}" for b in buckets])
    for r in rows:
        values = [r[c] for c in CSV_COLUMNS]
        values += ["" if r["buckets"].get(b) is None else r["buckets"][b] for b in buckets]
        writer.writerow(values)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------
# the numbers the report states


def _perplexity(loss: float) -> float:
    return math.inf if loss > 700 else math.exp(loss)  # exp() overflows past ~709 nats


def spread(rows: Sequence[dict], config: ExperimentConfig) -> list[dict]:
    """Run-to-run spread: for each encoding trained twice, the two losses and perplexities per length.

    Returns:
        one dict per (encoding, length): ``encoding, eval_length, loss_a, loss_b, loss_gap``
        (|difference| in nats), ``perplexity_a, perplexity_b, perplexity_gap``, and
        ``passkey_a, passkey_b`` (accuracies; ``None`` where passkey was not evaluated).
    """
    t = _Table(rows)
    out = []
    for enc in config.spread_encodings:
        for e in t.lengths:
            a, b = t.get(enc, "none", e, "loss"), t.get(f"{enc}-2", "none", e, "loss")
            if a is None or b is None:
                continue
            out.append({
                "encoding": enc, "eval_length": e, "loss_a": a, "loss_b": b, "loss_gap": abs(a - b),
                "perplexity_a": _perplexity(a), "perplexity_b": _perplexity(b),
                "perplexity_gap": abs(_perplexity(a) - _perplexity(b)),
                "passkey_a": t.get(enc, "none", e, "passkey_accuracy"),
                "passkey_b": t.get(f"{enc}-2", "none", e, "passkey_accuracy"),
            })
    return out


def spread_by_length(rows: Sequence[dict], config: ExperimentConfig) -> dict[int, float]:
    """The run-to-run spread at each evaluation length: the largest loss gap (nats) between the two
    runs of any encoding trained twice. Lengths where nothing was trained twice are absent.

    Example:
        >>> cfg = ExperimentConfig(train_length=128, eval_lengths=(128, 256), encodings=("rope",))
        >>> row = lambda m, e, loss: dict(model=m, encoding="rope", scaling="none", eval_length=e, loss=loss, passkey_accuracy=None)
        >>> rows = [row("rope", 128, 1.50), row("rope-2", 128, 1.52), row("rope", 256, 1.90), row("rope-2", 256, 2.02)]
        >>> {e: round(s, 3) for e, s in spread_by_length(rows, cfg).items()}
        {128: 0.02, 256: 0.12}
    """
    out: dict[int, float] = {}
    for s in spread(rows, config):
        if math.isfinite(s["loss_gap"]):
            out[s["eval_length"]] = max(out.get(s["eval_length"], 0.0), s["loss_gap"])
    return out


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def separation(rows: Sequence[dict], config: ExperimentConfig) -> dict:
    """Do the encodings separate by more than the run-to-run spread, length by length?

    Returns:
        ``{"spread_by_length": {E: nats}, "by_length": {E: {"spread", "pairs", "separated",
        "smallest_gap", "largest_gap", "within_spread": [[a, b, gap], ...]}}}``: a pair of encodings
        (as trained, first run) is "separated" at ``E`` when their losses differ by more than the
        spread *at E* (:func:`spread_by_length`); the pairs that do not are listed. Empty when nothing
        was trained twice.
    """
    t = _Table(rows)
    limits = spread_by_length(rows, config)
    if not limits:
        return {}
    encodings = [e for e in config.encodings if t.has(e)]
    by_length = {}
    for e in t.lengths:
        if e not in limits:
            continue
        pair_gaps = []
        for i, a in enumerate(encodings):
            for b in encodings[i + 1 :]:
                la, lb = t.get(a, "none", e, "loss"), t.get(b, "none", e, "loss")
                if la is not None and lb is not None and math.isfinite(la) and math.isfinite(lb):
                    pair_gaps.append((a, b, abs(la - lb)))
        if pair_gaps:
            gaps = [g for _, _, g in pair_gaps]
            by_length[e] = {
                "spread": limits[e], "pairs": len(gaps), "separated": sum(g > limits[e] for g in gaps),
                "smallest_gap": min(gaps), "largest_gap": max(gaps),
                "within_spread": [[a, b, g] for a, b, g in pair_gaps if g <= limits[e]],
            }
    return {"spread_by_length": limits, "by_length": by_length}


class _Noise:
    """The run-to-run spread the comparisons are held to: at a length (two methods at ``E``), and of a
    change between two lengths (one method at ``E`` against ``L``), in nats; 0 where not measured.
    Passkey: the two runs' accuracies apart, per length."""

    def __init__(self, rows: Sequence[dict], config: ExperimentConfig) -> None:
        self.rows = spread(rows, config)
        self.lengths = spread_by_length(rows, config)

    @property
    def measured(self) -> bool:
        return bool(self.lengths)

    def at(self, e: int) -> float:
        return self.lengths.get(e, 0.0)

    def change(self, e: int, base: int) -> float:
        """Largest |(loss_a(E) - loss_a(base)) - (loss_b(E) - loss_b(base))| over the encodings trained twice."""
        by = {(s["encoding"], s["eval_length"]): s for s in self.rows}
        gaps = [
            abs((by[enc, e]["loss_a"] - by[enc, base]["loss_a"]) - (by[enc, e]["loss_b"] - by[enc, base]["loss_b"]))
            for enc, length in by if length == e and (enc, base) in by
        ]
        gaps = [g for g in gaps if math.isfinite(g)]
        return max(gaps, default=0.0)

    def passkey(self, e: int) -> float:
        gaps = [abs(s["passkey_a"] - s["passkey_b"]) for s in self.rows
                if s["eval_length"] == e and s.get("passkey_a") is not None and s.get("passkey_b") is not None]
        return max(gaps, default=0.0)


# the outcome of one item of a claim
AGREE, DISAGREE, WITHIN = "agrees", "does not agree", "within run-to-run spread"


def _claim_lower(x: float | None, y: float | None, noise: float) -> str | None:
    """Claim "perplexity ``x`` is lower than ``y``": within the spread when ``|ln x - ln y| <= noise``;
    otherwise it holds when ``x`` is lower by more than :data:`FLAT` (a smaller lead is a tie, no win).
    None when either is missing or not finite."""
    if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)) or x <= 0 or y <= 0:
        return None
    if noise > 0 and abs(math.log(x) - math.log(y)) <= noise:
        return WITHIN
    return AGREE if x < y * (1 - FLAT) else DISAGREE


def _claim_at_most(d: float | None, bound: float, noise: float) -> str | None:
    """Claim "``d`` (nats) is at most ``bound``": within the spread when ``|d - bound| <= noise`` (the
    verdict would flip if ``d`` moved by the spread), else whether it holds."""
    if d is None or not math.isfinite(d):
        return None
    if noise > 0 and abs(d - bound) <= noise:
        return WITHIN
    return AGREE if d <= bound else DISAGREE


def _combine(outcomes: Sequence[str | None]) -> str:
    """One verdict from the items of a claim: ``agrees`` / ``does not agree`` when every item that exceeds
    the spread points one way (and none is within it, for ``agrees``), ``partly`` when they point both
    ways or the claim holds only where the spread lets one tell, and ``within run-to-run spread`` when
    no item exceeds it.

    Example:
        >>> _combine([AGREE, AGREE]), _combine([AGREE, WITHIN]), _combine([DISAGREE, WITHIN]), _combine([WITHIN])
        ('agrees', 'partly', 'does not agree', 'within run-to-run spread')
    """
    told = [o for o in outcomes if o is not None]
    if not told:
        return "not measured"
    if all(o == WITHIN for o in told):
        return WITHIN
    agree, disagree = told.count(AGREE), told.count(DISAGREE)
    if agree and not disagree and agree == len(told):
        return AGREE
    if agree:
        return "partly"
    return DISAGREE


def _within_note(items: Sequence[tuple[str, str | None, float]]) -> str:
    """``"; within the run-to-run spread: at 2L (0.201 nats)"`` for the items that are, else ``""``."""
    within = [f"{label} ({noise:.3f} nats)" for label, outcome, noise in items if outcome == WITHIN]
    return f"; within the run-to-run spread: {', '.join(within)}" if within else ""


def _ratio(t: _Table, model: str, scaling: str, e: int, base: int) -> float | None:
    a, b = t.get(model, scaling, e, "perplexity"), t.get(model, scaling, base, "perplexity")
    return None if a is None or b is None or b == 0 else a / b


def _log(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) or value <= 0 else math.log(value)


def observations(rows: Sequence[dict], config: ExperimentConfig) -> list[str]:
    """Plain statements of what this run measured (no expectations), one per line of the report."""
    t = _Table(rows)
    noise = _Noise(rows, config)
    L = config.train_length
    first = [m for m in methods(rows) if not m.repeat]
    lines = []
    for e in t.lengths:
        ranked = sorted(
            (p, m.label) for m in first if (p := t.get(m.model, m.scaling, e, "perplexity")) is not None and math.isfinite(p)
        )
        if ranked:
            best, label = ranked[0]
            line = (f"At {e} tokens ({e / L:g}L) the lowest perplexity is {label}'s, {_fmt(best)}; the highest is "
                    f"{ranked[-1][1]}'s, {_fmt(ranked[-1][0])}.")
            close = [other for p, other in ranked[1:] if noise.at(e) > 0 and math.log(p) - math.log(best) <= noise.at(e)]
            if close:
                line += f" Within the run-to-run spread at this length ({noise.at(e):.3f} nats) of the lowest: {', '.join(close)}."
            lines.append(line)
    longest = t.lengths[-1]
    untouched = [m for m in first if m.scaling == "none"]
    for m in untouched:
        r = _ratio(t, m.model, "none", longest, L)
        if r is not None:
            lines.append(f"{m.label}: perplexity at {longest / L:g}L is {r:.3f}x its value at L.")
    edges = [0, *sorted(config.eval_lengths)]
    if len(edges) > 2:
        first_bucket, last_bucket = f"{edges[0]}-{edges[1]}", f"{edges[-2]}-{edges[-1]}"
        worse = []
        for m in first:
            row = t.rows.get((m.model, m.scaling, longest))
            if row and row["buckets"].get(first_bucket) is not None and row["buckets"].get(last_bucket) is not None:
                delta = row["buckets"][last_bucket] - row["buckets"][first_bucket]
                worse.append((delta, m.label))
        if worse:
            worse.sort()
            better = [f"{label} ({d:+.3f})" for d, label in worse if d < 0]
            broke = [f"{label} ({d:+.3f})" for d, label in worse if d >= 0]
            lines.append(
                f"On {longest}-token windows, the loss at positions [{edges[-2]}, {edges[-1]}) minus the loss at [0, {edges[1]}) "
                f"(nats): lower past L for {', '.join(better) or 'no method'}; higher for {', '.join(broke) or 'no method'}."
            )
    for e in t.lengths:
        acc = [(t.get(m.model, m.scaling, e, "passkey_accuracy"), m.label) for m in first]
        acc = [a for a in acc if a[0] is not None]
        if acc:
            best = max(a for a, _ in acc)
            leaders = [label for a, label in acc if a == best]
            lines.append(f"Passkey retrieval at {e} tokens: best {best:.0%} ({', '.join(leaders)}).")
    return lines


@dataclass(frozen=True)
class Comparison:
    """One published claim checked against this run."""

    paper: str
    claim: str
    observed: str
    verdict: str  # "agrees", "does not agree", "partly", "within run-to-run spread", "not measured"


PAPERS = {
    "alibi": 'Press, Smith & Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length Extrapolation"',
    "nope": 'Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers"',
    "pi": 'Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation"',
    "yarn": 'Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models"',
}

#: the tolerance of the claims "on par" and "keeps its quality": 2%, in nats
FLAT_NATS = math.log(1 + FLAT)


def comparisons(rows: Sequence[dict], config: ExperimentConfig) -> list[Comparison]:
    """Each paper's claim, what this run measured, and whether they agree.

    Every verdict is held to the run-to-run spread (:func:`spread_by_length`): a difference between
    two methods at ``E`` counts only when it exceeds the spread at ``E``, and a change of one method
    from ``L`` to ``E`` only when it exceeds the spread of that change between the two runs; smaller
    ones are "within run-to-run spread", never agreement or disagreement. Beyond the spread, a lead
    of at most :data:`FLAT` (2%) is a tie, as it is everywhere when nothing was trained twice.
    """
    t = _Table(rows)
    noise = _Noise(rows, config)
    L = config.train_length
    longer = [e for e in t.lengths if e > L]
    out: list[Comparison] = []

    def ppl(model: str, scaling: str, e: int) -> float | None:
        return t.get(model, scaling, e, "perplexity")

    def missing(paper: str, claim: str, needs: str) -> Comparison:
        return Comparison(PAPERS[paper], claim, f"not measured: this run has no {needs}", "not measured")

    def series(model: str, scaling: str = "none") -> str:
        return ", ".join(f"{_fmt(ppl(model, scaling, e))} at {e / L:g}L" for e in t.lengths if ppl(model, scaling, e) is not None)

    def at(e: int) -> str:
        return f"{e / L:g}L"

    # --- ALiBi paper ------------------------------------------------------------------------
    claim = ("On WikiText-103 (their Figure 1, L = 512 and 1024) the perplexity of sinusoidal and rotary models "
             "rises as the evaluation length grows past L.")
    if t.has("sinusoidal") and t.has("rope") and longer:
        e = longer[0]
        rises = {m: _ratio(t, m, "none", e, L) for m in ("sinusoidal", "rope")}
        items = [(name, _claim_lower(ppl(m, "none", L), ppl(m, "none", e), noise.change(e, L)), noise.change(e, L))
                 for m, name in (("sinusoidal", "sinusoidal"), ("rope", "RoPE"))]
        observed = (f"at {at(e)}, sinusoidal is {_fmt(rises['sinusoidal'])}x and RoPE {_fmt(rises['rope'])}x their "
                    f"perplexity at L (sinusoidal: {series('sinusoidal')}; RoPE: {series('rope')})" + _within_note(items))
        out.append(Comparison(PAPERS["alibi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("alibi", claim, "sinusoidal and RoPE models evaluated past L"))

    claim = "ALiBi's perplexity does not degrade past L: it stays flat or improves slightly up to many times L."
    if t.has("alibi") and longer:
        items = [(at(e), _claim_at_most(_log(_ratio(t, "alibi", "none", e, L)), FLAT_NATS, noise.change(e, L)), noise.change(e, L))
                 for e in longer]
        worst = max((r for e in longer if (r := _ratio(t, "alibi", "none", e, L)) is not None), default=None)
        observed = f"ALiBi: {series('alibi')}; its worst length past L is {_fmt(worst)}x its perplexity at L" + _within_note(items)
        out.append(Comparison(PAPERS["alibi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("alibi", claim, "ALiBi model evaluated past L"))

    claim = "Rotary extrapolates better than sinusoidal (its perplexity rises later), though far less well than ALiBi."
    if t.has("sinusoidal") and t.has("rope") and t.has("alibi") and longer:
        e = longer[0]
        r, s, a = ppl("rope", "none", e), ppl("sinusoidal", "none", e), ppl("alibi", "none", e)
        items = [("ALiBi against RoPE", _claim_lower(a, r, noise.at(e)), noise.at(e)),
                 ("RoPE against sinusoidal", _claim_lower(r, s, noise.at(e)), noise.at(e))]
        observed = f"at {at(e)}: RoPE {_fmt(r)}, sinusoidal {_fmt(s)}, ALiBi {_fmt(a)}" + _within_note(items)
        out.append(Comparison(PAPERS["alibi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("alibi", claim, "sinusoidal, RoPE and ALiBi models"))

    claim = "At the training length itself ALiBi is on par with or better than sinusoidal and rotary (their Table 2: 19.73 vs 20.05 and 20.07 at L = 512)."
    if t.has("alibi") and t.has("sinusoidal") and t.has("rope"):
        a, s, r = ppl("alibi", "none", L), ppl("sinusoidal", "none", L), ppl("rope", "none", L)
        if None in (a, s, r):
            out.append(missing("alibi", claim, f"evaluation at L = {L}"))
        else:
            d = None if _log(a) is None or _log(min(s, r)) is None else _log(a) - _log(min(s, r))
            items = [("at L", _claim_at_most(d, FLAT_NATS, noise.at(L)), noise.at(L))]
            observed = f"at L: ALiBi {_fmt(a)}, sinusoidal {_fmt(s)}, RoPE {_fmt(r)}" + _within_note(items)
            out.append(Comparison(PAPERS["alibi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("alibi", claim, "ALiBi, sinusoidal and RoPE models"))

    # --- NoPE paper -------------------------------------------------------------------------
    claim = ("Without any position encoding a causal decoder generalises to longer inputs better than with ALiBi, "
             "rotary or absolute embeddings (synthetic reasoning and arithmetic tasks, tested up to twice the training length).")
    rivals = [e for e in ("alibi", "rope", "learned", "sinusoidal") if t.has(e)]
    if t.has("none") and rivals and longer:
        e = longer[0]
        ranking = sorted(((ppl(m, "none", e), ENCODING_LABELS.get(m, m)) for m in ["none", *rivals]),
                         key=lambda v: math.inf if v[0] is None or not math.isfinite(v[0]) else v[0])
        # no rival clearly below NoPE: a rival lower by at most 2% ties with it (shares its place)
        tie = -math.log(1 - FLAT)
        nope = _log(ppl("none", "none", e))
        items = [(f"NoPE against {ENCODING_LABELS.get(m, m)}",
                  None if nope is None or _log(ppl(m, "none", e)) is None else _claim_at_most(nope - _log(ppl(m, "none", e)), tie, noise.at(e)),
                  noise.at(e)) for m in rivals]
        place = 1 + sum(o == DISAGREE for _, o, _ in items)
        pk = {m: t.get(m, "none", e, "passkey_accuracy") for m in ["none", *rivals]}
        observed = (f"at {at(e)} NoPE ranks {place} of {len(ranking)} by perplexity, counting only rivals lower by more than "
                    f"{FLAT:.0%} and the spread (" + ", ".join(f"{label} {_fmt(v)}" for v, label in ranking)
                    + f"); passkey at {at(e)}: NoPE {_percent(pk['none'])}, best {_percent(max((v for v in pk.values() if v is not None), default=None))}"
                    + _within_note(items))
        out.append(Comparison(PAPERS["nope"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("nope", claim, "NoPE model beside other encodings evaluated past L"))

    claim = "A decoder without position encoding still learns where tokens are (the causal mask lets it represent absolute and relative positions)."
    firsts = [e for e in config.encodings if t.has(e) and e != "none" and ppl(e, "none", L) is not None]
    if t.has("none") and firsts and ppl("none", "none", L) is not None:
        best = min((ppl(e, "none", L), ENCODING_LABELS.get(e, e)) for e in firsts)
        n = ppl("none", "none", L)
        d = None if _log(n) is None or _log(best[0]) is None else _log(n) - _log(best[0])
        items = [("at L, against 10% above the best", _claim_at_most(d, math.log(1.10), noise.at(L)), noise.at(L))]
        observed = f"at L NoPE reaches {_fmt(n)}, the best encoding ({best[1]}) {_fmt(best[0])}: {_fmt(n / best[0])}x (within 10% counts)" + _within_note(items)
        out.append(Comparison(PAPERS["nope"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("nope", claim, "NoPE model beside another encoding"))

    # --- Position interpolation --------------------------------------------------------------
    claim = ("Extrapolating RoPE past the trained length fails badly, while interpolating the positions (PI) is far more "
             "stable (their bound on the attention scores is about 600x smaller).")
    if t.has("rope", "linear") and longer:
        items = [(at(e), _claim_lower(ppl("rope", "linear", e), ppl("rope", "none", e), noise.at(e)), noise.at(e)) for e in longer]
        wins = sum(o == AGREE for _, o, _ in items)
        observed = (f"RoPE as trained: {series('rope')}; with PI: {series('rope', 'linear')}; PI is lower (by more than "
                    f"{FLAT:.0%} and the spread) at {wins} of {len(longer)} lengths past L" + _within_note(items))
        out.append(Comparison(PAPERS["pi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("pi", claim, "RoPE model with the linear scaling"))

    claim = ("A model extended with PI keeps its quality inside the original window relatively well "
             "(after the paper's fine-tuning of at most 1000 steps; this run does not fine-tune).")
    first_bucket = f"0-{sorted(config.eval_lengths)[0]}" if sorted(config.eval_lengths)[0] == L else None
    longest = t.lengths[-1]
    if t.has("rope", "linear") and first_bucket and longest > L and ("rope", "none", longest) in t.rows and ("rope", "linear", longest) in t.rows:
        a = t.rows[("rope", "none", longest)]["buckets"][first_bucket]
        b = t.rows[("rope", "linear", longest)]["buckets"][first_bucket]
        d = None if a is None or b is None else b - a
        items = [(f"{at(longest)} windows", _claim_at_most(d, FLAT_NATS, noise.at(longest)), noise.at(longest))]
        observed = (f"loss at positions [0, L) of {longest}-token windows: {_fmt(a)} nats as trained, {_fmt(b)} with PI "
                    f"(factor {longest / L:g}), {'–' if d is None else f'{d:+.3f}'}" + _within_note(items))
        out.append(Comparison(PAPERS["pi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("pi", claim, "RoPE model with PI evaluated on windows past L"))

    claim = "PI-extended models retrieve passkeys at the extended lengths (after fine-tuning)."
    if t.has("rope", "linear") and longer:
        accs = {e: t.get("rope", "linear", e, "passkey_accuracy") for e in longer}
        base = {e: t.get("rope", "none", e, "passkey_accuracy") for e in longer}
        # at least half the keys; held to the two runs' passkey accuracies apart at that length
        items = [(at(e), None if accs[e] is None else _claim_at_most(0.5 - accs[e], 0.0, noise.passkey(e)), noise.passkey(e))
                 for e in longer]
        observed = "passkey with PI: " + ", ".join(f"{_percent(accs[e])} at {at(e)} (as trained {_percent(base[e])})" for e in longer)
        within = [f"{label} (the runs differ by {n:.0%})" for label, o, n in items if o == WITHIN]
        observed += f"; within the run-to-run spread: {', '.join(within)}" if within else ""
        out.append(Comparison(PAPERS["pi"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("pi", claim, "RoPE model with PI"))

    # --- YaRN --------------------------------------------------------------------------------
    claim = ("NTK-aware scaling, which keeps the high frequencies and stretches the low ones, degrades less than PI "
             "without fine-tuning.")
    if t.has("rope", "ntk") and t.has("rope", "linear") and longer:
        items = [(at(e), _claim_lower(ppl("rope", "ntk", e), ppl("rope", "linear", e), noise.at(e)), noise.at(e)) for e in longer]
        wins = sum(o == AGREE for _, o, _ in items)
        observed = (f"NTK: {series('rope', 'ntk')}; PI: {series('rope', 'linear')}; NTK lower at {wins} of {len(longer)} "
                    "lengths past L" + _within_note(items))
        out.append(Comparison(PAPERS["yarn"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("yarn", claim, "RoPE model with NTK and PI"))

    claim = "Dynamic scaling lets a model run past its trained length without fine-tuning, degrading gracefully instead of failing."
    if t.has("rope", "dynamic") and longer:
        items = [(at(e), _claim_lower(ppl("rope", "dynamic", e), ppl("rope", "none", e), noise.at(e)), noise.at(e)) for e in longer]
        wins = sum(o == AGREE for _, o, _ in items)
        observed = (f"dynamic NTK: {series('rope', 'dynamic')}; as trained: {series('rope')}; lower at {wins} of {len(longer)} "
                    "lengths past L" + _within_note(items))
        out.append(Comparison(PAPERS["yarn"], claim, observed, _combine([o for _, o, _ in items])))
    else:
        out.append(missing("yarn", claim, "RoPE model with dynamic NTK"))

    claim = "YaRN (NTK-by-parts plus an attention temperature) reaches lower perplexity than PI and NTK-aware scaling at the same factor."
    others = [s for s in ("linear", "ntk") if t.has("rope", s)]
    if t.has("rope", "yarn") and others and longer:
        items = [(f"{SCALING_LABELS[s]} at {at(e)}", _claim_lower(ppl("rope", "yarn", e), ppl("rope", s, e), noise.at(e)), noise.at(e))
                 for e in longer for s in others]
        # per length, YaRN must be below every other: one clear loss decides it, else one within the spread does
        per_length = []
        for e in longer:
            here = [o for label, o, _ in items if label.endswith(f" at {at(e)}")]
            per_length.append(None if None in here else DISAGREE if DISAGREE in here else WITHIN if WITHIN in here else AGREE)
        wins = per_length.count(AGREE)
        observed = (f"YaRN: {series('rope', 'yarn')}; lowest of YaRN, {', '.join(SCALING_LABELS[s] for s in others)} at {wins} of "
                    f"{len(longer)} lengths past L" + _within_note(items))
        out.append(Comparison(PAPERS["yarn"], claim, observed, _combine(per_length)))
    else:
        out.append(missing("yarn", claim, "RoPE model with YaRN and PI or NTK"))
    return out


# ------------------------------------------------------------------------------------------------
# tables


def summary_table(rows: Sequence[dict], config: ExperimentConfig) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the main table: perplexity per length, then passkey accuracy per length."""
    t = _Table(rows)
    L = config.train_length
    header = ["method"] + [f"ppl {e / L:g}L" for e in t.lengths] + [f"passkey {e / L:g}L" for e in t.lengths]
    body = []
    for m in methods(rows):
        cells = [m.label]
        cells += [_fmt(t.get(m.model, m.scaling, e, "perplexity")) for e in t.lengths]
        cells += [_percent(t.get(m.model, m.scaling, e, "passkey_accuracy")) for e in t.lengths]
        body.append(cells)
    return header, body


def markdown_table(header: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """A GitHub markdown table (first column left-aligned, the others right-aligned)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def render_table(rows: Sequence[dict], config: ExperimentConfig, console: Any) -> None:
    """Print the main table with rich."""
    from rich.table import Table

    header, body = summary_table(rows, config)
    table = Table(title=f"perplexity (bytes) and passkey accuracy; trained at L = {config.train_length}", title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in body:
        table.add_row(*row)
    console.print(table)


# ------------------------------------------------------------------------------------------------
# figures


def draw_figures(rows: Sequence[dict], config: ExperimentConfig, directory: Path) -> dict[str, list[Path]]:
    """Perplexity against length, loss by position bucket, passkey heatmap: PNG + SVG each.

    Returns:
        ``{"perplexity": [png, svg], "buckets": [...], "passkey": [...]}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plots import PALETTE, save

    t = _Table(rows)
    L = config.train_length
    ms = methods(rows)
    encodings = [m for m in ms if m.scaling == "none" and not m.repeat]
    colour = {m.encoding: PALETTE[i % len(PALETTE)] for i, m in enumerate(encodings)}
    styles = {"none": "-", "linear": "--", "ntk": "-.", "dynamic": ":", "yarn": (0, (5, 1, 1, 1))}
    scaled_colours = {"linear": "#999999", "ntk": "#7F3C8D", "dynamic": "#11A579", "yarn": "#E73F74"}

    def style(m: Method) -> dict:
        if m.scaling != "none":
            return dict(color=scaled_colours.get(m.scaling, "#555555"), linestyle=styles.get(m.scaling, "--"), marker="s", markersize=4, linewidth=1.4)
        if m.repeat:
            return dict(color=colour.get(m.encoding, "#000000"), linestyle=":", marker=None, linewidth=1.0, alpha=0.8)
        return dict(color=colour.get(m.encoding, "#000000"), linestyle="-", marker="o", markersize=5, linewidth=2.0)

    paths: dict[str, list[Path]] = {}
    directory.mkdir(parents=True, exist_ok=True)

    def plottable(value: float | None) -> bool:  # log axes: finite and > 0 (an overflowed perplexity is inf)
        return value is not None and math.isfinite(value) and value > 0

    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    drawn = 0
    for m in ms:
        xs = [e for e in t.lengths if plottable(t.get(m.model, m.scaling, e, "perplexity"))]
        ax.plot(xs, [t.get(m.model, m.scaling, e, "perplexity") for e in xs], label=m.label, **style(m))
        drawn += len(xs)
    ax.axvline(L, color="#444444", linewidth=1, linestyle="--")
    ax.text(L, 0.98, " L (training length)", transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=9)
    ax.set_xscale("log", base=2)
    if drawn:
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no finite perplexity to draw", transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks(t.lengths, [f"{e}\n({e / L:g}L)" for e in t.lengths])
    ax.set_xlabel("evaluation length E (tokens = bytes)")
    ax.set_ylabel("perplexity per byte (log scale)")
    ax.set_title(f"Train at L = {L}, test longer: held-out perplexity on windows of E tokens")
    ax.legend(fontsize=8, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths["perplexity"] = save(fig, directory / "perplexity")

    edges = [0, *sorted(config.eval_lengths)]
    longest = edges[-1]
    labels = [f"[{a}, {b})" for a, b in zip(edges[:-1], edges[1:])]
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    for m in ms:
        row = t.rows.get((m.model, m.scaling, longest))
        if row is None:
            continue
        values = [row["buckets"].get(f"{a}-{b}") for a, b in zip(edges[:-1], edges[1:])]
        ax.plot(range(len(labels)), [v if v is not None and math.isfinite(v) else math.nan for v in values], label=m.label, **style(m))
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel(f"query position inside windows of {longest} tokens")
    ax.set_ylabel("mean next-byte loss (nats)")
    ax.set_title("Loss by position: does the model break past L, or gain from the longer context?")
    ax.legend(fontsize=8, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths["buckets"] = save(fig, directory / "position_buckets")

    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(ms) + 1.8))
    grid = [[t.get(m.model, m.scaling, e, "passkey_accuracy") for e in t.lengths] for m in ms]
    image = ax.imshow([[math.nan if v is None else v for v in row] for row in grid], cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=9)
    ax.set_xticks(range(len(t.lengths)), [f"{e} ({e / L:g}L)" for e in t.lengths])
    ax.set_yticks(range(len(ms)), [m.label for m in ms])
    ax.grid(False)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_title(f"Passkey retrieval accuracy ({config.passkey_trials} trials per length)")
    fig.colorbar(image, ax=ax, fraction=0.04)
    paths["passkey"] = save(fig, directory / "passkey")
    return paths


# ------------------------------------------------------------------------------------------------
# report.md


def report_markdown(results: dict[str, Any], config: ExperimentConfig, figures: dict[str, list[Path]], out: Path) -> str:
    """The whole ``report.md``: setup, figures, tables, observations and the comparisons."""
    rows = results["results"]
    t = _Table(rows)
    L = config.train_length
    ms = methods(rows)
    edges = [0, *sorted(config.eval_lengths)]
    longest = edges[-1]
    env = results["environment"]
    data = results["data"]
    sizes = ", ".join(f"{m['name']} {m['parameters']:,}" for m in results["models"] if not m["name"].endswith("-2"))
    lines = [
        f"# Train short, test long: {len(config.encodings)} position encodings, {len(config.scalings)} RoPE scalings",
        "",
        f"Command: `{results['command']}`  ",
        f"Finished {results['finished']} in {results['wall_seconds'] / 60:.1f} min on {env['cpu']} "
        f"({env['threads']} torch threads, {env['device']}, {env['world_size']} process(es)); torch {env['torch']}, rotary {env['rotary']}.",
        "",
        "## Setup",
        "",
        f"- **Text**: {data['source']} ({data['bytes']:,} bytes, sha256 `{data['sha256'][:16]}…`), one token per byte "
        f"(vocabulary 256). The first {1 - config.held_out_fraction:.0%} trains; the last {config.held_out_fraction:.0%} "
        f"is held out, and {data['eval_tokens']:,} of its bytes are evaluated at every length.",
        f"- **Models**: one `rotary.models.Decoder` per encoding: {config.num_layers} layers, width {config.hidden_size}, "
        f"{config.num_heads} heads, SwiGLU, RMSNorm; parameters: {sizes}.",
        f"- **Training**: L = {L} tokens, {config.steps} AdamW steps of {config.batch_size} rows "
        f"({config.steps * config.batch_size * L:,} tokens per model), learning rate {config.learning_rate:g} → "
        f"{config.min_learning_rate:g} (cosine, {config.warmup_steps} warm-up steps). {config.passkey_fraction:.0%} of the rows end "
        f"with a passkey sample of at most L tokens.",
        f"- **Evaluation** at E = {', '.join(f'{e} ({e / L:g}L)' for e in sorted(config.eval_lengths))}: perplexity and bits per "
        f"byte on non-overlapping windows of E tokens; loss by query position on {longest}-token windows; passkey retrieval "
        f"({config.passkey_trials} trials per length at depths {', '.join(f'{d:g}' for d in config.passkey_depths)}, greedy decoding, exact match of the 5 digits).",
        f"- **Scalings** of the trained RoPE model, factor E / L, weights unchanged: "
        f"{', '.join(SCALING_LABELS[s] or 'none' for s in config.scalings)}.",
    ]
    learned = [m for m in results["models"] if m["encoding"] == "learned"]
    for m in learned:
        state = "identical to their initial values" if m.get("untrained_rows_unchanged") else "NOT identical to their initial values"
        lines.append(
            f"- **Learned absolute table**: sized to {longest} positions; rows {L}..{longest - 1} never receive a gradient "
            f"(training windows have L = {L} positions) and are not weight-decayed, so they stay as initialised "
            f"(normal, std 0.02): checked after training, {state}."
        )
    lines += [
        "",
        "## Perplexity against evaluation length",
        "",
        f"![perplexity](figures/{figures['perplexity'][0].name})",
        "",
        markdown_table(*summary_table(rows, config)),
        "",
        "Bits per byte (the loss in bits; lower is better):",
        "",
        markdown_table(
            ["method"] + [f"{e / L:g}L" for e in t.lengths],
            [[m.label] + [_fmt(t.get(m.model, m.scaling, e, "bits_per_byte")) for e in t.lengths] for m in ms],
        ),
        "",
        f"## Loss by position on {longest}-token windows",
        "",
        f"![buckets](figures/{figures['buckets'][0].name})",
        "",
        markdown_table(
            ["method"] + [f"[{a}, {b})" for a, b in zip(edges[:-1], edges[1:])],
            [
                [m.label] + [_fmt((t.rows.get((m.model, m.scaling, longest)) or {"buckets": {}})["buckets"].get(f"{a}-{b}")) for a, b in zip(edges[:-1], edges[1:])]
                for m in ms
            ],
        ),
        "",
        "Mean next-byte loss (nats) of queries in each range of positions. A method that only lacks context gets "
        "better to the right; a method that breaks at positions it never saw gets worse.",
        "",
        "## Passkey retrieval",
        "",
        f"![passkey](figures/{figures['passkey'][0].name})",
        "",
    ]
    best_at_L = max((t.get(m.model, m.scaling, L, "passkey_accuracy") or 0.0, m.label) for m in ms if not m.repeat) if L in t.lengths else None
    if best_at_L is not None:
        if best_at_L[0] > 0.5:
            verdict = "most keys."
        else:
            verdict = ("not most keys: with this budget no model learned to retrieve most passkeys even at the "
                       "training length, so the passkey columns cannot rank the methods.")
        lines += [f"At L the best method, {best_at_L[1]}, retrieves {best_at_L[0]:.0%} of the keys: {verdict}", ""]
    lines += ["## Run-to-run spread", ""]
    sp = results["spread"]
    if sp:
        lines.append(markdown_table(
            ["encoding", "E", "loss, run 1", "loss, run 2", "gap (nats)", "perplexity gap", "passkey, run 1", "passkey, run 2"],
            [[ENCODING_LABELS.get(s["encoding"], s["encoding"]), str(s["eval_length"]), f"{s['loss_a']:.4f}", f"{s['loss_b']:.4f}",
              f"{s['loss_gap']:.4f}", f"{s['perplexity_gap']:.3g}", _percent(s.get("passkey_a")), _percent(s.get("passkey_b"))]
             for s in sp],
        ))
        at_l = [s for s in sp if s["eval_length"] == L and s.get("passkey_a") is not None and s.get("passkey_b") is not None]
        for s in at_l:
            if abs(s["passkey_a"] - s["passkey_b"]) >= 0.25:
                lines += ["", f"Passkey retrieval at L is not stable across seeds at this budget: "
                          f"{ENCODING_LABELS.get(s['encoding'], s['encoding'])} retrieves {s['passkey_a']:.0%} in one run and "
                          f"{s['passkey_b']:.0%} in the other. Retrieval is learned abruptly late in training, so compare "
                          "encodings by perplexity here and read passkey figures as one draw."]
        sep = results["separation"]
        lines += ["", f"The second run changes the initialisation and the batch order (seed {config.seed + 1} instead of {config.seed})."]
        if sep:
            limits = {int(e): v for e, v in sep["spread_by_length"].items()}
            lines.append(
                "The spread at each length, the largest loss gap between the two runs: "
                + ", ".join(f"{v:.4f} nats at {e / L:g}L" for e, v in sorted(limits.items()))
                + ". Each length is held to its own spread, not to the spread at L: a pair of encodings (as trained) "
                "counts as separated at a length only when their losses differ by more than the spread at that length:"
            )
            lines.append("")
            for e, s in sep["by_length"].items():
                line = (f"- at {int(e) / L:g}L (spread {s['spread']:.4f} nats): {s['separated']} of {s['pairs']} pairs separated "
                        f"(gaps from {s['smallest_gap']:.3f} to {s['largest_gap']:.3f} nats)")
                if s["within_spread"]:
                    line += "; within the spread: " + ", ".join(
                        f"{ENCODING_LABELS.get(a, a)} vs {ENCODING_LABELS.get(b, b)} ({g:.3f})" for a, b, g in s["within_spread"])
                lines.append(line)
            lines += ["", "The comparisons with the published findings below are held to the same spreads: a difference "
                      "smaller than the spread at its length is reported as within run-to-run spread, not as agreement "
                      "or disagreement. The spread is measured on "
                      + ", ".join(ENCODING_LABELS.get(e, e) for e in config.spread_encodings)
                      + " as trained and applied to every method, the scaled ones included."]
    else:
        lines.append("No encoding was trained twice (`--spread-encodings` empty): the spread was not measured.")
    lines += ["", "## What this run shows", ""]
    lines += [f"- {o}" for o in observations(rows, config)]
    lines += ["", "## Compared with the published findings", ""]
    if not results["spread"]:
        lines += ["Nothing was trained twice, so the run-to-run spread is unknown: these verdicts use the 2% threshold "
                  "alone and may rest on differences no larger than the noise between two runs.", ""]
    for c in comparisons(rows, config):
        lines += [f"- **{c.verdict}** — {c.paper}: {c.claim}  ", f"  This run: {c.observed}."]
    lines += [
        "",
        "The papers trained far larger models on far more text (and the NoPE study used synthetic tasks, not language "
        "modelling); a verdict here says whether this run's numbers point the same way, at this scale.",
        "",
        "## Notes",
        "",
        "- Dynamic NTK is transformers' `dynamic` rope_type with factor E / L: at n tokens it raises RoPE's base as static "
        "NTK with alpha = factor·n/L − (factor − 1) would, i.e. alpha = factor² − factor + 1 at n = E (static NTK uses alpha = factor). "
        "Keys cached during decoding keep the frequencies they were rotated with.",
        "- YaRN uses beta_fast = 32, beta_slow = 1 and the attention temperature 0.1·ln(factor) + 1.",
        f"- Wall time: {', '.join(f'{k} {v:.0f} s' for k, v in results['timings'].items())}.",
        "",
    ]
    return "\n".join(lines)


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
