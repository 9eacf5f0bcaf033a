"""A training script that knows nothing of stepwatch: ``stepwatch run examples/plain_train.py`` reports on it.

A small MLP learns a synthetic regression task from a DataLoader whose samples cost a little CPU time each.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic samples that take ``cost_ms`` each to prepare, as a decode would."""

    def __init__(self, size: int, cost_ms: float) -> None:
        self.x = torch.randn(size, 32)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.cost_s = cost_ms / 1e3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = time.perf_counter() + self.cost_s
        while time.perf_counter() < end:
            pass
        return self.x[index], self.y[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    torch.manual_seed(0)
    # one compute thread, as a small model wants: threads that wait for each other at every operation would make
    # each step's time depend on whatever else the machine runs
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    criterion = nn.MSELoss()
    loader = DataLoader(Samples(2048, 0.05), batch_size=64, shuffle=True, num_workers=args.workers)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
