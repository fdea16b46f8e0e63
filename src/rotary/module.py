"""Old path of :mod:`rotary.rope` (``RoPE``): importing ``rotary.module`` gives that module itself, so
``from rotary.module import RoPE`` and patches of its names keep working."""

import sys

from . import rope as _rope

sys.modules[__name__] = _rope
