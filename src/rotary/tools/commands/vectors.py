"""The q/k content vectors ``rotary plot scores --q/--k`` reads: a .npy or .pt file holding a ``[head_dim]``
vector of finite real numbers, loaded without unpickling anything (a file is data, never code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ...errors import InputError

__all__ = ["load_vector"]


#: how to write a q/k vector file rotary reads, for the errors about one it cannot
_SAVE_VECTOR = (
    "np.save(path, np.asarray(v, dtype=np.float32)) or torch.save(torch.as_tensor(v, dtype=torch.float32), path)"
)


def _npy_header(path: str) -> tuple[tuple[int, ...], Any]:
    """``(shape, dtype)`` from a .npy file's header, read without loading (or unpickling) the data."""
    import numpy as np

    try:
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(fh)
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy's reader raises ValueError, EOFError, SyntaxError, ... on junk
        raise InputError(f"{path} is not a NumPy .npy file ({exc}); write q/k with {_SAVE_VECTOR}") from None
    return tuple(shape), dtype


_INTEGER_DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
)


def _real(dtype: torch.dtype) -> bool:
    """A real-number dtype: floating point or integer (not bool, complex, quantized)."""
    return dtype.is_floating_point or dtype in _INTEGER_DTYPES


def load_vector(path: str, head_dim: int) -> torch.Tensor:
    """A q/k content vector from a .npy or .pt file: real numbers, finite, shape ``[head_dim]``; float64."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if p.suffix == ".npy":
        import numpy as np

        shape, dtype = _npy_header(path)
        if dtype.hasobject:
            raise InputError(
                f"{path} holds an array of Python objects (dtype={dtype}), which rotary does not load (unpickling can "
                f"run code); write q/k as numbers with {_SAVE_VECTOR}"
            )
        if dtype.kind not in "iuf":
            raise InputError(
                f"{path} holds {dtype} values (numpy kind {dtype.kind!r}); q/k must be real numbers (int or float): "
                f"write them with {_SAVE_VECTOR}"
            )
        if shape != (head_dim,):
            raise InputError(f"{path} holds shape {shape}; expected a [{head_dim}] vector (head_dim)")
        try:
            data = np.load(p, allow_pickle=False)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 - a header that promises more data than the file holds, ...
            raise InputError(
                f"{path} is not a readable NumPy .npy file ({exc}); write q/k with {_SAVE_VECTOR}"
            ) from None
        # float64 in native byte order whatever the file's (big-endian, Fortran order, float16 ...)
        v = torch.from_numpy(np.asarray(data, dtype=np.float64))
    elif p.suffix == ".pt":
        try:
            v = torch.load(p, weights_only=True)
        except OSError:
            raise
        except Exception as exc:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, struct.error, ... on junk
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(
                f"{path} cannot be read by torch.load(weights_only=True) ({message}); write q/k with {_SAVE_VECTOR}"
            ) from None
    else:
        raise InputError(f"{path}: q/k files must be .npy or .pt holding a [{head_dim}] vector")
    if not isinstance(v, torch.Tensor) or v.shape != (head_dim,):
        shape = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
        raise InputError(f"{path} holds shape {shape}; expected a [{head_dim}] vector (head_dim)")
    if v.layout != torch.strided:
        raise InputError(f"{path} holds a {v.layout} tensor; save a dense one (t.to_dense()): {_SAVE_VECTOR}")
    if not _real(v.dtype):
        raise InputError(
            f"{path} holds {v.dtype} values; q/k must be real numbers (int or float): write them with {_SAVE_VECTOR}"
        )
    v = v.detach().double()  # a saved Parameter requires grad
    bad = (~torch.isfinite(v)).nonzero().flatten().tolist()
    if bad:
        shown = ", ".join(f"[{i}]={v[i].item()}" for i in bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise InputError(f"{path} holds {len(bad)} non-finite value(s) ({shown}); q/k must be finite numbers")
    return v
