"""Host constants on the device they are used on, copied once per device instead of once per call.

A host constant (frequencies, xPos's ``ζ``) combined with device tensors would be copied on every call: a
blocking copy a CUDA graph cannot capture. :class:`DeviceCopies` keeps one copy per device, made on first use
and renewed when the host tensor is replaced or edited.
"""

from __future__ import annotations

import torch

__all__ = ["DeviceCopies", "version_of"]


def version_of(t: torch.Tensor) -> int | None:
    """``t``'s version counter (in-place edits move it), or ``None`` for an inference tensor, which has none."""
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter (and cannot be edited outside inference mode)
        return None


class DeviceCopies:
    """Per-device copies of named host tensors, made once and reused (detached: constants, not parameters).

    Example:
        >>> copies = DeviceCopies()
        >>> freq = torch.tensor([1.0, 0.5])
        >>> a = copies.on("freq", freq, torch.device("meta"))
        >>> a is copies.on("freq", freq, torch.device("meta")), a.device
        (True, device(type='meta'))
        >>> copies.on("freq", freq, torch.device("cpu")) is freq  # already there: no copy
        True
    """

    def __init__(self) -> None:
        self._copies: dict[tuple[str, torch.device], tuple[torch.Tensor, int | None, torch.Tensor]] = {}

    def on(self, name: str, host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """``host`` on ``device`` (read only): itself there, else the kept copy (not kept under ``torch.compile``)."""
        device = torch.device(device)
        if host.device == device:
            return host
        key = (name, device)
        found = self._copies.get(key)
        if torch.compiler.is_compiling():  # version counters are not traceable: the object decides
            return found[2] if found is not None and found[0] is host else host.detach().to(device)
        if found is not None and found[0] is host and found[1] == version_of(host):
            return found[2]
        with torch.inference_mode(False), torch.no_grad():  # usable outside inference mode later
            copy = host.detach().to(device)
        self._copies[key] = (host, version_of(host), copy)
        return copy

    def __len__(self) -> int:
        return len(self._copies)
