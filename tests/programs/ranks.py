"""A rank of a real torch.distributed job (gloo, CPU) that records with stepwatch, for the distributed tests."""

import os

import torch
import torch.distributed as dist

import stepwatch


def record_and_save(rank, world, init_file, out):
    """Started by torch.multiprocessing.spawn: no RANK in the environment, only the process group knows."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        sw = stepwatch.Stopwatch()
        sw.enable()
        for _ in sw.timed_iter(range(4)):
            with sw.timed("forward"):
                torch.ones(8).sum()
            dist.barrier()
        sw.save(out)
    finally:
        dist.destroy_process_group()
