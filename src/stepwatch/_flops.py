"""FLOPs per training step, counted on one step and kept out of the timing (``Stopwatch(flops=True)``).

torch's ``FlopCounterMode`` counts what ran (matrix products, convolutions, attention: the operations its formula
registry knows; elementwise work is not counted, as in every MFU figure). It slows the step it counts, so it
counts one: the last warm-up step, or, with fewer than two warm-up steps, the second step, which is then taken out
of the measured window (the first step is a one-off, apart from the steady state anyway). The step is the training
loop's (the main phase's): forward, loss and backward; what ran inside ``backward`` is the ``backward`` share,
the rest ``forward``. The dtype the products ran in (the most FLOPs) and the device's name pick the peak for MFU
(``_peaks``). What is read from torch here is imported when counting starts.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

from ._constants import VAL_PHASE

if TYPE_CHECKING:
    from ._recorder import Stopwatch

logger = logging.getLogger("stepwatch")

_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32", "torch.float64": "fp64"}


class FlopCount:
    """The counting of one stopwatch: started and ended between two training steps (a call of its periodic
    ticks), its result kept in :attr:`counted` as the run's metadata saves it."""

    def __init__(self, sw: Stopwatch) -> None:
        self.sw = sw
        self.counted: dict[str, Any] = {}
        """phase -> {"step", "forward", "backward": FLOPs per step, "at_step", "dtype", "device"}."""
        self.counter: Any = None
        self.backward = 0
        self.dtypes: Counter[str] = Counter()
        self.phase = ""
        self.step = 0
        self.seen = 0
        """Training steps ended so far (ticks outside an evaluation phase)."""
        self.quiet: Any = None
        self.skipped: str | None = None
        """Why no step was counted (torch.compile in use), for the report."""
        self.remove = sw.periodic.add(1, self.tick, "flop counting")

    def tick(self, step: int) -> None:
        """Between training steps ``step`` and ``step + 1``: starts the counting before the step chosen, ends
        it after."""
        if self.counter is not None:
            self.finish()
            return
        if self.sw.stacks.phase_name() == VAL_PHASE:
            return  # an evaluation loop that runs first (Lightning's sanity check): not a training step
        self.seen += 1
        chosen = max(self.sw.schedule.warmup, 2)
        if self.seen + 1 == chosen:
            self.start(self.seen + 1, taken_out=chosen > self.sw.schedule.warmup)
        elif self.seen + 1 > chosen:
            self.remove()  # past it (the loop began after a resume): nothing more to do each step

    def start(self, step: int, taken_out: bool) -> None:
        if self.sw.compiles.events and not self._runs_eagerly():  # compiled code ran in this run's steps
            self.remove()
            self.skipped = (
                "not counted: the model runs under torch.compile, and a compiled function called under torch's FLOP"
                " counter goes back to eager for the rest of the run (under stepwatch run, a model compiled whole is"
                " counted on an eager step)"
            )
            logger.warning("stepwatch: FLOPs %s", self.skipped)
            return
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        count = getattr(counter, "_count_flops", None)
        tracker = getattr(counter, "mod_tracker", None)
        if count is not None and tracker is not None:
            counter._count_flops = self._split(counter, count, tracker)  # type: ignore[method-assign]
        self.counter, self.backward, self.dtypes = counter, 0, Counter()
        self.phase, self.step = self.sw.stacks.phase_name(), step
        if taken_out:
            self.sw.stacks.set_window(False)  # its time is not measured: the next step opens the window again
        self.quiet = warnings.catch_warnings()
        self.quiet.__enter__()  # the counter's module hooks make a compiled model warn of global hooks, once
        warnings.filterwarnings("ignore", message="Using `torch.compile\\(module\\)` when there are global hooks")
        counter.__enter__()  # type: ignore[no-untyped-call]

    def _runs_eagerly(self) -> bool:
        """Whether auto-instrumentation can run the counted step's model eagerly: it records for this stopwatch
        and the step's outermost model is a compiled one (its ``_orig_mod`` is called instead, uncompiled, for
        that step)."""
        session = getattr(sys.modules.get("stepwatch._patches"), "session", None)
        if session is None or session.sw is not self.sw or session.last_model is None:
            return False
        model = session.last_model()
        return model is not None and hasattr(model, "_orig_mod")

    def _split(self, counter: Any, count: Any, tracker: Any) -> Any:
        """torch's own counting, also noting what ran in backward and the dtype of each product."""

        def counting(func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            before = sum(counter.flop_counts["Global"].values())
            result = count(func_packet, out, args, kwargs)
            added = sum(counter.flop_counts["Global"].values()) - before
            if added:
                if tracker.is_bw:
                    self.backward += added
                dtype = getattr(args[0], "dtype", None) if args else None
                self.dtypes[_DTYPES.get(str(dtype), str(dtype))] += added
            return result

        return counting

    def finish(self) -> None:
        """Ends the counting under way, if any, and keeps its result."""
        counter, self.counter = self.counter, None
        if counter is None:
            return
        self.remove()
        if self.quiet is not None:
            self.quiet.__exit__(None, None, None)
            self.quiet = None
        try:
            counter.__exit__(None, None, None)
            total = int(counter.get_total_flops())
        except Exception as error:  # a counter torch could not finish: no figure rather than a failed training
            logger.warning("stepwatch: counting FLOPs failed (%s); no FLOP/s in the report", error)
            return
        dtype = self.dtypes.most_common(1)[0][0] if self.dtypes else None
        self.counted[self.phase] = {
            "step": total,
            "forward": total - self.backward,
            "backward": self.backward,
            "at_step": self.step,
            "dtype": _tf32(dtype),
            "device": _device_name(),
        }


def _tf32(dtype: str | None) -> str | None:
    """fp32 products run as TF32 on tensor cores when torch allows it (``set_float32_matmul_precision``)."""
    if dtype != "fp32":
        return dtype
    import torch

    cuda = getattr(torch, "cuda", None)
    on_gpu = cuda is not None and cuda.is_available() and cuda.is_initialized()
    if on_gpu and (torch.get_float32_matmul_precision() != "highest" or torch.backends.cuda.matmul.allow_tf32):
        return "tf32"
    return dtype


def _device_name() -> str | None:
    """The accelerator's name when one is in use (CUDA initialized), else None (a CPU: no known peak)."""
    import torch

    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    try:
        return str(cuda.get_device_name())
    except Exception:
        return None
