"""Slow, obviously correct forms of RoPE in float64, sharing no code with the fast path: test oracles and teaching code.

The 1-D forms take ``x`` ``[..., S, D]``, ``position_ids`` ``[S]`` and ``inv_freq`` ``[r/2]``; the first
``r = 2 * len(inv_freq)`` channels rotate. The N-D forms take coordinates ``[S, A]`` and one frequency row per axis
``[A, r/2]`` (per head ``[H, A, r/2]``) and build the product of one block-diagonal matrix per axis.
"""

from __future__ import annotations

import numpy as np
import torch

from .errors import InputError

__all__ = [
    "rotation_matrix",
    "rotate_matrix",
    "rotate_complex",
    "rotate_numpy",
    "rotation_matrix_nd",
    "rotate_matrix_nd",
]


def _pairs(r: int, interleaved: bool) -> list[tuple[int, int]]:
    """Channel indices (a, b) of each pair i, in the order of inv_freq."""
    if interleaved:
        return [(2 * i, 2 * i + 1) for i in range(r // 2)]
    return [(i, i + r // 2) for i in range(r // 2)]


def rotation_matrix(
    position: float, inv_freq: torch.Tensor, head_dim: int, *, interleaved: bool = False
) -> torch.Tensor:
    """The paper's block-diagonal matrix R_m (float64 ``[D, D]``), so that ``f(x, m) = R_m @ x``.

    Example:
        >>> R = rotation_matrix(1, torch.tensor([1.0]), 2)
        >>> torch.allclose(R @ R.T, torch.eye(2, dtype=torch.float64))
        True
    """
    r = 2 * inv_freq.numel()
    R = torch.eye(head_dim, dtype=torch.float64)
    for i, (a, b) in enumerate(_pairs(r, interleaved)):
        theta = float(position) * float(inv_freq[i])
        c, s = np.cos(theta), np.sin(theta)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def rotate_matrix(
    x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor, *, interleaved: bool = False
) -> torch.Tensor:
    """Apply R_m to each position's vector by explicit matrix products; float64 ``[..., S, D]``."""
    x = x.double()
    out = torch.empty_like(x)
    for s, m in enumerate(position_ids.tolist()):
        out[..., s, :] = x[..., s, :] @ rotation_matrix(m, inv_freq, x.shape[-1], interleaved=interleaved).T
    return out


def rotate_complex(
    x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor, *, interleaved: bool = False
) -> torch.Tensor:
    """Meta LLaMA's form: pairs as complex numbers times ``e^{i m θ}``; float64 ``[..., S, D]``."""
    x = x.double()
    r = 2 * inv_freq.numel()
    rot, rest = x[..., :r], x[..., r:]
    if not interleaved:  # gather pairs (i, i + r/2) next to each other for view_as_complex
        rot = torch.stack((rot[..., : r // 2], rot[..., r // 2 :]), dim=-1).flatten(-2)
    angles = position_ids.double()[:, None] * inv_freq.double()[None, :]
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # [S, r/2]
    z = torch.view_as_complex(rot.reshape(*rot.shape[:-1], r // 2, 2).contiguous())
    out = torch.view_as_real(z * freqs_cis).flatten(-2)
    if not interleaved:
        out = torch.cat((out[..., 0::2], out[..., 1::2]), dim=-1)
    return torch.cat((out, rest), dim=-1)


def rotate_numpy(
    x: np.ndarray, position_ids: np.ndarray, inv_freq: np.ndarray, *, interleaved: bool = False
) -> np.ndarray:
    """Pure NumPy, pair by pair: (a, b) -> (a cos mθ - b sin mθ, a sin mθ + b cos mθ); float64."""
    x = np.asarray(x, dtype=np.float64)
    inv_freq = np.asarray(inv_freq, dtype=np.float64)
    positions = np.asarray(position_ids, dtype=np.float64)
    out = x.copy()
    for i, (a, b) in enumerate(_pairs(2 * inv_freq.size, interleaved)):
        theta = positions * inv_freq[i]  # [S]
        c, s = np.cos(theta)[:, None], np.sin(theta)[:, None]
        xa, xb = x[..., a : a + 1], x[..., b : b + 1]
        out[..., a : a + 1] = xa * c - xb * s
        out[..., b : b + 1] = xa * s + xb * c
    return out


def rotation_matrix_nd(
    coordinates: torch.Tensor, inv_freq: torch.Tensor, head_dim: int, *, interleaved: bool = False
) -> torch.Tensor:
    """The N-D rotation ``R(c) = R_0(c_0) R_1(c_1) … R_{A-1}(c_{A-1})`` (float64 ``[D, D]``) of coordinates ``[A]``.

    Example:
        >>> f = torch.tensor([[1.0, 0.0], [0.0, 0.5]])  # pair 0 turns with axis 0, pair 1 with axis 1
        >>> R = rotation_matrix_nd(torch.tensor([2.0, 3.0]), f, 4, interleaved=True)
        >>> torch.allclose(R, rotation_matrix(2.0, torch.tensor([1.0, 0.0]), 4, interleaved=True)
        ...                   @ rotation_matrix(3.0, torch.tensor([0.0, 0.5]), 4, interleaved=True))
        True
    """
    coords = [float(c) for c in torch.as_tensor(coordinates).reshape(-1).tolist()]
    if len(coords) != inv_freq.shape[0]:
        raise InputError(f"{len(coords)} coordinates for {inv_freq.shape[0]} frequency rows")
    R = torch.eye(head_dim, dtype=torch.float64)
    for c, row in zip(coords, inv_freq):
        R = R @ rotation_matrix(c, row, head_dim, interleaved=interleaved)
    return R


def rotate_matrix_nd(
    x: torch.Tensor, coordinates: torch.Tensor, inv_freq: torch.Tensor, *, interleaved: bool = False
) -> torch.Tensor:
    """Apply ``R(c)`` to each token of ``x`` ``[..., S, D]`` (per head ``[..., H, S, D]``) at ``[S, A]``: float64."""
    x = x.double()
    out = torch.empty_like(x)
    per_head = inv_freq.dim() == 3
    for s, c in enumerate(coordinates):
        if per_head:
            for h in range(inv_freq.shape[0]):
                R = rotation_matrix_nd(c, inv_freq[h], x.shape[-1], interleaved=interleaved)
                out[..., h, s, :] = x[..., h, s, :] @ R.T
        else:
            out[..., s, :] = x[..., s, :] @ rotation_matrix_nd(c, inv_freq, x.shape[-1], interleaved=interleaved).T
    return out
