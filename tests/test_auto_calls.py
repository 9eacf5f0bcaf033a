"""auto()'s wrappers in C (``_auto_calls.c``) and in Python (``_patches.py``): the same program records the same
stages, counts and findings with either, its patched functions keep their names, signatures and behaviour, and
a model under ``torch.compile`` keeps meeting the Python wrappers that dynamo can trace."""

from __future__ import annotations

import ast
import functools
import inspect
import subprocess

import pytest
import torch

import stepwatch
from stepwatch import _block_base, _counters, _patches
from stepwatch._tree import DROPPED

from .conftest import PYTHON, subprocess_env

PROGRAM = """
import torch, stepwatch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import stepwatch._patches as patches

torch.manual_seed(0)
class Flaky(nn.Module):  # raises in forward when told: the C wrapper passes the exception on, its block closed
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 2)))
        self.fail = False
    def forward(self, x):
        if self.fail:
            raise KeyError("flaky")
        return self.body(x)
class FlakySGD(torch.optim.SGD):  # raises in its step when told: the pre-step hook's block is left open
    fail = False
    def step(self, closure=None):
        if self.fail:
            raise ValueError("flaky step")
        return super().step(closure)

model, criterion = Flaky(), nn.CrossEntropyLoss()
optimizer = FlakySGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8 * 16, 4), torch.randint(0, 2, (8 * 16,))), batch_size=8)
{enable}
stepwatch.auto()
kinds = set()
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    model.fail = step == 6
    try:
        loss = criterion(model(x), y)
    except KeyError:
        continue
    loss.backward()
    optimizer.fail = step == 9
    try:
        optimizer.step()
    except ValueError:
        pass
    if step % 5 == 1:  # the model called in eval mode with grad, and its loss: an evaluation
        model.eval()
        criterion(model(x), y)
        model.train()
    if step % 5 == 2:  # the model called in training mode without grad: an evaluation
        with torch.no_grad():
            model(x)
    if step % 5 == 3:  # the same in inference mode, grad enabled inside it
        with torch.inference_mode(), torch.enable_grad():
            model(x)
    if step % 4 == 3:  # an evaluation inside the step, in eval mode and without grad
        model.eval()
        with torch.no_grad():
            model(x)
        model.train()
    kinds.add(type(vars(Flaky).get("__call__")).__name__)
for _ in range(5):  # no DataLoader: each optimizer step ends a step
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
summary = stepwatch.summary()
for name, phase in sorted(summary.phases.items()):
    print(name, phase.steps, sorted((path, stage.calls) for path, stage in phase.stages.items()), phase.counters)
session = patches.session
print(session.busy, session.open_blocks, session.training_blocks, session.backward_calls, session.zero_grads)
print(session.found.describe())
print("TRACED", sorted({(event.path, event.lane.split()[0]) for event in summary.trace}))
print("KINDS", sorted(kinds), type(torch.autograd.backward).__name__, type(optimizer.zero_grad).__name__)
"""


