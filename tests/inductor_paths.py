"""One path to torch's headers and libraries for every checkout's tests, so that Inductor's compiled C++
kernels are shared between checkouts (imported by ``conftest.py``, and first by the test scripts that
compile in a process of their own).

Inductor caches each C++ kernel under a key that holds the compiler's command line, and that holds torch's
include and library directories, inside the checkout's ``.venv``: a fresh clone compiled every kernel
again (about a minute of ``make test`` on 2 cores) although the FX graphs hit the cache. Here torch's
directory is reached through one link per torch build (version and commit), beside rotary's kernel builds
(``$ROTARY_CACHE_DIR``, else ``~/.cache/rotary``), pointed at this process's torch: every checkout with
that build compiles with the same command line, against the same headers, and finds the kernels another
compiled. Where no link can be made, or torch is laid out otherwise, nothing changes.

It imports torch and nothing of rotary (a script may patch rotary before it imports it).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def one_torch_path_for_every_checkout() -> None:
    try:
        from torch.utils import cpp_extension

        real = os.path.dirname(torch.__file__)
        if cpp_extension._TORCH_PATH != real or cpp_extension.TORCH_LIB_PATH != os.path.join(real, "lib"):
            return  # another torch layout, or done already in this process
        # rotary.kernels.extension._cache_dir's rule, not imported: that would import rotary
        root = os.environ.get("ROTARY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "rotary")
        link = Path(root) / f"torch-{torch.__version__}-{(torch.version.git_version or 'unknown')[:12]}"
        if os.path.realpath(link) != os.path.realpath(real):
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f"{link.name}.{os.getpid()}")
            tmp.unlink(missing_ok=True)
            os.symlink(real, tmp)
            os.replace(tmp, link)  # atomic: processes re-pointing it at once all leave a valid link
    except (OSError, ImportError, AttributeError):
        return
    cpp_extension._TORCH_PATH = str(link)
    cpp_extension.TORCH_LIB_PATH = str(link / "lib")
