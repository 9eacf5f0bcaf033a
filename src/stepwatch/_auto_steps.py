"""The batches of a DataLoader loop that auto-instrumentation breaks down: the watched loop's batches, each one's
samples counted, and after each step what the session checks (an evaluation ended, the module calls to learn
again).

Where the C speedups are built this is ``_speedups.AutoSteps`` (``_auto_steps.c``): an iterator in C rather than
a second Python generator around the watched loop's, whose frame and bytecode every step ran (about 135 cache
lines a step more, counted cold by ``benchmarks/footprint.py``). :func:`python_steps` is the same in Python, and
what runs elsewhere. Both call ``begin()`` at the first batch and ``end(tracked, batches)`` once, when the loop
ends however it ends (its batches run out, it raised, it was closed or dropped).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from ._batch_size import batch_size
from ._block_base import AutoSteps
from ._counters import add_samples

if TYPE_CHECKING:
    from ._auto import AutoSession

Begin = Callable[[], tuple[Iterator[Any], bool, "int | None", int]]
"""Starts the loop: the watched batches, whether this thread's loop is the session's, the batch size of every
batch from the second to the ``full``-th (None: look into each), and ``full``."""
End = Callable[[bool, int], None]
"""Ends the loop: ``end(tracked, batches)``."""


def auto_steps(session: AutoSession, begin: Begin, end: End, counted: Any) -> Iterator[Any]:
    """The loop's batches; ``counted``: the stopwatch each batch's samples are counted on, or None."""
    if AutoSteps is not None:
        return AutoSteps(session, begin, end, counted, batch_size)  # type: ignore[no-any-return]
    return python_steps(session, begin, end, counted)


def python_steps(session: AutoSession, begin: Begin, end: End, counted: Any) -> Generator[Any, None, None]:
    """:class:`AutoSteps` in Python."""
    steps, tracked, uniform, full = begin()
    batches = 0
    try:
        for batch in steps:
            batches += 1
            if tracked and session.busy and session.loop_depth == 1:  # an optimizer step that raised, caught
                session.busy = 0
                session.open_blocks.clear()
            if counted is not None:  # a batch of torch's own batching is looked into once
                size = uniform if 1 < batches <= full else batch_size(batch)
                if batches == 1 and size != uniform:
                    full = 0  # not what its batch size says: every batch is looked into
                if size:
                    add_samples(counted, size)
            yield batch
            if session.evaluation is not None:  # an evaluation at the step's end ends before the next batch
                session.end_evaluation()
            if tracked and session.loop_depth == 1:
                session.steps_to_next_check -= 1
                if session.steps_to_next_check <= 0:
                    session.check_module_calls()
    finally:
        end(tracked, batches)
