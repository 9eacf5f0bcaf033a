"""Where the default :class:`~stepwatch._recorder.Stopwatch` is kept: the one the module-level functions of
``stepwatch`` use, auto-instrumentation records with, and DataLoader workers record into.

``stepwatch/__init__`` makes it and puts it here as it is imported. This module imports nothing of stepwatch, so
the modules the recorder itself is built from (the workers' side, auto-instrumentation) reach the default
instance at call time without an import cycle.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._recorder import Stopwatch

stopwatch: Stopwatch
"""The default instance (``stepwatch._default``), set once by ``stepwatch/__init__``."""


def lends_to(other: Stopwatch) -> bool:
    """Whether :func:`lent_to` would lend the default's state to ``other`` (checked first: it is a context
    manager, a microsecond or two a batch)."""
    return other is not stopwatch and not stopwatch.is_enabled()  # noqa: F821 (set by stepwatch/__init__)


@contextlib.contextmanager
def lent_to(other: Stopwatch) -> Iterator[None]:
    """In the main process, while ``other`` (not the default) fetches a batch: blocks on the default stopwatch
    (``stepwatch.timed``, ``timed_transform``) record into ``other``, as they do in workers, so the same dataset
    code gives the same rows with 0 or N workers. Only while the default stopwatch is off (it would record
    nothing), by lending it ``other``'s state for the fetch. The one place, with :func:`share_state`, where a
    stopwatch's state is swapped whole: every part of it goes together."""
    default = stopwatch  # noqa: F821 (set by stepwatch/__init__)
    if not lends_to(other):
        yield
        return
    own = default.__dict__
    default.__dict__ = other.__dict__
    own["_blocks"].lent()
    try:
        yield
    finally:
        default.__dict__ = own
        own["_blocks"].follow_state()


def share_state(watcher: Stopwatch) -> None:
    """In a forked DataLoader worker: the loader's watching stopwatch (the worker's copy of it) records into the
    worker's default stopwatch, so that blocks on either come back alike."""
    own_blocks = watcher.__dict__["_blocks"]  # made before the fork: they record into the shared state too
    watcher.__dict__ = stopwatch.__dict__  # noqa: F821 (set by stepwatch/__init__)
    own_blocks.follow_state()
