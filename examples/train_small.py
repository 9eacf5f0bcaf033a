"""A small real CPU training loop instrumented with stepwatch; ``make demo`` runs it.

A two-layer MLP learns a synthetic regression task from a DataLoader whose dataset does a little work per
sample, so the report shows both a data wait and a step breakdown, plus a validation phase.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import stepwatch


class NoisyFeatures(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Synthetic samples whose preparation costs ``cost_ms`` of CPU time each, like a decode would."""

    def __init__(self, size: int, features: int, cost_ms: float, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=generator)
        self.weights = torch.randn(features, 1, generator=generator)
        self.cost_s = cost_ms / 1e3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        deadline = time.perf_counter() + self.cost_s
        while time.perf_counter() < deadline:  # stands in for decoding / augmentation
            pass
        x = self.x[index]
        return x, x @ self.weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cost-ms", type=float, default=0.05, help="CPU cost of preparing one sample")
    parser.add_argument("--save", default="runs/train_small.json", help="where to save the run")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    stopwatch = stepwatch.Stopwatch(warmup=2)
    stopwatch.enable()
    train = DataLoader(NoisyFeatures(args.samples, 256, args.cost_ms, 1), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(NoisyFeatures(args.samples // 4, 256, args.cost_ms, 2), batch_size=args.batch_size)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    criterion = nn.MSELoss()

    for epoch in range(args.epochs):
        model.train()
        for x, y in stopwatch.timed_iter(train):
            with stopwatch.timed("forward"):
                out = model(x)
            with stopwatch.timed("loss"):
                loss = criterion(out, y)
            with stopwatch.timed("backward"):
                loss.backward()
            with stopwatch.timed("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            stopwatch.count(samples=len(y))
        model.eval()
        with torch.no_grad():
            for x, y in stopwatch.timed_iter(val, phase="val"):
                with stopwatch.timed("forward"):
                    criterion(model(x), y)
                stopwatch.count(samples=len(y))
        print(f"epoch {epoch}: last train loss {loss.item():.4f}")

    print()
    print(stopwatch.report())
    if args.save:
        import os

        os.makedirs(os.path.dirname(args.save) or ".", exist_ok=True)
        stopwatch.save(args.save)
        print(f"saved to {args.save}; read it again with: stepwatch report {args.save}")


if __name__ == "__main__":
    main()
