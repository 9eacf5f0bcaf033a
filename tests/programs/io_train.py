"""A training script whose samples are read slowly (each read sleeps, as one from a network disk would), trained
with the DataLoader settings given: the tests tune it with ``stepwatch tune`` and time it with ``stepwatch run``.
Never imports stepwatch. Options: --workers, --prefetch, --persistent, --read-ms, --samples,
--epochs, --max-steps (the training ends there, as a trainer's max_steps ends it)."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowReads(Dataset):
    def __init__(self, size, read_s):
        self.size, self.read_s = size, read_s
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 16, generator=generator)
        self.y = torch.randn(size, 1, generator=generator)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        time.sleep(self.read_s)
        return self.x[index], self.y[index]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--prefetch", type=int, default=None)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--read-ms", type=float, default=6.0)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    options = {"batch_size": 4, "shuffle": True, "num_workers": args.workers}
    if args.workers and args.prefetch:
        options["prefetch_factor"] = args.prefetch
    if args.workers and args.persistent:
        options["persistent_workers"] = True
    loader = DataLoader(SlowReads(args.samples, args.read_ms / 1e3), **options)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    done = 0
    for epoch in range(args.epochs):
        for index, (x, y) in enumerate(loader):
            if done == args.max_steps:
                break
            done += 1
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            end = time.perf_counter() + 0.003  # the rest of a training step
            while time.perf_counter() < end:
                pass
            if index % 100 == 0:
                print(f"epoch {epoch} step {index}: loss {loss.item():.4f}", flush=True)
    print("training done", flush=True)
    torch.save(model.state_dict(), "checkpoint.pt")


if __name__ == "__main__":
    main()
