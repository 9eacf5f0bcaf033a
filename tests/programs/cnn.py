"""A small CNN trained on synthetic images: an ordinary training script that never imports stepwatch.

The tests run it with and without ``stepwatch run`` and compare. Options: --workers, --epochs, --accum
(gradient accumulation), --spawn (workers started by spawn), --amp (CPU autocast with a GradScaler),
--busy-ms (a busy-wait in each sample's read, whose total this main process reports when --workers is 0),
--fail / --exit N (how it ends), --wait (hang after training until a signal comes)."""

import argparse
import sys
import time

import torch
from busy import BUSY_NS, busy_wait
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, size, busy_s):
        self.size, self.busy_s = size, busy_s
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(size, 1, 12, 12, generator=generator)
        self.labels = torch.randint(0, 4, (size,), generator=generator)

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        if self.busy_s:
            busy_wait(self.busy_s)
        return self.images[index], self.labels[index]


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Linear(8 * 5 * 5, 4)

    def forward(self, x):
        return self.head(self.features(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--spawn", action="store_true", help="start the workers with spawn")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=192)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--busy-ms", type=float, default=0.0)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--exit", type=int, default=None)
    parser.add_argument("--wait", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = SmallCNN()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
    train = DataLoader(
        Images(args.samples, args.busy_ms / 1e3),
        batch_size=16,
        num_workers=args.workers,
        multiprocessing_context="spawn" if args.spawn else None,
    )
    val = DataLoader(Images(64, 0.0), batch_size=32)
    for epoch in range(args.epochs):
        model.train()
        for index, (images, labels) in enumerate(train):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
                loss = criterion(model(images), labels) / args.accum
            scaler.scale(loss).backward()
            if (index + 1) % args.accum == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            correct = sum((model(images).argmax(1) == labels).sum().item() for images, labels in val)
        print(f"epoch {epoch}: loss {loss.item():.6f}, val accuracy {correct / 64:.3f}")
    print(f"final loss {loss.item()!r}")
    print(f"busy ns {BUSY_NS[0]}")
    sys.stdout.flush()
    if args.fail:
        raise RuntimeError("diverged on purpose")
    if args.exit is not None:
        sys.exit(args.exit)
    if args.wait:
        print("waiting", flush=True)
        while True:
            time.sleep(0.05)


if __name__ == "__main__":
    main()
