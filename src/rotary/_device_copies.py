"""Host constants on the device they are used on, copied once per device instead of once per call.

A module that keeps a constant on the host (frequencies, xPos's ``ζ``, an M-RoPE frequency matrix)
and combines it with device tensors would copy it host-to-device on every call: a blocking copy
(``memcpy`` and a stream synchronisation on CUDA) that a CUDA graph cannot capture either.
:class:`DeviceCopies` keeps one copy per device, made on first use (e.g. a warm-up call before a
capture) and reused for as long as the host tensor is the same object with the same version
(reassigning the attribute or editing it in place makes a fresh copy).
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
        """``host`` on ``device`` (do not modify it): ``host`` itself there, else the copy for ``(name, device)``.

        The copy is made again when ``host`` was replaced or edited; under ``torch.compile`` a missing copy is made in
        the graph and not kept.
        """
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
