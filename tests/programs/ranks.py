"""A rank of a real torch.distributed job (gloo, CPU) that records with stepwatch, for the distributed tests."""

import json
import os
import time

import torch
import torch.distributed as dist
from busy import busy_wait

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
    """Each read takes ``busy_s``: busy-waited (CPU work), or slept (a read that waits, taking no core: ranks
    beyond the machine's cores then do not slow each other down)."""

    def __init__(self, busy_s, sleeps=False):
        self.busy_s = busy_s
        self.sleeps = sleeps

    def __len__(self):
        return 48

    def __getitem__(self, index):
        if self.sleeps:
            time.sleep(self.busy_s)
        else:
            busy_wait(self.busy_s)
        return torch.randn(8, generator=torch.Generator().manual_seed(index)), index % 2


def ddp_train(rank, world, init_file, out, busy_s, slow_forward_rank, sleeps=False):
    """A real DistributedDataParallel loop: backward's all-reduce makes every rank wait for the slowest."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(Busy(busy_s[rank], sleeps), batch_size=4)
        sw = stepwatch.Stopwatch(trace_steps=50)  # each rank's file keeps its timeline
        sw.enable()
        own_steps = []  # the program's own clock: each iteration, wait for the batch included
        started = time.perf_counter()
        for x, y in sw.watch(loader):
            with sw.timed("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if rank == slow_forward_rank:
                    busy_wait(0.006)
            with sw.timed("backward"):
                loss.backward()
            with sw.timed("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            sw.count(samples=len(y))
            now = time.perf_counter()
            own_steps.append(now - started)
            started = now
    finally:
        dist.destroy_process_group()
    with open(f"{out}.own{rank}.json", "w") as file:
        json.dump(own_steps, file)
    sw.save(out, ranks="all")  # after the group is gone, as scripts end: the gather still reaches rank 0


def gather_live(rank, world, init_file, out, leaving_rank, timeout):
    """Each rank records its own stages (rank r also times ``only<r>``) and they gather live onto rank 0,
    except ``leaving_rank``, which returns before the gather, as a rank that died would. Rank 0 writes what it
    gathered to ``out``, and how long it waited; every rank writes its own file as well."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(6)):
        with sw.timed("forward"):
            busy_wait(0.0005 * (rank + 1))
        with sw.timed(f"only{rank}"):
            pass
        sw.count(samples=2)
    dist.barrier()
    if rank == leaving_rank:
        return
    sw.save(out.replace(".json", f".own{rank}.json"))
    started = time.perf_counter()
    gathered = sw.summary(ranks="all", timeout=timeout)
    waited = time.perf_counter() - started
    if rank != 0:
        assert gathered is None, "only rank 0 gets the gathered summaries"
        return
    gathered.save(out)
    with open(out + ".waited", "w") as file:
        json.dump({"waited": waited, "missing": list(gathered.missing)}, file)


def gather_every(rank, world, init_file, out):
    """Saves, ranks gathered, every 4 steps of a 10-step loop; rank 0 reads the all-ranks file before the
    loop's end, as a job killed there would leave it."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    sw = stepwatch.Stopwatch()
    sw.enable(out=out, gather_every=4)
    seen = []
    for index in sw.timed_iter(range(10)):
        with sw.timed("forward"):
            dist.barrier()
        if rank == 0 and index in (5, 9):
            seen.append([run.main_phase.steps for run in stepwatch._all_ranks.load_runs(out)])
    if rank == 0:
        with open(out + ".seen", "w") as file:
            json.dump(seen, file)
    dist.destroy_process_group()


def slow_windows(rank, world, init_file, out, rotate):
    """Gathers every 3 steps of a 13-step loop (4 windows); in each window one rank's forward busy-waits 20 ms:
    rank 1 every time, or (``rotate``) the rank whose turn it is. (4 ms were 12 a window: beside two CPU hogs on 2
    cores, a rank preempted for longer outside its forward was the slowest in the other rank's window.)"""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    sw = stepwatch.Stopwatch()
    sw.enable(out=out, gather_every=3)
    for index in sw.timed_iter(range(13)):
        window = max(index - 1, 0) // 3  # the first item is the one-off first step
        slow = window % world if rotate else 1
        with sw.timed("forward"):
            if rank == slow:
                busy_wait(0.02)
        with sw.timed("backward"):
            dist.barrier()  # the collective: every rank waits here for the slow one
    sw.save(out if rank == 0 else out.replace(".json", f".rank{rank}.json"))
    dist.destroy_process_group()
