"""Train short, test long: position encodings and RoPE scalings compared past the training length.

``rotary experiment`` (:func:`run_experiment`) trains small Decoders per position encoding at length L on
byte-level text, ``--seeds`` times each, and evaluates them at L, 2L, 4L, 8L; the RoPE model also under
inference-time scalings, fine-tuned longer with each, and trained from scratch there. ``--study base`` and
``--study transfer`` are the studies beside it. The data flow: :mod:`.config` -> :mod:`.sources`, :mod:`.data`
-> :mod:`.plan` -> :mod:`.train` -> :mod:`.evaluate` -> :mod:`.rows` -> :mod:`.results` -> :mod:`.claims`,
:mod:`.studies` -> :mod:`.figures`, :mod:`.report` -> :mod:`.run`.
"""

from .config import PRESETS, SCALINGS, ExperimentConfig, ExperimentError, default_encodings
from .run import run_experiment

__all__ = ["PRESETS", "SCALINGS", "ExperimentConfig", "ExperimentError", "default_encodings", "run_experiment"]
