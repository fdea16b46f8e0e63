"""``rotary sweep`` and ``rotary export``: how far a pretrained causal LM's context stretches under each RoPE
scaling, and the experiment's models as transformers checkpoints.

- :mod:`.checkpoint`: a checkpoint's config and RoPE, the config edited per scaling, the model transformers
  builds from it, its tables checked against rotary's;
- :mod:`.measure`: perplexity in two modes (chunked loss, per-document bootstrap) and passkey retrieval;
- :mod:`.data`: the documents (``--data`` or a built-in offline text);
- :mod:`.run`: the sweep itself, streamed to ``--out``, resumable, and its report;
- :mod:`.export`: a ``rotary experiment`` model as a Llama-layout transformers checkpoint.

The protocol, the traps and the published tables it compares with: docs/sweep.md.
"""

from __future__ import annotations

from .run import SweepSettings, run_sweep

__all__ = ["SweepSettings", "run_sweep"]