def run(pure: bool, enable: str = "") -> list[str]:
    env = subprocess_env()
    env.pop("STEPWATCH_PURE_PYTHON", None)
    if pure:
        env["STEPWATCH_PURE_PYTHON"] = "1"
    program = PROGRAM.replace("{enable}", enable)
    result = subprocess.run([PYTHON, "-c", program], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.splitlines()


def test_the_compiled_wrappers_record_what_the_python_ones_do() -> None:
    """Narrowed module calls, nested calls, a forward and an optimizer step that raise, evaluations inside
    steps and a loop without a DataLoader: the same stages, steps, counts and findings either way."""
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    compiled, pure = run(pure=False), run(pure=True)
    assert compiled[-1] == "KINDS ['AutoCall', 'NoneType'] AutoCall method"  # learning (none), then narrowed: C
    assert pure[-1] == "KINDS ['NoneType', 'function'] function method"
    assert compiled[:-1] == pure[:-1]
    train = next(line for line in compiled if line.startswith("train "))
    # 15 steps of the DataLoader (the first apart) and 3 ended by optimizer steps; the forward that raised is
    # recorded (it ran until it raised), the optimizer step that raised is not (its block was left open)
    assert "('step', 18)" in train and "('step/forward', 18)" in train and "('step/loss', 17)" in train
    assert "('step/backward', 17)" in train and "('step/optimizer', 16)" in train
    assert compiled[-4].startswith("0 [] ")  # no auto block left open, none counted as open
    # the evaluations, a step per forward: 4 in eval mode without grad, 2 in eval mode with grad and a loss (step
    # 6 raised before), 3 without grad and 3 in inference mode (grad enabled in it) in training mode
    assert "val 12 [('step', 12), ('step/forward', 12), ('step/loss', 2), ('step/other', 12)] {}" in compiled
    assert train.endswith("{'samples': 120}")  # 15 measured batches of 8 (the first step's apart)
    assert compiled[-2] == "TRACED []"  # no timeline kept


def test_the_compiled_wrappers_read_the_session_the_module_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``AutoCall`` reads ``_patches.session`` as handed over at each assignment of it (``share_session``):
    what it holds is what was last assigned, by setattr or on the way back."""
    if not _block_base.COMPILED or _block_base.share_session is None:
        pytest.fail("the development install was expected to build the C speedups")
    share = _block_base.share_session
    before, marker = _patches.session, object()
    monkeypatch.setattr(_patches, "session", marker)
    assert share(marker) is marker  # held since the assignment
    monkeypatch.undo()
    assert _patches.session is before and share(before) is before
    _patches.session = marker
    try:
        assert share(marker) is marker
    finally:
        _patches.session = before
    assert share(before) is before


def test_the_compiled_wrappers_run_the_blocks_of_a_kept_timeline() -> None:
    """With the timeline kept, the blocks' class (``TracedBlock``) has its own ``__exit__``: the C wrappers,
    which call a plain block's methods directly, call that one, and the timeline has every auto stage."""
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    enable = "stepwatch.enable(trace_steps=100)"
    compiled, pure = run(pure=False, enable=enable), run(pure=True, enable=enable)
    assert compiled[:-1] == pure[:-1]
    traced = compiled[-2]
    for stage in ("forward", "loss", "backward", "optimizer", "zero_grad"):
        assert f"('step/{stage}', 'thread')" in traced, traced


@pytest.fixture
def auto() -> object:
    stepwatch.auto()
    yield _patches.session
    stepwatch.auto(False)
    stepwatch.disable()
    stepwatch.reset()


def test_the_compiled_wrappers_keep_the_originals_names_signatures_and_docs(auto: object) -> None:
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    backward = torch.autograd.backward
    assert type(backward).__name__ == "AutoCall"
    original = backward.__wrapped__  # type: ignore[attr-defined]
    assert backward.__name__ == "backward" and backward.__doc__ == original.__doc__  # type: ignore[attr-defined]
    assert inspect.signature(backward) == inspect.signature(original)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    bound = optimizer.zero_grad  # bound as a function would be
    assert type(bound.__func__).__name__ == "AutoCall" and bound.__self__ is optimizer
    unpatched = functools.partial(bound.__func__.__wrapped__, optimizer)
    assert inspect.signature(bound) == inspect.signature(unpatched)
    optimizer.param_groups[0]["params"][0].grad = torch.ones(2)
    optimizer.zero_grad()  # outside any loop: the original, called at once
    assert optimizer.param_groups[0]["params"][0].grad is None


def test_a_narrowed_class_stays_on_the_python_wrapper_once_torch_compile_has_compiled() -> None:
    """dynamo traces the Python wrapper of a class called inside a compiled region; the C one would break
    the graph there, so it is only used while nothing was compiled (an optimizer alone loads dynamo)."""
    program = (
        "import sys, torch, stepwatch\n"
        "{prelude}\n"
        "model = torch.nn.Linear(4, 2)\n"
        "stepwatch.auto()\n"
        "for (x,) in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(40, 4)), batch_size=4):\n"
        "    model(x).sum().backward()\n"
        "print(type(vars(torch.nn.Linear)['__call__']).__name__)\n"
    )
    outputs = []
    compiling = "torch.compile(torch.nn.ReLU(), backend='eager')(torch.ones(2))"
    for prelude in ("torch.optim.SGD(torch.nn.Linear(4, 2).parameters(), lr=0.1).zero_grad()", compiling):
        env = {k: v for k, v in subprocess_env().items() if k != "STEPWATCH_PURE_PYTHON"}
        command = [PYTHON, "-c", program.format(prelude=prelude)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout.strip())
    assert outputs == ["AutoCall" if _block_base.COMPILED else "function", "function"]


def test_the_pure_python_switch_leaves_auto_in_python() -> None:
    env = {**subprocess_env(), "STEPWATCH_PURE_PYTHON": "1"}
    program = "import stepwatch._block_base as b, stepwatch._auto as a; print(b.AutoCall, a.AutoSession.__mro__[1])"
    result = subprocess.run([PYTHON, "-c", program], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "<class", "'object'>"]


def counted(add: object) -> list[tuple[object, int]]:
    """``add(sw, 8)`` at each moment a sample count can come: (the train phase's samples as reported, the batches'
    count merged into the program's own counter, its count calls)."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    seen: list[tuple[object, int]] = []

    def count(size: int = 8) -> None:
        add(sw, size)  # type: ignore[operator]
        phase = sw.tree.phases.get("train")
        seen.append((phase.counted().get("samples") if phase else None, phase.count_calls if phase else 0))

    loop = sw.timed_iter(range(6))
    next(loop)
    count()  # the one-off first step: its counts are apart
    next(loop)
    count()  # a measured step
    count(3)
    with sw.timed("inner"):
        count()  # inside a block of the step
    sw.tree.phases["train"].counters["samples"] = 1.5  # (a program's own count restored from a checkpoint, say)
    count()  # a float counter beside the batches' count: merged
    sw.tree.phases["train"].counters["samples"] = _counters.COUNTER_LIMIT
    count()  # saturated: stays at the limit
    del sw.tree.phases["train"].counters["samples"]
    sw.disable()
    count()  # not measuring
    sw.enable()
    next(loop)
    count()  # measuring again
    sw.stacks.thread_stack().append((None, DROPPED, 0))
    count()  # inside a dropped step
    sw.stacks.thread_stack().pop()
    loop.close()
    return seen


def test_the_compiled_sample_count_adds_what_the_python_one_does() -> None:
    """auto()'s count of a batch's samples, in C (``_counts.c``) and in Python, at every moment a count can
    come: the first step, measured steps, a block, a float counter, a saturated one, switched off, a dropped
    step."""
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    assert _counters.add_samples is not _counters.python_add_samples
    expected = [
        (None, 0),
        (8, 1),
        (11, 2),
        (19, 3),
        (28.5, 4),
        (_counters.COUNTER_LIMIT, 5),
        (35, 5),  # not measuring: the batches' count as it was
        (43, 6),
        (43, 6),
    ]
    assert counted(_counters.python_add_samples) == expected
    assert counted(_counters.add_samples) == expected


LOOPS = """
import gc, torch, stepwatch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import stepwatch._patches as patches

torch.manual_seed(0)
model, criterion = nn.Linear(4, 2), nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8 * 10 + 3, 4), torch.randn(8 * 10 + 3, 2)), batch_size=8)
stepwatch.auto()
session = patches.session

