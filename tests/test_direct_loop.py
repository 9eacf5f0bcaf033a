"""A timed loop's iterator in C in front of its generator (``DirectLoop``, ``_direct_loop.c``): the steady steps
run without resuming the generator, and every other way through a loop (an exception from the data, ``close()``,
``throw()``, a loop dropped, a loop iterated from inside its own fetch) behaves as the generator does."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader

from stepwatch import Stopwatch, _loops

pytestmark = pytest.mark.skipif(_loops.DirectLoop is None, reason="the compiled blocks were not built")


def warmed() -> Stopwatch:
    """A stopwatch whose own cost has been timed (its first steps), so that a loop's steps are steady from its
    second on."""
    sw = Stopwatch()
    sw.enable()
    for _ in sw.timed_iter(range(40)):
        pass
    return sw


def numbers(n: int, fail_at: int | None = None) -> Iterator[int]:
    for i in range(n):
        if i == fail_at:
            raise KeyError(i)
        yield i


def at_root(sw: Stopwatch) -> bool:
    return len(sw.stacks.thread_stack()) == 1


def test_the_steady_steps_do_not_resume_the_generator() -> None:
    sw = warmed()
    loop = sw.timed_iter(numbers(30))
    assert type(loop).__name__ == "DirectLoop" and loop.generator.gi_code is _loops.iterate.__code__
    resumed = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is _loops.iterate.__code__:
            resumed.append(frame.f_lineno)

    seen = []
    sys.setprofile(profile)
    try:
        for i in loop:
            seen.append(i)
    finally:
        sys.setprofile(None)
    assert seen == list(range(30))
    assert len(resumed) <= 4, resumed  # its start, the first steps, the end of the data: not the 26 steady ones
    phase = sw.summary().phases["train"]
    assert phase.stages["step"].calls >= 29 and at_root(sw)


def test_an_exception_from_the_data_is_raised_where_the_generator_would_raise_it() -> None:
    sw = warmed()
    seen = []
    with pytest.raises(KeyError) as raised:
        for i in sw.timed_iter(numbers(30, fail_at=12)):
            seen.append(i)
    assert seen == list(range(12)) and at_root(sw)
    assert any(entry.name == "numbers" for entry in raised.traceback)  # the data's own frame
    stages = sw.summary().phases["train"].stages
    assert stages["step"].calls >= 11


def test_close_throw_and_a_dropped_loop_end_it_as_a_break_does() -> None:
    sw = warmed()
    loop = sw.timed_iter(numbers(30))
    for i in loop:
        if i == 10:
            break
    loop.close()
    assert next(loop, "over") == "over" and at_root(sw)
    loop = sw.timed_iter(numbers(30))
    assert [next(loop) for _ in range(10)] == list(range(10))
    with pytest.raises(ValueError, match="thrown"):
        loop.throw(ValueError("thrown"))
    assert at_root(sw) and next(loop, "over") == "over"
    loop = sw.timed_iter(numbers(30))
    assert [next(loop) for _ in range(10)] == list(range(10))
    del loop  # the generator, held by the loop alone, closes at once
    assert at_root(sw)
    assert sw.summary().phases["train"].stages["step"].calls >= 3 * 9


def test_a_loop_iterated_from_inside_its_own_fetch_is_refused_as_a_running_generator() -> None:
    sw = warmed()
    loop: Any = None
    errors = []

    def data() -> Iterator[int]:
        for i in range(30):
            if i > 0:  # (the first fetch runs before the loop is assigned)
                try:
                    next(loop)
                except ValueError as error:
                    errors.append(str(error))
            yield i

    loop = sw.timed_iter(data())
    assert list(loop) == list(range(30))  # at every step: the generator's own, the first steady one and the rest
    assert errors == ["generator already executing"] * 29 and at_root(sw)


def test_a_loop_iterated_from_inside_its_own_sample_count_is_refused_as_a_running_generator() -> None:
    """``watch()`` counts each batch's samples with its step open (a batch's ``shape``, where the collate is the
    program's): a batch whose ``shape`` iterates the same loop is refused at every step, the first steady one
    included (the generator drives that one, and the loop's ``DirectLoop`` is not running), and takes no item."""
    sw = warmed()
    loop: Any = None
    refused = []

    class Batch:
        def __init__(self, index: int) -> None:
            self.index = index

        @property
        def shape(self) -> tuple[int]:
            if loop is not None:
                try:
                    next(loop)
                except ValueError as error:
                    refused.append(str(error))
            return (4,)

    data = DataLoader(list(range(30)), batch_size=1, collate_fn=lambda indices: Batch(indices[0]))
    loop = iter(sw.watch(data))
    assert [batch.index for batch in loop] == list(range(30))  # none taken by the nested next()
    assert refused == ["generator already executing"] * 29 and at_root(sw)
    assert sw.summary().phases["train"].counters["samples"] == 4 * 29  # each batch counted once (not the first)


def test_without_the_compiled_loop_the_generator_is_the_iterator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_loops, "DirectLoop", None)
    sw = warmed()
    loop = sw.timed_iter(numbers(5))
    assert loop.__class__.__name__ == "generator" and list(loop) == list(range(5))
