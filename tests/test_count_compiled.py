"""``count()`` in C (``_counts.c``'s Counter) against the Python function it stands in for (``add_counts``): the
same counters at every moment a count can come, the same errors, and no count lost between threads."""

from __future__ import annotations

import math
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset

import stepwatch
from stepwatch import _block_base, _counters
from stepwatch._tree import DROPPED

Count = Callable[..., None]


def python_count(sw: stepwatch.Stopwatch) -> Count:
    return types.MethodType(_counters.add_counts, sw)


def compiled_count(sw: stepwatch.Stopwatch) -> Count:
    return sw.count


def moments(make_count: Callable[[stepwatch.Stopwatch], Count]) -> list[Any]:
    """Counts at each moment and with each kind of value; after each, (the train phase's counters, its calls),
    or the error raised."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    count = make_count(sw)
    seen: list[Any] = []

    def step(**units: Any) -> None:
        try:
            count(**units)
        except Exception as error:  # the error is what is compared
            seen.append(type(error).__name__)
            return
        phase = sw.tree.phases.get("train")
        seen.append((dict(phase.counters), phase.count_calls) if phase else None)

    loop = sw.timed_iter(range(6))
    next(loop)
    step(samples=8)  # the one-off first step
    next(loop)
    step(samples=8)  # a measured step
    step(samples=8, tokens=2.5, atoms=-3)  # several units, a float, a negative one
    with sw.timed("inner"):
        step(tokens=0.5)  # inside a block of the step
    step(samples=True)  # not an int: checked and converted by the Python function
    step(samples=math.inf)
    step(samples="8")
    step(samples=2**62)
    step(samples=2**62)  # past a 64-bit int: the sum of two ints added as Python adds them
    step(samples=10**400)  # an int past a float's range: saturates
    step(tokens=_counters.COUNTER_LIMIT)  # the float counter saturates
    step(tokens=-_counters.COUNTER_LIMIT * 0.5)
    step(many=1, of=2, units=3, at=4, once=5, more=6, than=7, eight=8, nine=9)
    step()  # no unit: a call all the same
    sw.disable()
    step(samples=8)  # not measuring
    sw.enable()
    next(loop)
    step(samples=8)
    sw.stacks.thread_stack().append((None, DROPPED, 0))
    step(samples=8)  # inside a dropped step
    sw.stacks.thread_stack().pop()
    loop.close()
    return seen


def moments_with_a_val_loop(make_count: Callable[[stepwatch.Stopwatch], Count]) -> list[Any]:
    """Counts in an evaluation loop nested in a training step go to that phase."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    count = make_count(sw)
    for _ in sw.timed_iter(range(3)):
        count(samples=4)
        for _ in sw.timed_iter(range(3), phase="val"):
            count(samples=2, tokens=1.5)
    summary = sw.summary()
    return [(name, dict(phase.counters), phase.count_calls) for name, phase in summary.phases.items()]


def test_the_compiled_count_is_used_where_the_speedups_are_built() -> None:
    sw = stepwatch.Stopwatch()
    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    assert type(sw.count).__name__ == "Counter"
    assert type(stepwatch.count).__name__ == "Counter"


def test_the_compiled_count_adds_what_the_python_one_does_at_every_moment() -> None:
    expected = moments(python_count)
    assert moments(compiled_count) == expected
    assert expected[:3] == [({}, 0), ({"samples": 8}, 1), ({"samples": 16, "tokens": 2.5, "atoms": -3}, 2)]
    assert expected[4:7] == ["TypeError"] * 3  # a bool, an infinite float, a string
    assert expected[8][0]["samples"] == 16 + 2**63  # past a 64-bit int
    assert expected[9][0]["samples"] == _counters.COUNTER_LIMIT  # an int past a float's range saturates
    assert expected[14] == expected[13] and expected[16] == expected[15]  # off; in a dropped step


def test_counts_in_a_nested_evaluation_loop_go_to_its_phase_either_way() -> None:
    assert moments_with_a_val_loop(compiled_count) == moments_with_a_val_loop(python_count)


def test_a_positional_count_is_refused_as_the_python_function_refuses_it() -> None:
    sw = stepwatch.Stopwatch()
    with pytest.raises(TypeError):
        sw.count(8)  # type: ignore[call-arg]


def test_no_count_is_lost_between_threads_counting_in_c_and_in_python() -> None:
    """Threads counting in C (no lock while no Python writer is at work) and in Python (under the lock, counting
    themselves in) at once: every count arrives."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    root = sw.tree.phase("train").root
    threads_done: list[int] = []
    rounds = 20_000

    def work(count: Count) -> None:
        sw.stacks.thread_stack().append((None, root, 0))  # a phase root: counts go to "train"
        for _ in range(rounds):
            count(samples=1)
        threads_done.append(1)

    counts = [compiled_count(sw), python_count(sw), compiled_count(sw), python_count(sw)]
    threads = [threading.Thread(target=work, args=(count,)) for count in counts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    phase = sw.tree.phases["train"]
    assert len(threads_done) == len(threads)
    assert phase.counters["samples"] == rounds * len(threads)
    assert phase.count_calls == rounds * len(threads)
    assert phase.counting == 0


def test_the_compiled_count_waits_for_a_python_writer_holding_the_lock() -> None:
    """While a Python writer is between its read and its write (``phase.counting``), the C count takes the lock."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    loop = sw.timed_iter(range(3))
    next(loop)
    next(loop)
    phase = sw.tree.phases["train"]
    counted = threading.Event()

    def count_in_c() -> None:
        sw.count(samples=1)
        counted.set()

    with sw.tree.count_lock:
        phase.counting += 1
        thread = threading.Thread(target=count_in_c)
        thread.start()
        assert not counted.wait(0.3)  # blocked on the lock: it did not write under the Python writer
        phase.counters["samples"] = 10
        phase.counting -= 1
    assert counted.wait(10)
    thread.join()
    assert phase.counters["samples"] == 11
    loop.close()


class CountingReads(Dataset[int]):
    """Counts its reads on the module-level stopwatch, as dataset code does."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        stepwatch.count(reads=1)
        return index


def test_a_count_on_the_default_stopwatch_goes_where_its_state_is_lent() -> None:
    """With 0 workers the default stopwatch (off) lends itself the watching one's state for each fetch: its
    compiled count, which keeps the stacks and tree it counts into, follows there and back."""
    sw = stepwatch.Stopwatch()
    sw.enable()
    for _ in sw.watch(DataLoader(CountingReads(), batch_size=2)):
        pass
    # (and watch()'s own count of the samples: 4 batches of 2 after the one-off first step)
    assert dict(sw.summary().phases["train"].counters) == {"reads": 10, "samples": 8}
    assert not stepwatch.summary().phases  # the default, off, counted nothing of its own
    stepwatch.enable()
    try:
        for _ in stepwatch.timed_iter(range(3)):
            stepwatch.count(samples=2)
        assert dict(stepwatch.summary().phases["train"].counters) == {"samples": 4}  # its own state again
    finally:
        stepwatch.disable()
        stepwatch.reset()


def test_a_subclass_keeps_its_own_count_and_timed() -> None:
    """The compiled ``count`` and ``timed`` are set on a stopwatch only where its class does not define its own."""

    class Mine(stepwatch.Stopwatch):
        def timed(self, stage: str) -> Any:
            return f"mine {stage}"

        def count(self, **units: float) -> None:
            self.counted = units

    mine = Mine()
    assert mine.timed("x") == "mine x"
    mine.count(samples=2)
    assert mine.counted == {"samples": 2}
