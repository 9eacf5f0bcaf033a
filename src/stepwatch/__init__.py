"""stepwatch: where each training step's time goes.

    import stepwatch
    stepwatch.enable()                          # or run with STEPWATCH=1
    for batch in stepwatch.timed_iter(loader):  # the wait -> "loader", the body -> "step"
        with stepwatch.timed("forward"):
            ...
        stepwatch.count(samples=len(batch))
    print(stepwatch.report())

The module-level functions use one default :class:`Stopwatch`; create more for independent recordings.
"""

from __future__ import annotations

from . import _default_instance, _display
from ._all_ranks import AllRanks, load
from ._autostart import auto
from ._compared import Compared
from ._compared import compare_runs as compare
from ._config import ConfigError, auto_from_env, enabled_from_env, live_from_env, out_from_env
from ._dataloader.transforms import TimedTransform as timed_transform
from ._figures import StageStats
from ._recorder import Stopwatch
from ._render import FORMATS
from ._render import notebook as _notebook
from ._run_file import FormatError
from ._summary import PhaseSummary, Summary
from ._tune import tune
from ._window_end import StoppedByStepwatch

__all__ = [
    "AllRanks",
    "Compared",
    "ConfigError",
    "FormatError",
    "PhaseSummary",
    "StageStats",
    "StoppedByStepwatch",
    "Stopwatch",
    "Summary",
    "__version__",
    "auto",
    "compare",
    "count",
    "disable",
    "enable",
    "is_enabled",
    "load",
    "load_state_dict",
    "log_every",
    "metrics",
    "render",
    "report",
    "reset",
    "save",
    "state_dict",
    "summary",
    "timed",
    "timed_iter",
    "timed_transform",
    "tune",
    "watch",
]

try:
    from importlib.metadata import version as _version

    __version__ = _version("stepwatch")
except Exception:  # running from a source tree that is not installed
    __version__ = "0+unknown"

_default = _default_instance.stopwatch = Stopwatch()

_display.register(Summary, _notebook.render_text, _notebook.summary_html)
_display.register(AllRanks, AllRanks.render, _notebook.ranks_html)
_display.register(Compared, _notebook.compared_text, _notebook.compared_html)

enable = _default.enable
disable = _default.disable
is_enabled = _default.is_enabled
timed = _default.timed
timed_iter = _default.timed_iter
watch = _default.watch
count = _default.count
report = _default.report
metrics = _default.metrics
log_every = _default.log_every
summary = _default.summary
save = _default.save
reset = _default.reset
state_dict = _default.state_dict
load_state_dict = _default.load_state_dict


def render(run: Summary | AllRanks, format: str = "text") -> str:
    """Render a summary in one of the registered formats: ``text``, ``csv`` or ``tsv`` (per measurement),
    ``json`` (the saved run), ``trace`` (Chrome / Perfetto, with ``trace_steps``), ``html`` (one page). The
    ranks of a job (``summary(ranks="all")``, ``load`` of an all-ranks file) render as the all-ranks report
    (``text``), the all-ranks file (``json``), or its page or trace; per measurement, render one rank's run."""
    try:
        renderer = FORMATS[format]
    except KeyError:
        raise ValueError(f"unknown format {format!r}; choose from {', '.join(FORMATS)}") from None
    if isinstance(run, Summary):
        return renderer.render(run)
    if format == "text":
        return run.render()
    if format == "json":
        from ._run_file import ranks_to_json

        return ranks_to_json(list(run.runs), run.world_size, run.missing) + "\n"
    if renderer.render_ranks is None:
        raise ValueError(f"the {format} format is per run: render one rank's run (job.runs[i]) as {format}")
    return renderer.render_ranks(run)


if auto_from_env():
    from ._autostart import start_from_env

    start_from_env()
elif enabled_from_env():
    try:
        _default.enable(out=out_from_env(), live=live_from_env() or None)
    except ValueError as _error:  # an unwritable STEPWATCH_OUT: said at start, not after the run
        raise ConfigError(f"STEPWATCH_OUT={out_from_env()!r}: {_error}") from None
