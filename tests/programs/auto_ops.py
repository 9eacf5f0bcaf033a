"""Runs training programs under ``stepwatch.auto()`` and prints what each recorded, one JSON line a program: what
``tests/test_differential.py`` compares between auto()'s compiled wrappers and their Python twin.

A program (JSON) says how its model nests (a list of layers, each ``"linear"``, ``"relu"`` or a list: a nested
``Sequential``), its loss (a module or a function), its loops (``train`` or ``val``, the latter under ``no_grad`` with
the model in eval mode; written as ``for`` statements or as ``next(iter(...))`` calls; a step to ``break`` at) and
what each step does besides the usual forward, loss, backward, optimizer step and zero_grad: a second forward, a
submodule called alone, a forward that raises (caught in the step), a step without the optimizer (accumulated
gradients), a ``timed`` block of the program's own around the forward, a ``count()`` of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

import block_ops  # (this script's folder, first on sys.path)
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

import stepwatch


class Refuses(nn.Module):
    """A layer that raises when told to (a forward that fails inside the model)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            raise ValueError("refused")
        return x


def layers(spec: list[Any], width: int) -> nn.Sequential:
    made: list[nn.Module] = [Refuses()]
    for layer in spec:
        if isinstance(layer, list):
            made.append(layers(layer, width))
        else:
            made.append(nn.Linear(width, width) if layer == "linear" else nn.ReLU())
    return nn.Sequential(*made)


def step(model: nn.Sequential, loss_of: Any, optimizer: Any, x: Any, y: Any, extras: list[str], index: int) -> None:
    if "refuse" in extras and index % 2 == 1:
        model[0].armed = True
        with contextlib.suppress(ValueError):
            model(x)
        model[0].armed = False
    if "timed" in extras:
        with stepwatch.timed("own"):
            out = model(x)
    else:
        out = model(x)
    if "twice" in extras:
        out = out + model(x)
    if "submodule" in extras and len(model) > 1:
        model[1](x)
    loss = loss_of(out, y)
    loss.backward()
    if "accumulate" not in extras or index % 2 == 1:
        optimizer.step()
        optimizer.zero_grad()
    if "count" in extras:
        stepwatch.count(samples=len(y))


def run_loop(model: nn.Sequential, loss_of: Any, optimizer: Any, loop: dict[str, Any], width: int) -> None:
    data = TensorDataset(torch.randn(2 * loop["batches"], width), torch.randn(2 * loop["batches"], width))
    loader = DataLoader(data, batch_size=2)
    if loop["kind"] == "val":
        model.eval()
        with torch.no_grad():
            for index, (x, _) in enumerate(loader):
                if index == loop["break_at"]:
                    break
                model(x)
        model.train()
        return
    if loop["written"] == "next":
        iterator = iter(loader)
        for index in range(loop["batches"]):
            if index == loop["break_at"]:
                break
            x, y = next(iterator)
            step(model, loss_of, optimizer, x, y, loop["extras"], index)
        return
    for index, (x, y) in enumerate(loader):
        if index == loop["break_at"]:
            break
        step(model, loss_of, optimizer, x, y, loop["extras"], index)


def recorded(program: dict[str, Any]) -> dict[str, Any]:
    """What one program recorded under ``auto()`` (``block_ops.records``), or the error it raised."""
    torch.manual_seed(0)
    width = 2
    model = layers([*program["model"], "linear"], width)  # (a last linear layer: parameters to optimize)
    loss_of = nn.MSELoss() if program["loss"] == "module" else functional.mse_loss
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stepwatch.disable()
    stepwatch.reset()
    stepwatch.auto()
    try:
        for loop in program["loops"]:
            run_loop(model, loss_of, optimizer, loop, width)
        summary = stepwatch.summary()
    except Exception as error:  # compared between the two implementations
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
    return block_ops.records(summary, stepwatch._default_instance.stopwatch)  # type: ignore[no-any-return]


if __name__ == "__main__":
    block_ops.main(recorded)
