"""A trainer that takes ``next(iter(loader))`` at every step (a new iterator each time, as some training scripts
do), over reads that sleep 4 ms a sample. Never imports stepwatch. Options: --steps."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowReads(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, index):
        time.sleep(0.004)
        return torch.randn(16, generator=torch.Generator().manual_seed(index))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(SlowReads(), batch_size=4, shuffle=True)
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = next(iter(loader))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("training done", flush=True)


if __name__ == "__main__":
    main()
