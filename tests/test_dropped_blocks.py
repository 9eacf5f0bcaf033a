"""A block of a stopwatch switched off after having been on (``DroppedBlock``): its entry and exit in C
(``_dropped_enter``/``_dropped_exit`` of ``_speedups.BlockBase``) against the Python twin."""

from __future__ import annotations

import threading

import pytest

from stepwatch import Stopwatch
from stepwatch._blocks import DroppedBlock

from .test_speedups import compiled_and_pure_output

PROGRAM = """
import threading
import stepwatch

sw = stepwatch.Stopwatch()
sw.enable()
for i in sw.timed_iter(range(3)):
    with sw.timed("a"):
        pass
sw.disable()

class Notes(list):  # not a list exactly: its own append and remove are called
    pass

a, b = sw.timed("a"), sw.timed("b")
b.inside = Notes()
with a:  # noted, then taken back
    with b:
        pass
print(type(a).__name__, a.inside, list(b.inside))
other = threading.Thread(target=b.__enter__)  # another thread's note, left there
other.start()
other.join()
print(len(b.inside))
try:
    with b:  # this thread's note taken back; the other thread's stays
        raise KeyError("inside")
except KeyError:
    pass
print(len(b.inside))
for i in sw.timed_iter(range(4)):
    with a:  # its exit, looked up while off, finds no note: stepwatch was switched on inside it
        if i == 1:
            sw.enable()
        with sw.timed("inner"):
            pass
summary = sw.summary()
print(sorted((path, stage.calls) for path, stage in summary.phases["train"].stages.items()))
print(sw.span.dropped_blocks, len(a.inside))
"""


def test_dropped_blocks_do_in_c_what_the_python_ones_do() -> None:
    """Notes taken and given back (a plain list and a subclass), another thread's note kept, an exception through
    a dropped block, and a block whose exit finds no note (the stopwatch switched on inside it): the same output
    with the compiled blocks and with the Python twin."""
    from stepwatch import _block_base

    if not _block_base.COMPILED:
        pytest.fail("the development install was expected to build the C speedups")
    for method in ("__enter__", "__exit__"):  # here, the compiled ones: methods of the compiled BlockBase
        assert type(vars(DroppedBlock)[method]).__name__ == "BlockMethod"
        assert vars(DroppedBlock)[method].__objclass__ is _block_base.BlockBase
    lines = compiled_and_pure_output(PROGRAM).splitlines()
    assert lines[0] == "DroppedBlock [] []"
    assert lines[1:3] == ["1", "1"]
    # (the second loop started while off: a plain loop) the inner block opened inside the dropped one, once on,
    # is dropped with it rather than shown at the top level; the next two steps' are under `a`
    assert "('a/inner', 2)" in lines[3] and "('inner'," not in lines[3]
    assert lines[4] == "0 0"


def test_a_dropped_block_notes_each_thread_inside_it_once_a_call() -> None:
    """Two threads inside one dropped block at once: one note each while inside, none after."""
    sw = Stopwatch()
    sw.enable()
    sw.disable()
    block = sw.timed("shared")
    assert type(block) is DroppedBlock
    inside = threading.Event()
    leave = threading.Event()
    notes: list[int] = []

    def worker() -> None:
        with block:
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(10)
    with block:
        notes = list(block.inside)
    leave.set()
    thread.join(10)
    assert sorted(notes) == sorted([thread.ident, threading.get_ident()])
    assert block.inside == []
