"""Old path of :mod:`rotary.hf_config` (reading Hugging Face configs): importing ``rotary.config`` gives
that module itself, so ``from rotary.config import read_hf_config`` and patches of its names keep working.
(The experiment's settings are :mod:`rotary.tools.experiments.config`.)"""

import sys

from . import hf_config as _hf_config

sys.modules[__name__] = _hf_config
