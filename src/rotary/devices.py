"""Which devices' values rotary reads on the host to check them: the one place that decides it.

Every check of a value that lives in a tensor asks :func:`host_checks` first. The tests run the
accelerator paths on the CPU by replacing it (``tests/helpers.accelerator_rules``), so this is a module
of its own with a public name.
"""

from __future__ import annotations

import torch

__all__ = ["host_checks"]


def host_checks(device: torch.device) -> bool:
    """Whether checks of values on ``device`` read them on the host: the CPU, where a read is free and a
    bad value raises a named error at once. Elsewhere (accelerators, the meta device) nothing is read: a
    read would synchronise the device and could not be captured in a CUDA graph; there a value that only
    the device holds is valid by construction, refused by a device-side assertion of the op that reads it
    (as PyTorch's own indexing kernels do), or the caller's contract stated in the docstring.

    Args:
        device: the device the values live on.

    Returns:
        ``True`` on the CPU, ``False`` elsewhere.

    Example:
        >>> host_checks(torch.device("cpu")), host_checks(torch.device("meta"))
        (True, False)
    """
    return device.type == "cpu"
