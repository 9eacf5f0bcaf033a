"""A trainer shaped like minGPT's ``Trainer.run``, written for the tests: one endless epoch (a sampler with
replacement), ``next(iter(loader))`` in a ``while`` loop with 2 DataLoader workers, ``pin_memory``, AdamW.
Each read sleeps ``READ_S`` (a remote read: the worker waits, it does not compute). The program writes its own
clock's figures to ``argv[1]``; ``argv[2]`` sets the workers (default 2)."""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler

READ_S = 0.008
ITERATIONS = 60
BATCH = 4


class RemoteReads(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, index):
        time.sleep(READ_S)
        generator = torch.Generator().manual_seed(index)
        return torch.randn(16, generator=generator), index % 4


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(
        RemoteReads(),
        sampler=RandomSampler(RemoteReads(), replacement=True, num_samples=int(1e10)),
        shuffle=False,
        pin_memory=False,
        batch_size=BATCH,
        num_workers=workers,
    )
    data_iter = iter(loader)
    iterations = []
    started = time.perf_counter()
    for _ in range(ITERATIONS):
        try:
            x, y = next(data_iter)
        except StopIteration:
            data_iter = iter(loader)
            x, y = next(data_iter)
        loss = nn.functional.cross_entropy(model(x), y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        iterations.append(now - started)
        started = now
    with open(sys.argv[1], "w") as file:
        json.dump({"iterations": iterations, "read_s": READ_S, "batch": BATCH}, file)


if __name__ == "__main__":
    main()
