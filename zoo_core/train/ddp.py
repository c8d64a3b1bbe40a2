"""Distributed data parallel under ``torchrun``: process group, device, and the global-batch split.

``torchrun --nproc_per_node N zoo train spec.yaml`` sets RANK / WORLD_SIZE / LOCAL_RANK; then every
rank builds the same model (same seed), wraps it in DistributedDataParallel, and takes its share of
each global batch (``shard``). Each rank scales its summed loss by world / global batch, so DDP's
gradient average equals the gradient of the global batch's mean loss: the run matches a single
process with the same global batch, up to float rounding (BatchNorm excepted: its batch statistics
are per rank, as in any DDP run). Backend: nccl on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t


def pick_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device(f"cuda:{local_rank}")
    return device


def init_distributed(device: str = "auto") -> DistContext:
    """A DistContext for this process; starts the process group when launched by torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    if world <= 1:
        return DistContext(device=dev)
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistContext(rank=dist.get_rank(), world=dist.get_world_size(), device=dev)


def shard(batch: torch.Tensor, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's indices of a global batch and their loss weights (1, or 0 for a stand-in).

    Rank r takes positions r, r + world, r + 2·world, ... (DistributedSampler's interleaving), so
    the ranks together hold the whole batch. A rank left without a sample (a last batch smaller
    than the world) gets the batch's first sample with weight 0, so every rank still runs the
    same collective operations.
    """
    mine = batch[rank::world]
    if len(mine) == 0:
        return batch[:1], torch.zeros(1)
    return mine, torch.ones(len(mine))
