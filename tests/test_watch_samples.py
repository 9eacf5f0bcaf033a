"""``watch()`` counts each measured step's samples, as ``auto()`` does, and a program's own ``count(samples=...)``
replaces that count rather than adding to it: the same totals with the compiled count and the Python twin, with
and without workers, with a short last batch, a custom collate, batches with nothing to count, a validation
phase and a bounded window."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import stepwatch
from stepwatch import Stopwatch

from .test_speedups import compiled_and_pure_output

PROGRAM = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import stepwatch

data = TensorDataset(torch.randn(100, 4), torch.randn(100, 1))

def run(how, warmup=0, epochs=2, **loader):
    sw = stepwatch.Stopwatch(warmup=warmup)
    sw.enable()
    for epoch in range(epochs):
        for i, batch in enumerate(sw.watch(DataLoader(data, **loader))):
            if how == "by hand":
                sw.count(samples=len(batch[1]))
            elif how == "by hand, from step 5":
                if i >= 5:
                    sw.count(samples=len(batch[1]))
            elif how == "tokens":
                sw.count(tokens=3 * len(batch[1]))
            elif how == "one a step":
                sw.count(samples=1)
            elif how == "another thread counts":
                sw.tree.phases["train"].counting += 1  # (a Python writer under way: the C count hands it on)
    phase = sw.summary().phases["train"]
    shown = {key: value for key, value in loader.items() if key != "collate_fn"}  # (a function's address differs)
    print(how, warmup, shown, phase.counters, phase.steps, phase.count_calls)

for how in ("watch alone", "by hand", "by hand, from step 5", "tokens", "one a step"):
    run(how, batch_size=8)
run("watch alone", warmup=3, batch_size=8)
run("watch alone", batch_size=8, drop_last=True)
run("watch alone", batch_size=7, shuffle=True)
run("watch alone", batch_size=8, collate_fn=lambda samples: {"x": torch.stack([s[0] for s in samples])})
run("watch alone", batch_size=8, collate_fn=lambda samples: [str(s[0]) for s in samples])
"""


def test_watch_counts_samples_and_a_programs_own_count_replaces_it() -> None:
    """Two epochs of 100 samples in batches of 8 (12 full and one of 4; each epoch's first step a one-off, not
    counted): 92 samples an epoch counted by watch() alone, the same where the program counts them too, the
    program's own meaning of a sample where it differs, and its count alone from the step it starts counting;
    the same in C and in Python."""
    lines = compiled_and_pure_output(PROGRAM).splitlines()
    assert len(lines) == 10, lines
    assert lines[0] == "watch alone 0 {'batch_size': 8} {'samples': 184} 24 0"
    assert lines[1] == "by hand 0 {'batch_size': 8} {'samples': 184} 24 24"  # not 368: replaced, not added
    # the program counts from its 6th step of each epoch: its count alone, what watch() counted before taken back
    assert lines[2] == "by hand, from step 5 0 {'batch_size': 8} {'samples': 120} 24 16"
    assert lines[3] == "tokens 0 {'batch_size': 8} {'samples': 184, 'tokens': 552} 24 24"
    assert lines[4] == "one a step 0 {'batch_size': 8} {'samples': 24} 24 24"
    # warm-up: the first 3 steps of the loop are not measured, then the epoch's first is a one-off again
    assert lines[5] == "watch alone 3 {'batch_size': 8} {'samples': 152} 20 0"
    assert lines[6] == "watch alone 0 {'batch_size': 8, 'drop_last': True} {'samples': 176} 22 0"
    # batches of 7 (14 of 7, one of 2), shuffled: the loader's size where it holds, the short one looked into
    assert lines[7] == "watch alone 0 {'batch_size': 7, 'shuffle': True} {'samples': 186} 28 0"
    assert "{'samples': 184} 24 0" in lines[8]  # a custom collate: each batch looked into (a dict)
    assert lines[9].endswith("{} 24 0")  # batches of strings: nothing to count, no samples row


def test_a_python_writer_under_way_hands_the_compiled_count_on() -> None:
    """While another thread's Python count is between its read and its write (``Phase.counting``), watch()'s
    count in C takes the counters' lock through the Python function; the total is the same."""
    output = compiled_and_pure_output(PROGRAM.split("for how in")[0] + 'run("another thread counts", batch_size=8)\n')
    assert output.strip().endswith("{'samples': 184} 24 0"), output


@pytest.mark.parametrize("workers", [0, 2])
def test_watch_counts_the_batches_its_workers_make(workers: int) -> None:
    """Batches made in worker processes are counted as those made in the main process, and a validation loop's
    in its own phase."""
    sw = Stopwatch()
    sw.enable()
    train = DataLoader(TensorDataset(torch.randn(64, 3)), batch_size=16, num_workers=workers)
    val = DataLoader(TensorDataset(torch.randn(40, 3)), batch_size=16, num_workers=workers)
    for _ in sw.watch(train):
        for _ in sw.watch(val, phase="val"):
            pass
    summary = sw.summary()
    assert summary.phases["train"].counters == {"samples": 48}  # 4 batches, the first a one-off
    # 4 validation loops of 3 batches (16, 16, 8), each loop's first one-off: 24 samples a loop
    assert summary.phases["val"].counters == {"samples": 96}


@pytest.mark.parametrize("count", [False, True])
def test_auto_counts_each_batch_once_and_a_programs_own_count_replaces_it(auto: None, count: bool) -> None:
    """auto() counts a batch's samples itself (its watched loop does not count them again); a program that counts
    its samples in an auto() loop has its count alone."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 3), torch.randn(64, 1)), batch_size=16)
    for _ in range(2):
        for x, y in loader:
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
            if count:
                stepwatch.count(samples=1)
    phase = stepwatch.summary().phases["train"]
    # 2 epochs of 4 batches, each epoch's first a one-off: 6 steps measured
    assert phase.steps == 6
    assert phase.counters == ({"samples": 6} if count else {"samples": 6 * 16})  # the program's 1 a step, or 16


def test_a_programs_own_count_after_a_reset_is_still_its_count_alone() -> None:
    """After ``reset()`` (dropping warm-up by hand) a program that counts its samples still has its count alone:
    what watch() counts again after the reset is taken back at the program's next count."""
    sw = Stopwatch()
    sw.enable()
    loader = DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=4)
    for index, _ in enumerate(sw.watch(loader)):
        sw.count(samples=1)
        if index == 3:
            sw.reset()
    assert sw.summary().phases["train"].counters == {"samples": 6}  # steps 4 to 9
