"""A DistributedDataParallel training script as torchrun runs it (gloo, CPU), for the distributed tests.

It imports stepwatch only with ``--out`` (``stepwatch.enable(out=...)`` inside); without it, it is an ordinary
program for ``torchrun -m stepwatch run``. ``--slow-rank R`` makes rank R's dataset 3x slower; ``--die-rank R``
makes rank R end abruptly after training, before any exit hook runs (its results are never sent); ``--raise-rank
R`` makes rank R fail with an exception after training; ``--sleep-reads`` makes the dataset sleep instead of
busy-waiting, so that ranks of equal work stay equal on a machine whose cores other programs take.
"""

import argparse
import contextlib
import posix
import time

import torch
import torch.distributed as dist
from busy import busy_wait

BUSY_S = 0.001


class Busy(torch.utils.data.Dataset):
    def __init__(self, busy_s, sleeps=False):
        self.busy_s = busy_s
        self.wait = time.sleep if sleeps else busy_wait

    def __len__(self):
        return 64

    def __getitem__(self, index):
        self.wait(self.busy_s)
        return torch.randn(8, generator=torch.Generator().manual_seed(index)), index % 2


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--raise-rank", type=int, default=-1)
    parser.add_argument("--sleep-reads", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.out:
        import stepwatch

        stepwatch.enable(out=args.out)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    busy_s = 3 * BUSY_S if rank == args.slow_rank else BUSY_S
    loader = torch.utils.data.DataLoader(Busy(busy_s, args.sleep_reads), batch_size=4)
    loop = stepwatch.watch(loader) if args.out else loader
    timed = stepwatch.timed if args.out else lambda stage: contextlib.nullcontext()
    for x, y in loop:
        with timed("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with timed("backward"):
            loss.backward()
        with timed("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
        if args.out:
            stepwatch.count(samples=len(y))
    dist.destroy_process_group()  # as scripts do: the gather at exit still reaches the other ranks
    if rank == args.die_rank:
        posix._exit(0)  # dies at once, exit code 0 (torchrun goes on): not even a patched os._exit runs
    if rank == args.raise_rank:
        raise RuntimeError(f"rank {rank} fails after training")


if __name__ == "__main__":
    main()
