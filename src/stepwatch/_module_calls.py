"""Which module calls go through stepwatch's Python wrapper: all of them while learning, then only those of
the classes seen as a step's outermost calls.

Routing every ``nn.Module.__call__`` through a Python wrapper costs about a microsecond per submodule call, so
a model of 500 module calls paid 500 us a step for the one outermost call that is timed. While learning, the
wrapper sits on ``nn.Module.__call__`` and records the class of each outermost call of a step (the model, a
loss module, a DDP or compiled wrapper). After a step that found no new class (at least two steps into a loop),
the wrapper moves onto those classes alone and ``nn.Module.__call__`` is torch's own again: submodule calls cost
what they cost without stepwatch. Each DataLoader loop that starts (an epoch, a validation loop) and every
:data:`RELEARN_EVERY` steps, it learns again for a step or two, so a class first called later is found then.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._patches import Patches

logger = logging.getLogger("stepwatch")

LEARNING_STEPS = 2
"""Steps of a loop learnt before the wrapper narrows (more while new classes are found)."""
RELEARN_EVERY = 500
"""Steps between two single steps of learning again, once narrowed."""
_MAX_CLASSES = 64


class ModuleCalls:
    """The classes of outermost module calls, and where the module-call wrapper is installed."""

    def __init__(self, patches: Patches) -> None:
        self._patches = patches
        self.outer: dict[type, None] = {}  # classes of outermost calls seen, in order: read by the wrapper
        self.narrowed = False  # the wrapper is on the classes in ``outer``, not on nn.Module
        self._torch: Any = None
        self._learning = LEARNING_STEPS
        self._new = False

    def install(self, torch: Any) -> None:
        from ._patches import wrap_module_call

        self._torch = torch
        self._patches.replace(torch.nn.Module, "__call__", wrap_module_call)

    def found(self, cls: type) -> None:
        """The wrapper saw an outermost call of a class not seen before."""
        if len(self.outer) < _MAX_CLASSES:
            self.outer[cls] = None
            self._new = True

    def loop_started(self) -> int:
        """A DataLoader loop starts: learn again for its first steps. Returns the number of steps after which
        :meth:`step_ended` is next due (the loop counts them down; it keeps the only countdown)."""
        self._widen(LEARNING_STEPS)
        return 1

    def step_ended(self) -> int:
        """A step of the loop being broken down ended, and the countdown this returned last fell to 0: learnt
        enough, or time to learn again. Returns the next countdown: a step while learning, :data:`RELEARN_EVERY`
        once narrowed."""
        if self.narrowed:
            self._widen(1)
            return 1
        self._learning = max(self._learning - 1, 1 if self._new else 0)
        self._new = False
        if self._learning == 0 and self._narrow():
            return RELEARN_EVERY
        return 1

    def _narrow(self) -> bool:
        """Moves the wrapper from nn.Module onto the outermost classes; False where it stays general."""
        from ._patches import wrap_module_call, wrap_outer_module_call

        torch = self._torch
        if torch is None or len(self.outer) >= _MAX_CLASSES:
            return False  # a program of that many outermost classes stays on the general wrapper
        module = torch.nn.Module
        self._patches.restore(module, "__call__")
        try:
            for cls in self.outer:
                if cls is not module and not self._patches.patched(cls, "__call__"):
                    self._patches.replace(cls, "__call__", wrap_outer_module_call)
        except (TypeError, AttributeError) as error:  # a class that takes no attribute: back to the general one
            logger.debug("stepwatch: module calls stay wrapped on nn.Module: %s", error)
            self._patches.replace(module, "__call__", wrap_module_call)
            return False
        self.narrowed = True
        return True

    def _widen(self, steps: int) -> None:
        from ._patches import wrap_module_call

        self._learning, self._new = steps, False
        if self.narrowed and self._torch is not None:
            self._patches.replace(self._torch.nn.Module, "__call__", wrap_module_call)
            self.narrowed = False
