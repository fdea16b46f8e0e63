"""The two studies beside the main comparison: RoPE's base, and moving a sinusoidal model to RoPE.

**Base** (``--study base``): RoPE trained at every base of ``--bases``, compared with "Scaling Laws of
RoPE-based Extrapolation": the critical dimension ``d_extra`` (:func:`critical_dimension`) and the extrapolation
bound ``T_extra`` (:func:`extrapolation_limit`); docs/experiment_base.md. **Transfer** (``--study transfer``): a
sinusoidal model moved to RoPE, as it is and fine-tuned, beside RoPE and sinusoidal models of the same total
steps (docs/experiment_transfer.md); no paper we cite measures this.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .claims import FLAT, FLAT_NATS, LOWER_NATS, Claim, Finding, fmt, ppl, series
from .config import ExperimentConfig
from .results import Results, Values
from .stats import AGREE, DISAGREE, NOT_MEASURED, WITHIN, at_most

__all__ = [
    "RISE_NATS",
    "critical_dimension",
    "extrapolation_limit",
    "observed_limit",
    "predicted_limits",
    "study_claims",
]

#: a loss this far (nats) above the level at [L/2, L), in two consecutive position bins, is a rise
RISE_NATS = 0.3


def critical_dimension(head_dim: int, base: float, train_length: int) -> int:
    """Liu et al.'s critical dimension ``d_extra = 2 ceil((d/2) log_base(T / 2π))``, at most ``d``.

    >>> critical_dimension(128, 10000, 4096), critical_dimension(32, 20, 128)  # Llama 2: 92 of its 128
    (92, 32)
    """
    pairs = math.ceil((head_dim / 2) * math.log(train_length / (2 * math.pi)) / math.log(base))
    return min(head_dim, 2 * max(pairs, 0))


def extrapolation_limit(head_dim: int, base: float, train_length: int) -> float:
    """``T_extra = 2π base^(d_extra / d)``, the first pair's period past the training length (inf if none).

    Example:
        >>> round(extrapolation_limit(32, 10000, 128), 1), extrapolation_limit(32, 20, 128)
        (198.7, inf)
    """
    d_extra = critical_dimension(head_dim, base, train_length)
    return math.inf if d_extra >= head_dim else 2 * math.pi * base ** (d_extra / head_dim)


def predicted_limits(results: Results) -> dict[str, float]:
    """model -> ``T_extra`` for every model of the base study."""
    c = results.config
    head_dim = c.hidden_size // c.num_heads
    return {m: extrapolation_limit(head_dim, s.rope_base, c.train_length) for m, s in results.specs.items()}


def observed_limit(results: Results, model: str) -> Values | None:
    """Per seed, the start of the first bin at or past ``L/2`` that, with the next, lies more than
    :data:`RISE_NATS` above the mean loss of ``[L/2, L)``; inf when none does.
    """
    L = results.config.train_length
    profile = results.profile(model, "none")
    level = results.bucket(model, "none", L // 2, L)
    if not profile or level is None:
        return None
    out = Values()
    for seed, base in level.items():
        found = math.inf
        bins = [(a, v.get(seed)) for a, _, v in profile if a >= L // 2]
        for (a, x), (_, y) in zip(bins, bins[1:]):
            if x is not None and y is not None and x > base + RISE_NATS and y > base + RISE_NATS:
                found = a
                break
        out[seed] = found
    return out


def _limits_text(values: Values | None) -> str:
    if values is None:
        return "–"
    return " / ".join("none" if not math.isfinite(v) else f"{v:g}" for _, v in sorted(values.items()))


def _liu_limits(r: Results) -> Finding:
    predicted = predicted_limits(r)
    items, parts = [], []
    for model, limit in predicted.items():
        if not math.isfinite(limit):
            continue
        seen = observed_limit(r, model)
        # within a factor sqrt(2) of the prediction, in every seed
        if seen is None:
            outcome = None
        else:
            distance = Values({s: abs(math.log2(v / limit)) if math.isfinite(v) else math.inf for s, v in seen.items()})
            outcome = at_most(distance.stat.map(lambda v: min(v, 1e9)), 0.5)
        items.append((f"base {r.specs[model].rope_base:g}", outcome))
        parts.append(f"base {r.specs[model].rope_base:g}: predicted {limit:.0f}, observed {_limits_text(seen)}")
    return Finding("; ".join(parts) + " (tokens; observed per seed)", tuple(items))


def _liu_small_base(r: Results) -> Finding:
    items, parts = [], []
    for model, limit in predicted_limits(r).items():
        if math.isfinite(limit):
            continue
        seen = observed_limit(r, model)
        outcome = (
            None
            if seen is None
            else (
                AGREE
                if all(not math.isfinite(v) for v in seen.values())
                else DISAGREE
                if all(math.isfinite(v) for v in seen.values())
                else WITHIN
            )
        )
        items.append((f"base {r.specs[model].rope_base:g}", outcome))
        parts.append(
            f"base {r.specs[model].rope_base:g}: rise observed at {_limits_text(seen)}; "
            f"{series(r, model, 'none', 'windows')}"
        )
    if not items:
        return Finding("not measured: no base of this run is small enough", verdict=NOT_MEASURED)
    return Finding("; ".join(parts), tuple(items))


def _roformer(r: Results) -> Finding:
    return Finding(
        "not compared: that table is not in the RoFormer paper and could not be verified; this study measures "
        "the bases itself (above)",
        verdict=NOT_MEASURED,
    )


def _transfer_reaches_scratch(r: Results) -> Finding:
    L = r.config.train_length
    d = r.loss("transfer", "none", L).minus(r.loss("rope", "none", L))
    return Finding(
        f"at L: transferred and fine-tuned {ppl(r, 'transfer', 'none', L, 'windows')}, RoPE from scratch "
        f"{ppl(r, 'rope', 'none', L, 'windows')}, sinusoidal {ppl(r, 'sinusoidal', 'none', L, 'windows')}",
        (("at L", at_most(d.stat, FLAT_NATS)),),
    )


def _transfer_extrapolates(r: Results) -> Finding:
    L = r.config.train_length
    longer = [e for e in r.lengths if e > L]
    items = []
    for e in longer:
        d = r.change("transfer", "none", e, L).minus(r.change("sinusoidal", "none", e, L))
        items.append((f"{e / L:g}L", at_most(d.stat, LOWER_NATS)))
    return Finding(
        f"transferred: {series(r, 'transfer', 'none', 'windows')}; sinusoidal: "
        f"{series(r, 'sinusoidal', 'none', 'windows')}; RoPE: {series(r, 'rope', 'none', 'windows')}",
        tuple(items),
    )


def _transfer_needs_tuning(r: Results) -> Finding:
    L = r.config.train_length
    d = r.loss("transfer-0", "none", L).minus(r.loss("sinusoidal-short", "none", L))
    return Finding(
        f"at L: the sinusoidal model {ppl(r, 'sinusoidal-short', 'none', L, 'windows')}, moved to RoPE "
        f"{ppl(r, 'transfer-0', 'none', L, 'windows')}",
        (("at L", at_most(d.stat.map(lambda v: -v), LOWER_NATS)),),
    )


BASE_CLAIMS: list[Claim] = [
    Claim(
        "liu",
        "The loss rises past the extrapolation bound T_extra = 2π·base^(d_extra/d), the period of the first "
        "dimension pair whose period exceeds the training length (d_extra = 2·ceil((d/2)·log_base(L/2π))).",
        (),
        "RoPE models at bases whose every pair does not complete a period within L",
        f"loss by position on the longest windows: the first position where two consecutive bins lie more than "
        f"{RISE_NATS} nats above the level at [L/2, L), against T_extra; within a factor √2 in every seed agrees",
        _liu_limits,
    ),
    Claim(
        "liu",
        "With a base small enough that every dimension pair completes a period within the training length, no "
        "pair meets an unseen angle past it, and the loss no longer rises past L.",
        (),
        "a RoPE model at such a base (base^((d-2)/d)·2π at most L)",
        f"loss by position on the longest windows: no rise of more than {RISE_NATS} nats up to the longest length, in "
        "every seed, agrees",
        _liu_small_base,
    ),
    Claim(
        "roformer",
        "A table of bases 100 to 100,000 circulates with write-ups of RoFormer as that paper's ablation.",
        (),
        "–",
        "not used: the table is not in the paper and could not be verified",
        _roformer,
        past_L=False,
    ),
]

TRANSFER_CLAIMS: list[Claim] = [
    Claim(
        "question",
        "A sinusoidal model moved to RoPE (every other weight copied) and fine-tuned briefly matches a RoPE "
        "model trained from scratch for the same total steps.",
        (("transfer", "none"), ("rope", "none")),
        "the transferred model fine-tuned, and RoPE from scratch",
        f"non-overlapping windows at L: at most {FLAT:.0%} above RoPE from scratch, seed by seed",
        _transfer_reaches_scratch,
        past_L=False,
    ),
    Claim(
        "question",
        "Without fine-tuning the moved model is worse than the sinusoidal model it came from: its attention "
        "was trained to read positions from the embeddings, which are gone.",
        (("transfer-0", "none"), ("sinusoidal-short", "none")),
        "the sinusoidal model and its copy moved to RoPE",
        f"non-overlapping windows at L: more than {FLAT:.0%} worse, seed by seed",
        _transfer_needs_tuning,
        past_L=False,
    ),
    Claim(
        "question",
        "Once moved and fine-tuned, the model extrapolates like RoPE rather than like sinusoidal: its "
        "perplexity rises less past L.",
        (("transfer", "none"), ("sinusoidal", "none")),
        "the transferred model fine-tuned, and the sinusoidal model",
        f"non-overlapping windows past L: the rise from L smaller than the sinusoidal model's by more than {FLAT:.0%}, "
        "seed by seed",
        _transfer_extrapolates,
    ),
]


def study_claims(config: ExperimentConfig) -> list[Claim]:
    """The claims a run checks: the main comparison's, or a study's."""
    from .claims import CLAIMS, TASK_CLAIMS

    main = CLAIMS + TASK_CLAIMS if config.has_tasks else CLAIMS
    return {None: main, "base": BASE_CLAIMS, "transfer": TRANSFER_CLAIMS}[config.study]


def base_table(r: Results) -> tuple[list[str], list[list[str]]]:
    """Per base: d_extra, T_extra, the observed limit per seed and the perplexity at each length."""
    c = r.config
    head_dim = c.hidden_size // c.num_heads
    L = c.train_length
    header = ["base", "d_extra", "T_extra", "rise observed at"] + [f"ppl {e / L:g}L" for e in r.lengths]
    body = []
    for model, spec in r.specs.items():
        limit = extrapolation_limit(head_dim, spec.rope_base, L)
        body.append(
            [
                f"{spec.rope_base:g}",
                f"{critical_dimension(head_dim, spec.rope_base, L)} of {head_dim}",
                "none (every pair completes a period)"
                if not math.isfinite(limit)
                else f"{limit:.0f} ({limit / L:.2f}L)",
                _limits_text(observed_limit(r, model)),
            ]
            + [ppl(r, model, "none", e, "windows") for e in r.lengths]
        )
    return header, body


def best_at(r: Results, models: Sequence[str], length: int) -> str:
    ranked = sorted((r.perplexity(m, "none", length, "windows").mean, r.label(m)) for m in models if r.has(m))
    return ", ".join(f"{label} {fmt(v)}" for v, label in ranked)
