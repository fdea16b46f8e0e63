"""What a run may claim: whether its models learned enough for the papers' verdicts, and whether it is a smoke test.

Every verdict of a run is withheld when its models have not learned enough: perplexity above 16 per byte at L
(4 bits per byte), near a byte-frequency model, where position encodings cannot show (docs/experiment.md,
"Verdicts withheld").
"""

from __future__ import annotations

from .results import Results

__all__ = ["LEARNED_PERPLEXITY", "SMOKE_TEST_PRESETS", "caveats", "not_learned"]

#: the highest perplexity per byte at L (non-overlapping windows, mean over seeds) of a model that counts
#: as having learned enough to judge (see the module's docstring)
LEARNED_PERPLEXITY = 16.0

#: presets that check that every code path runs, too small to learn from
SMOKE_TEST_PRESETS = ("tiny",)


def not_learned(results: Results) -> list[tuple[str, float]]:
    """``(label, perplexity at L)`` of every model trained at L above :data:`LEARNED_PERPLEXITY` (or not finite)."""
    L = results.config.train_length
    weak = []
    for m in results.methods():
        if m.scaling != "none" or m.stage != "pretrain":
            continue
        stat = results.perplexity(m.model, "none", L, "windows")
        if stat is not None and not (stat.finite and stat.mean <= LEARNED_PERPLEXITY):
            weak.append((m.label, stat.mean))
    return weak


def caveats(results: Results) -> list[str]:
    """Sentences a report must say before its findings (a smoke-test preset; verdicts withheld); empty otherwise."""
    out = []
    if results.config.preset in SMOKE_TEST_PRESETS:
        out.append(
            f"Smoke test: the {results.config.preset} preset checks in seconds that every part of the experiment runs; "
            "its models are far too small and too briefly trained to say anything about the methods."
        )
    weak = not_learned(results)
    if weak:
        shown = ", ".join(f"{label} {value:.3g}" for label, value in weak[:6]) + (" ..." if len(weak) > 6 else "")
        out.append(
            f"Not learned enough to judge: perplexity per byte at L above {LEARNED_PERPLEXITY:g} ({shown}; uniform "
            "guessing is 256, the byte frequencies alone about 23 to 32), so the comparison with the papers is "
            "withheld: its verdicts would read noise as findings."
        )
    return out
