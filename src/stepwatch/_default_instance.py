"""Where the default :class:`~stepwatch._recorder.Stopwatch` is kept: the one the module-level functions of
``stepwatch`` use, auto-instrumentation records with, and DataLoader workers record into.

``stepwatch/__init__`` makes it and puts it here as it is imported. This module imports nothing of stepwatch, so
the modules the recorder itself is built from (the workers' side, auto-instrumentation) reach the default
instance at call time without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._recorder import Stopwatch

stopwatch: Stopwatch
"""The default instance (``stepwatch._default``), set once by ``stepwatch/__init__``."""
