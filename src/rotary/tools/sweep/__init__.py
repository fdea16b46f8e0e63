"""``rotary sweep`` and ``rotary export``: how far a pretrained causal LM's context stretches under each RoPE
scaling, and the experiment's models as transformers checkpoints.

:mod:`.checkpoint` (a config edited per scaling, the model transformers builds, its tables checked),
:mod:`.measure` (perplexity, passkey), :mod:`.data` (the documents), :mod:`.run` (the sweep, resumable, and its
report), :mod:`.export`. The protocol, the traps and the published tables it compares with: docs/sweep.md.
"""

from __future__ import annotations

from .run import SweepSettings, run_sweep

__all__ = ["SweepSettings", "run_sweep"]
