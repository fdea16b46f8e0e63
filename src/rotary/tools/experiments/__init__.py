"""Train short, test long: position encodings and RoPE scalings compared past the training length.

``rotary experiment`` (and :func:`run_experiment`) trains small :class:`rotary.models.Decoder` models
per position encoding at length L on byte-level text, ``--seeds`` times each, and evaluates them at L,
2L, 4L, 8L: perplexity in non-overlapping and sliding windows, loss by position, a retrieval probe and
passkey retrieval; the RoPE model also under inference-time scalings, fine-tuned at a longer length
with each scaling, and trained from scratch there. ``--study base`` and ``--study transfer`` are the
two studies beside it.

Modules, in the order of the data flow: :mod:`.config` (settings, presets) -> :mod:`.sources` and
:mod:`.data` (text, batches) -> :mod:`.plan` (which models) -> :mod:`.train` (DDP, checkpoints) ->
:mod:`.evaluate` (with :mod:`.passkey` and :mod:`.retrieval`) -> :mod:`.rows` (typed rows, CSV) ->
:mod:`.results` (lookup over seeds, :mod:`.stats`) -> :mod:`.claims` and :mod:`.studies` (paper
claims, verdicts) -> :mod:`.figures` and :mod:`.report` (prose) -> :mod:`.run` (the command).
"""

from .config import PRESETS, SCALINGS, ExperimentConfig, ExperimentError, default_encodings
from .run import run_experiment

__all__ = ["PRESETS", "SCALINGS", "ExperimentConfig", "ExperimentError", "default_encodings", "run_experiment"]
