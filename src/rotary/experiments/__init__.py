"""Train short, test long: position encodings and RoPE scalings compared past the training length.

``rotary experiment`` (and :func:`run_experiment`) trains one small :class:`rotary.models.Decoder`
per position encoding at length L on byte-level text and evaluates each at L, 2L, 4L, 8L: perplexity,
bits per byte, loss by position bucket and passkey retrieval, with the RoPE model also under the
inference-time scalings. Modules: :mod:`.config` (settings, presets), :mod:`.data` (text, batches),
:mod:`.passkey`, :mod:`.train` (DDP, checkpoints), :mod:`.evaluate`, :mod:`.report`, :mod:`.run`.
"""

from .config import PRESETS, SCALINGS, ExperimentConfig, ExperimentError, default_encodings
from .run import run_experiment

__all__ = ["PRESETS", "SCALINGS", "ExperimentConfig", "ExperimentError", "default_encodings", "run_experiment"]
