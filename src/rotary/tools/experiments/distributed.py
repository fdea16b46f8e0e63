"""This process's place under torchrun, and the collectives of a run: every ``torch.distributed`` call of
the experiment goes through :class:`Distributed`, which takes the training device (NCCL reduces CUDA
tensors only). One process alone is rank 0 of 1, and every method is then a no-op or the identity.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch

from .config import ExperimentError

__all__ = ["Distributed", "shard"]


@dataclass(frozen=True)
class Distributed:
    """This process's place under torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); 0 / 1 / 0 alone."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> Distributed:
        """Read torchrun's environment variables."""
        try:
            return cls(
                int(os.environ.get("RANK", 0)),
                int(os.environ.get("WORLD_SIZE", 1)),
                int(os.environ.get("LOCAL_RANK", 0)),
            )
        except ValueError:
            raise ExperimentError(
                f"RANK / WORLD_SIZE / LOCAL_RANK must be integers (torchrun sets them), got "
                f"{os.environ.get('RANK')!r} / {os.environ.get('WORLD_SIZE')!r} / {os.environ.get('LOCAL_RANK')!r}"
            ) from None

    def device(self, kind: str) -> torch.device:
        """The training device of this process: ``cuda:LOCAL_RANK`` for ``kind == "cuda"``, else the CPU.

        >>> Distributed(rank=1, world_size=2, local_rank=1).device("cuda"), Distributed().device("cpu")
        (device(type='cuda', index=1), device(type='cpu'))
        """
        return torch.device("cuda", self.local_rank) if kind == "cuda" else torch.device("cpu")

    def start(self, device: str) -> None:
        """Join the process group (gloo on CPU; nccl and gloo on CUDA); nothing to do for one process."""
        if self.world_size > 1 and not torch.distributed.is_initialized():
            if device == "cuda":
                torch.cuda.set_device(self.local_rank)
            torch.distributed.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo")

    def agree(self, ok: bool, device: torch.device) -> bool:
        """True when ``ok`` holds on every rank (one all-reduce MIN on the training ``device``)."""
        if self.world_size == 1 or not torch.distributed.is_initialized():
            return ok
        flag = torch.tensor([int(ok)], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item())

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the ranks, for the logged loss (DDP averages the gradients itself)."""
        if self.world_size == 1 or not torch.distributed.is_initialized():
            return value
        total = value.detach().clone()
        torch.distributed.all_reduce(total)
        return total / self.world_size

    def stop(self, sync: torch.device | None = None) -> None:
        """Leave the process group (idempotent), after a barrier on ``sync`` when given: a rank must not reach
        interpreter shutdown while gloo's threads still release its last collective's tensors.
        """
        if self.world_size > 1 and torch.distributed.is_initialized():
            gc.collect()  # a DDP wrapper kept alive by a reference cycle still holds the group
            if sync is not None:
                torch.distributed.barrier(device_ids=[sync.index] if sync.type == "cuda" else None)
            torch.distributed.destroy_process_group()


def shard(batch: torch.Tensor, dist: Distributed) -> torch.Tensor:
    """This rank's rows of a global batch: ``[B, T] -> [B / world_size, T]``, contiguous, rank 0 first.

    Example:
        >>> batch = torch.arange(8).view(4, 2)
        >>> shard(batch, Distributed(rank=1, world_size=2)).tolist()
        [[4, 5], [6, 7]]
    """
    rows = batch.shape[0] // dist.world_size
    return batch[dist.rank * rows : (dist.rank + 1) * rows]
