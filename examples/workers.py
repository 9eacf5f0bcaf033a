"""The README's worker example: 2 DataLoader workers, 8 samples per batch, each sample a 2 ms busy read plus a
1 ms ``augment`` timed inside the workers, and a 2 ms step. Run: ``python examples/workers.py``."""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, Dataset

import stepwatch


def busy(seconds: float) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def augment(x: torch.Tensor) -> torch.Tensor:
    busy(0.001)
    return x * 2


class Samples(Dataset[torch.Tensor]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.augment = stepwatch.timed_transform(augment, "augment")  # picklable, for spawn too

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        with stepwatch.timed("read"):
            busy(0.002)
        return self.augment(torch.full((4,), float(index)))


def main() -> None:
    stepwatch.enable()
    loader = DataLoader(Samples(128), batch_size=8, num_workers=2, persistent_workers=True)
    for _ in range(2):  # two epochs
        for _batch in stepwatch.watch(loader):
            busy(0.002)  # the step (watch() counts each batch's samples)
    print(stepwatch.report(), end="")


if __name__ == "__main__":
    main()
