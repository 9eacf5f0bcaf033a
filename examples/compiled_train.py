"""A training loop over a model under ``torch.compile`` (backend ``aot_eager``: no C compiler needed, the same
compile callbacks as inductor) whose batch grows from 8 to 12 samples at step 11, which makes it recompile.
Never imports stepwatch. Options: --steps."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Growing(Dataset):
    """Batches of 8 samples for the first 10 steps, then of 12: the shape change a last short batch makes."""

    def __len__(self):
        return 1000

    def __getitem__(self, index):
        return torch.randn(16, generator=torch.Generator().manual_seed(index))


def batches(steps):
    sizes = [8] * 10 + [12] * (steps - 10)
    start = 0
    for size in sizes:
        yield list(range(start, start + size))
        start += size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    compiled = torch.compile(model, backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Growing(), batch_sampler=list(batches(args.steps)))
    for x in loader:
        loss = compiled(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print("training done", flush=True)


if __name__ == "__main__":
    main()
