"""auto(): once a loop's outermost module classes are known, submodule calls are torch's own again."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepwatch
from stepwatch import _module_calls, _patches

TORCH_CALL = vars(nn.Module)["__call__"]


class Inner(nn.Module):
    """A submodule that writes down, at each call, which ``__call__`` its class and nn.Module have."""

    def __init__(self, seen: list[tuple[bool, bool]]) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((type(self).__call__ is TORCH_CALL, vars(nn.Module)["__call__"] is TORCH_CALL))
        return self.linear(x)


class Model(nn.Module):
    def __init__(self, seen: list[tuple[bool, bool]]) -> None:
        super().__init__()
        self.inner = Inner(seen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Other(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def loader(batches: int) -> DataLoader[Any]:
    data = TensorDataset(torch.randn(4 * batches, 4), torch.randint(0, 2, (4 * batches,)))
    return DataLoader(data, batch_size=4)


def train(model: nn.Module, batches: int, extra: nn.Module | None = None, extra_from: int = 0) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss()
    for index, (x, y) in enumerate(loader(batches)):
        optimizer.zero_grad()
        if extra is not None and index >= extra_from:
            x = extra(x)
        criterion(model(x), y).backward()
        optimizer.step()


def test_after_two_steps_submodules_go_through_torchs_own_call(auto: None) -> None:
    seen: list[tuple[bool, bool]] = []
    train(Model(seen), batches=6)
    # steps 1 and 2 learn (every call wrapped); from step 3 on only Model and CrossEntropyLoss are
    assert seen[:2] == [(False, False)] * 2
    assert seen[2:] == [(True, True)] * 4
    assert "__call__" in vars(Model) and "__call__" in vars(nn.CrossEntropyLoss) and "__call__" not in vars(Inner)
    stages = stepwatch.summary().phases["train"].stages
    assert stages["step/forward"].calls == stages["step/loss"].calls == 5  # every step's, the first apart
    assert not any(path.startswith("step/forward/") for path in stages)  # submodules are still not stages


def test_auto_false_takes_the_wrapper_off_the_classes_too() -> None:
    stepwatch.auto()
    try:
        train(Model([]), batches=4)
        assert "__call__" in vars(Model)
    finally:
        stepwatch.auto(False)
        stepwatch.disable()
        stepwatch.reset()
    assert "__call__" not in vars(Model) and "__call__" not in vars(nn.CrossEntropyLoss)
    assert vars(nn.Module)["__call__"] is TORCH_CALL and _patches.session is None


def test_a_validation_loop_learns_the_classes_it_calls(auto: None) -> None:
    seen: list[tuple[bool, bool]] = []
    train(Model(seen), batches=4)
    other, criterion = Other(), nn.MSELoss()
    with torch.no_grad():
        for x, _ in loader(5):
            criterion(other(x), x)  # a class and a loss never called in training
    val = stepwatch.summary().phases["val"].stages
    assert val["step/forward"].calls == val["step/loss"].calls == 4
    assert "__call__" in vars(Other) and "__call__" in vars(nn.MSELoss)


def test_a_class_first_called_late_in_a_loop_is_found_when_it_learns_again(
    auto: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_module_calls, "RELEARN_EVERY", 5)
    train(Model([]), batches=20, extra=Other(), extra_from=4)
    # narrowed after step 2; Other, called from step 5 on, is found in step 8, which learns again after 5 steps
    stages = stepwatch.summary().phases["train"].stages
    assert stages["step/forward"].calls == 19 + len(range(8, 21))
    assert stepwatch.summary().metadata["auto"].count("forward: Model+Other") == 1


def test_a_module_call_that_raises_after_narrowing_keeps_its_exception_and_its_block(auto: None) -> None:
    model = nn.Linear(4, 2)
    calls = 0
    for index, (x, y) in enumerate(loader(5)):
        nn.functional.cross_entropy(model(x), y).backward()
        calls += 1
        if index == 3:
            with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
                model(torch.ones(2, 5))
            calls += 1
    assert "__call__" in vars(nn.Linear)
    assert stepwatch.summary().phases["train"].stages["step/forward"].calls == calls - 1


def test_a_known_training_call_is_checked_again_at_every_call(auto: None) -> None:
    """Once the model and the loss module are known as training calls, each call still re-reads the grad mode,
    inference mode, the model's mode and whether an evaluation is under way: each kind of evaluation after a
    steady training step is a val step, a training forward ends an evaluation, and a loss computed under
    no_grad is no training work."""
    torch.manual_seed(0)
    model, criterion = Model([]), nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = _patches.session
    assert session is not None
    for index, (x, y) in enumerate(loader(8)):
        optimizer.zero_grad()
        out = model(x)
        criterion(out, y).backward()
        optimizer.step()
        before = session.training_blocks
        if index == 2:
            model.eval()
            criterion(model(x), y)  # an evaluation begins, grad on: its loss is no training work
            assert session.evaluation is not None and session.training_blocks == before
            model.train()
            model(x)  # and a training forward ends it
            assert session.evaluation is None and session.training_blocks == before + 1
            before += 1
        elif index == 3:  # known by now: the wrapper's fast path answers the next calls
            assert session.steady_forward is not None and session.steady_forward() is model
            assert session.steady_loss is not None and session.steady_loss() is criterion
        elif index == 4:
            with torch.inference_mode(), torch.enable_grad():
                model(x)  # grad on inside inference mode: an evaluation
        elif index == 5:
            model.eval()
            model(x)  # eval mode: an evaluation
            model.train()
        elif index == 6:
            with torch.no_grad():
                criterion(out.detach(), y)  # a loss under no_grad: no training work, no evaluation either
        elif index == 7:
            with torch.no_grad():
                model(x)  # no_grad: an evaluation
        assert session.training_blocks == before
    phases = stepwatch.summary().phases
    assert phases["train"].stages["step/forward"].calls == 7 + 1
    assert phases["train"].stages["step/loss"].calls == 8  # the no_grad one too, in its step
    assert phases["val"].stages["step/loss"].calls == 1  # the evaluation's, grad on
    assert phases["val"].steps == 4 and phases["val"].stages["step/forward"].calls == 4
