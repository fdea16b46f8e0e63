"""Which devices' values rotary reads on the host to check them: the one place that decides it (the tests replace
:func:`host_checks` to run the accelerator paths on the CPU).
"""

from __future__ import annotations

import torch

__all__ = ["host_checks"]


def host_checks(device: torch.device) -> bool:
    """Whether checks of values on ``device`` read them on the host: ``True`` on the CPU only (elsewhere a read would
    synchronise; see :mod:`rotary.errors`).

    Example:
        >>> host_checks(torch.device("cpu")), host_checks(torch.device("meta"))
        (True, False)
    """
    return device.type == "cpu"
