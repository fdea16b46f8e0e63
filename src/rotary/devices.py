"""Which devices' values rotary reads on the host to check them: the one place that decides it.

Every check of a value that lives in a tensor asks :func:`host_checks` first. The tests run the
accelerator paths on the CPU by replacing it (``tests/helpers.accelerator_rules``), so this is a module
of its own with a public name.
"""

from __future__ import annotations

import torch

__all__ = ["host_checks"]


def host_checks(device: torch.device) -> bool:
    """Whether checks of values on ``device`` read them on the host: ``True`` on the CPU, ``False`` elsewhere.

    Elsewhere a read would synchronise the device and break CUDA-graph capture; what that means for each value:
    :mod:`rotary.errors`.

    Example:
        >>> host_checks(torch.device("cpu")), host_checks(torch.device("meta"))
        (True, False)
    """
    return device.type == "cpu"