def step(x, y):
    criterion(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()

def state(what):
    phase = stepwatch.summary().phases.get("train")
    counted = (phase.steps, dict(phase.counters)) if phase else None
    print(what, session.loop_depth, session.loop_thread is None, session.busy, counted, flush=True)

for x, y in loader:  # every batch (the last one short)
    step(x, y)
state("whole")
for index, (x, y) in enumerate(loader):  # a break: the loop ends when its iterator is dropped
    step(x, y)
    if index == 3:
        break
gc.collect()
state("break")
try:
    for index, (x, y) in enumerate(loader):  # an exception out of the loop
        step(x, y)
        if index == 2:
            raise KeyError("out")
except KeyError:
    pass
gc.collect()
state("raised")
x, y = next(iter(loader))  # one batch and the iterator dropped at once
step(x, y)
gc.collect()
state("next(iter())")
batches = iter(loader)
next(batches)
batches.close()  # closed by hand
state("closed")
print("closed again", next(batches, "none left"))
for x, y in loader:  # a nested loop's batches (a few micro-batches) are the enclosing step's
    for inner, _ in zip(loader, range(2)):
        pass
    step(x, y)
gc.collect()
state("nested")
print("TYPE", type(iter(loader)).__name__)
"""


def test_the_compiled_loop_ends_as_the_python_generator_does() -> None:
    """auto()'s loop over a DataLoader in C (``AutoSteps``) and in Python: the same steps and sample counts, and
    the session's loop state given back, however the loop ends: run out, a ``break``, an exception out of it,
    ``next(iter(loader))``, closed by hand, nested."""
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    outputs = []
    for pure in (False, True):
        env = {k: v for k, v in subprocess_env().items() if k != "STEPWATCH_PURE_PYTHON"}
        if pure:
            env["STEPWATCH_PURE_PYTHON"] = "1"
        result = subprocess.run([PYTHON, "-c", LOOPS], capture_output=True, text=True, timeout=300, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Exception ignored" not in result.stderr, result.stderr
        outputs.append(result.stdout.splitlines())
    compiled, pure_python = outputs
    assert compiled[-1] == "TYPE AutoSteps" and pure_python[-1] == "TYPE generator"
    assert compiled[:-1] == pure_python[:-1]
    for line in compiled[:-2]:
        if line.startswith("closed again"):
            assert line == "closed again none left"
        elif line.startswith("next(iter())"):  # its loop stays the session's until the next loop starts
            assert line.startswith("next(iter()) 1 False 0 "), line
        else:  # no loop left open on the session
            assert " 0 True 0 " in line, line
    # the first loop's 11 batches (the first one-off, the short last one counted as it is): 10 steps, 83 - 8
    assert compiled[0] == "whole 0 True 0 (10, {'samples': 75})"


def test_a_block_class_given_its_own_exit_after_the_wrappers_remembered_it_has_it_called() -> None:
    """The compiled wrappers call a block's methods directly while its class is the one they remembered running
    BlockBase's own, unchanged since (its version tag): a class given an ``__exit__`` of its own later has it
    called by every wrapper from then on."""
    program = """
import torch, stepwatch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from stepwatch._blocks import Block
torch.manual_seed(0)
model, criterion = nn.Linear(4, 2), nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8 * 12, 4), torch.randint(0, 2, (8 * 12,))), batch_size=8)
stepwatch.auto()
exits = []
base_exit = Block.__exit__
def counted_exit(self, *args):
    exits.append(self._name)
    return base_exit(self, *args)
for step, (x, y) in enumerate(loader):
    if step == 8:  # narrowed, and every wrapper's block class remembered, steps ago
        assert not exits
        Block.__exit__ = counted_exit
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
print(sorted((name, exits.count(name)) for name in set(exits)))
"""
    env = subprocess_env()
    env.pop("STEPWATCH_PURE_PYTHON", None)
    result = subprocess.run([PYTHON, "-c", program], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    exits = dict(ast.literal_eval(result.stdout.split("\n")[0]))
    stages = ("forward", "loss", "backward", "optimizer", "zero_grad")
    assert {stage: exits.get(stage) for stage in stages} == dict.fromkeys(stages, 4)  # steps 8 to 11, once a step
