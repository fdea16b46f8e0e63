"""``rotary experiment`` as one torchrun process, watched: what it trained on and what it wrote.

Launched by ``test_train.py`` as ``torchrun --nproc_per_node=4 torchrun_probe.py experiment ...``
(not collected by pytest: the name does not start with ``test_``). Each process

- works in its own directory ``rank<RANK>`` under the current one, so that a relative ``--out``, the
  default ``runs/experiment-<UTC time>`` or any other relative path lands in its own directory;
- records the sha256 of the rows it trains on at every step (its shard of the global batch), in
  training order: every step of the first model, then of the next;
- records every file or directory it opens for writing, creates, renames or removes under
  ``$PROBE_ROOT`` (Python's audit events, installed after the imports);

and at exit, whatever the status, writes ``{"rank": ..., "status": ..., "shards": [...], "writes": [...]}``
to ``$PROBE_ROOT/probe-rank<RANK>.json`` (after the record is made, so it is not among the writes).
A file, not a line on the shared stdout: there, under load, rank 1's line once went missing among
rank 0's output.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import rotary.tools.experiments.train as train
from rotary.tools.cli import main

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
root = ""  # $PROBE_ROOT, resolved
shards: list[str] = []
writes: list[str] = []
original_shard = train.shard


def recording_shard(batch, dist):
    rows = original_shard(batch, dist)
    shards.append(hashlib.sha256(rows.contiguous().numpy().tobytes()).hexdigest())
    return rows


def _inside(path) -> str | None:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)):
        return None  # a file descriptor
    full = os.path.realpath(os.path.abspath(os.fspath(path)))
    return full if full == root or full.startswith(root + os.sep) else None


def audit(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
        where = _inside(path) if writing else None
    elif event in ("os.rename", "os.link", "os.symlink", "shutil.copyfile"):
        where = _inside(args[1])  # the destination
    elif event in ("os.mkdir", "os.remove", "os.rmdir", "os.truncate", "os.chmod", "os.utime"):
        where = _inside(args[0])
    else:
        return
    if where is not None:
        writes.append(f"{event} {os.path.relpath(where, root)}")


def probe(argv: list[str]) -> int:
    global root
    rank = int(os.environ["RANK"])
    root = os.path.realpath(os.environ["PROBE_ROOT"])
    os.makedirs(f"rank{rank}", exist_ok=True)
    os.chdir(f"rank{rank}")
    train.shard = recording_shard
    sys.addaudithook(audit)  # cannot be removed: this process ends with the run
    status = 1
    try:
        status = main(argv)
    finally:
        record = json.dumps({"rank": rank, "status": status, "shards": shards, "writes": writes})
        with open(os.path.join(root, f"probe-rank{rank}.json"), "w") as out:
            out.write(record)
    return status


if __name__ == "__main__":  # pytest imports this file for its doctests: only torchrun runs it
    sys.exit(probe(sys.argv[1:]))
