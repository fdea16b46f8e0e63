"""Run under ``torchrun --nproc_per_node=4`` by ``test_train.py``: a few DDP steps, then rank 0 stays
busy for a while (as when it evaluates and writes the report) while the other ranks have nothing left
to do. All leave the process group through :meth:`Distributed.stop` on the training device; the ranks
that leave first must exit cleanly although rank 0 is still at work.

``TEARDOWN_RAW=1`` keeps the DDP wrapper alive and calls ``destroy_process_group`` directly instead
(what the experiment did before). A rank that leaves first then aborts in some runs with "terminate
called without an active exception" (2 of 8 two-rank runs, then 0 of 6, on the 2-core development
machine); the experiment's own torchrun test failed this way in CI.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from rotary.tools.experiments.distributed import Distributed


def main() -> None:
    raw = os.environ.get("TEARDOWN_RAW") == "1"
    dist = Distributed.from_env()
    dist.start("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    wrapped = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(4):
        wrapped(torch.randn(8, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.mean(torch.ones(1))
    if dist.is_main:
        time.sleep(1.5)  # rank 0 still at work
    if raw:
        torch.distributed.destroy_process_group()
    else:
        del wrapped
        dist.stop(sync=dist.device("cpu"))
    if dist.is_main:
        time.sleep(0.5)
    os.write(1, f"rank {dist.rank} left the group\n".encode())  # one write: four ranks share the pipe


if __name__ == "__main__":  # pytest imports this file for its doctests: only torchrun runs it
    main()
