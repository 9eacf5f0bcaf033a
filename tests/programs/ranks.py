"""A rank of a real torch.distributed job (gloo, CPU) that records with stepwatch, for the distributed tests."""

import os
import time

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


class Busy(torch.utils.data.Dataset):
    def __init__(self, busy_s):
        self.busy_s = busy_s

    def __len__(self):
        return 48

    def __getitem__(self, index):
        spin(self.busy_s)
        return torch.randn(8, generator=torch.Generator().manual_seed(index)), index % 2


def spin(seconds):
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def ddp_train(rank, world, init_file, out, busy_s, slow_forward_rank):
    """A real DistributedDataParallel loop: backward's all-reduce makes every rank wait for the slowest."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(Busy(busy_s[rank]), batch_size=4)
        sw = stepwatch.Stopwatch()
        sw.enable()
        for x, y in sw.watch(loader):
            with sw.timed("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if rank == slow_forward_rank:
                    spin(0.006)
            with sw.timed("backward"):
                loss.backward()
            with sw.timed("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            sw.count(samples=len(y))
        sw.save(out)
    finally:
        dist.destroy_process_group()
