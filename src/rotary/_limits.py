"""Size limits for what rotary allocates because an argument asked for it: a function whose memory grows with an
argument checks the bytes first, naming the argument, the memory and the largest value that fits.
"""

from __future__ import annotations

from .errors import InputError

__all__ = ["MAX_ANALYSIS_BYTES", "MAX_NUM_HEADS", "MAX_TABLE_BYTES", "check_bytes", "format_bytes"]

#: the most memory one analysis call (score matrices, samples of rotated vectors, PCA features)
#: may ask for: far more than any figure or report needs, far less than a machine has
MAX_ANALYSIS_BYTES = 2**32

#: the most memory one cached pair of cos/sin tables (one device and dtype) may take: 4 GiB holds the
#: fp32 tables of 4M positions at rotary_dim 128; positions past a cache are computed per call
MAX_TABLE_BYTES = 2**32

#: the most attention heads accepted where heads are counted (real models use 1 to 128)
MAX_NUM_HEADS = 2**16


def format_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps it >= 1.

    Example:
        >>> format_bytes(3 * 2**30), format_bytes(8 * 10**12), format_bytes(100)
        ('3.0 GiB', '7.3 TiB', '100 B')
    """
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            break
    return f"{n:.1f} {unit}"


def check_bytes(nbytes: float, what: str, fix: str, *, limit: int = MAX_ANALYSIS_BYTES) -> None:
    """Raise an InputError when ``what`` (the call and argument) would need over ``limit`` bytes; ``fix``: what to do.

    Example:
        >>> check_bytes(2**40, "score_matrix(seq_len=370727)", "use seq_len <= 16384")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rotary.errors.InputError: score_matrix(seq_len=370727) would need 1.0 TiB, more than the limit of 4.0 GiB; ...
    """
    if nbytes > limit:
        raise InputError(
            f"{what} would need {format_bytes(nbytes)}, more than the limit of {format_bytes(limit)}; {fix}"
        )
