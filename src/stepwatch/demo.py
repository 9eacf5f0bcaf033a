"""``stepwatch demo``: a first experience of stepwatch on a real, small training job.

A small CNN learns scikit-learn's handwritten digits (shipped inside the package: nothing is downloaded),
upscaled to 32x32 pixels, with a deliberately costly augmentation (a random rotation and blur done by SciPy,
as a real transform would). It trains twice: with ``num_workers=0``, where the augmentation runs in the training
process and the verdict is input-bound, then with 2 DataLoader workers. Both reports, their verdicts and the
comparison are printed, and both runs are saved as JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import stepwatch

from ._analysis import compare
from ._render import render_comparison

EXTRA_HINT = "the demo needs PyTorch and scikit-learn: pip install 'stepwatch[demo]'"


def _require() -> tuple[Any, Any, Any]:
    try:
        import numpy
        import torch
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise SystemExit(f"stepwatch demo: {EXTRA_HINT} ({error})") from None
    return numpy, torch, load_digits


class RotateAndBlur:
    """A random rotation (cubic spline) and a Gaussian blur: a real, deliberately costly augmentation."""

    def __init__(self, max_degrees: float = 20.0, repeats: int = 3) -> None:
        self.max_degrees = max_degrees
        self.repeats = repeats

    def __call__(self, image: Any, seed: int) -> Any:
        import numpy
        from scipy import ndimage

        rng = numpy.random.default_rng(seed)
        for _ in range(self.repeats):
            angle = rng.uniform(-self.max_degrees, self.max_degrees) / self.repeats
            image = ndimage.rotate(image, angle, reshape=False, order=3, mode="nearest")
        return ndimage.gaussian_filter(image, sigma=0.6)


class Digits:
    """scikit-learn's 8x8 digits upscaled to 32x32, augmented per sample; a map-style dataset."""

    def __init__(self, images: Any, labels: Any, augment: Any, epoch_seed: int = 0) -> None:
        self.images = images
        self.labels = labels
        self.augment = augment
        self.epoch_seed = epoch_seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        import numpy
        import torch

        with stepwatch.timed("read"):
            image = numpy.kron(self.images[index], numpy.ones((4, 4), dtype=numpy.float32))
        image = self.augment(image, seed=index * 1000 + self.epoch_seed)
        return torch.from_numpy(image.astype(numpy.float32))[None], int(self.labels[index])


def build_model(torch: Any) -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


def train_once(num_workers: int, samples: int, epochs: int, batch_size: int) -> stepwatch.Summary:
    """Trains the CNN once with ``num_workers`` and returns the stopwatch's summary."""
    numpy, torch, load_digits = _require()
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the loop, like the workers, gets one core
    digits = load_digits()
    images = (digits.images / 16.0).astype(numpy.float32)[:samples]
    labels = digits.target[:samples]
    split = int(len(labels) * 0.8)
    augment = stepwatch.timed_transform(RotateAndBlur(), "augment")
    train_set = Digits(images[:split], labels[:split], augment)
    val_set = Digits(images[split:], labels[split:], augment, epoch_seed=1)
    options: dict[str, Any] = {"batch_size": batch_size, "num_workers": num_workers}
    if num_workers:
        options["persistent_workers"] = True
    train: Any = DataLoader(train_set, shuffle=True, **options)  # type: ignore[arg-type]  # map-style, duck-typed
    val: Any = DataLoader(val_set, **options)  # type: ignore[arg-type]
    model = build_model(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()

    stepwatch.reset()
    stepwatch.enable(warmup=2)  # the module-level stopwatch: blocks in the dataset record into it too
    try:
        for _ in range(epochs):
            model.train()
            for x, y in stepwatch.watch(train):
                with stepwatch.timed("forward"):
                    out = model(x)
                with stepwatch.timed("loss"):
                    loss = criterion(out, y)
                with stepwatch.timed("backward"):
                    loss.backward()
                with stepwatch.timed("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad()
            model.eval()
            correct = 0
            with torch.no_grad():
                for x, y in stepwatch.watch(val, phase="val"):
                    with stepwatch.timed("forward"):
                        correct += int((model(x).argmax(1) == y).sum())
        summary = stepwatch.summary()
    finally:
        stepwatch.disable()
        stepwatch.reset()
    print(f"  validation accuracy after {epochs} epoch(s): {correct / max(len(val_set), 1):.1%}")
    return summary


def _bounded(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, else a one-line usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {bounds}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stepwatch demo",
        description="Train a small CNN on scikit-learn's digits with num_workers=0, then with workers, and show what"
        " stepwatch tells: both reports, their verdicts and the comparison.",
    )
    parser.add_argument("--samples", type=_bounded(10, 1797), default=1797, help="digits to use (10 to 1797)")
    parser.add_argument("--epochs", type=_bounded(1), default=2)
    parser.add_argument("--batch-size", type=_bounded(1), default=32)
    parser.add_argument(
        "--workers", type=_bounded(1), default=2, help="DataLoader workers of the second run (the first has 0)"
    )
    parser.add_argument("--out-dir", default="runs", help="where both runs are saved as JSON")
    args = parser.parse_args(argv)
    _require()
    os.makedirs(args.out_dir, exist_ok=True)
    runs = []
    for workers in (0, args.workers):
        print(f"== training with num_workers={workers} ==", flush=True)
        summary = train_once(workers, args.samples, args.epochs, args.batch_size)
        path = os.path.join(args.out_dir, f"demo-{workers}-workers.json")
        from ._run_file import save_summary

        save_summary(summary, path)
        print(stepwatch.render(summary))
        print(f"saved to {path}\n", flush=True)
        runs.append((path, summary))
    (before_path, before), (after_path, after) = runs
    print(render_comparison(compare(before, after), before_path, after_path))
    print(f"compare them again with: stepwatch compare {before_path} {after_path}")
    _pictures(runs, args.out_dir)
    return 0


def _pictures(runs: list[tuple[str, stepwatch.Summary]], folder: str) -> None:
    """Each run as a one-file HTML report, and a PNG of both runs compared; their paths printed."""
    from ._render import plot as _plot
    from ._render.html import render_html

    for path, summary in runs:
        page = os.path.splitext(path)[0] + ".html"
        with open(page, "w", encoding="utf-8") as file:
            file.write(render_html(summary, os.path.basename(path)))
        print(f"HTML report: {page}")
    (before_path, before), (after_path, after) = runs
    picture = os.path.join(folder, "demo-compare.png")
    try:
        _plot.save(_plot.comparison_figure(before, after, before_path, after_path), picture)
    except ImportError as error:
        print(f"no PNG: {error}")
    else:
        print(f"both runs compared: {picture}")


if __name__ == "__main__":
    sys.exit(main())
