"""``stepwatch run``: run a program as ``python`` would, with auto-instrumentation, and report at the end.

The program runs as ``__main__`` in this process (``runpy``), with the ``sys.argv``, ``sys.path[0]`` and
``__file__`` that ``python script.py`` or ``python -m module`` would give it; its exit code, exceptions and
tracebacks are its own (stepwatch's frames are cut from the traceback). The run is saved and the report printed
on stderr when it ends: normally, by ``sys.exit``, by an uncaught exception, by SIGTERM or by Ctrl-C.
"""

from __future__ import annotations

import argparse
import builtins
import io
import os
import runpy
import signal
import sys
import types
from collections.abc import Sequence
from types import TracebackType

_VALUED = {"-o", "--out", "--warmup", "--active", "--every", "--device", "--val-phase", "--trace-steps", "--peak-flops"}
_FLAGS = {"-q", "--quiet", "-h", "--help", "--stop", "--live", "--flops"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepwatch run",
        usage="stepwatch run [options] (script.py | -m module) [args ...]",
        description="Run a training program unchanged and show where each step's time goes.",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module as a script, like python -m")
    parser.add_argument("-o", "--out", help="where to save the run (default: <script>.stepwatch.json here)")
    parser.add_argument("--warmup", type=int, default=None, help="steps skipped at the start of each epoch")
    parser.add_argument("--active", type=int, default=None, help="steps measured after warm-up (default: all)")
    parser.add_argument("--every", type=int, default=None, help="with --active: measure ACTIVE of every EVERY")
    parser.add_argument(
        "--device",
        default="auto",
        help="time this device's work too (cuda, cuda:1), or none; default auto: once the program uses CUDA",
    )
    parser.add_argument("--val-phase", default="val", help="the name of loops without backward (default: val)")
    parser.add_argument(
        "--trace-steps",
        type=int,
        metavar="N",
        help="also keep the timeline of the last N steps, for stepwatch export run.json -o trace.json",
    )
    parser.add_argument(
        "--stop",
        action="store_true",
        help="with --active: end the program (exit status 0, run saved) once the window is measured and reported;"
        " the training it ran was for measuring only",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="show a live panel on the terminal while it trains (a plain line every 30 s off a terminal);"
        " also STEPWATCH_LIVE=1",
    )
    parser.add_argument(
        "--flops",
        action="store_true",
        help="count the FLOPs of one training step (kept out of the timing): FLOP/s in the report, and MFU on a"
        " known accelerator",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        metavar="FLOPS",
        help="the device's peak FLOP/s for MFU (e.g. 989e12), where the built-in table does not know it;"
        " implies --flops",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no report on stderr (the run is still saved)")
    return parser


def split(
    arguments: Sequence[str], valued: frozenset[str] | set[str] = _VALUED, flags: frozenset[str] | set[str] = _FLAGS
) -> tuple[list[str], list[str]]:
    """stepwatch's options, then the program and its arguments: the program starts at the first argument
    that is not one of stepwatch's options (or right after ``-m module``)."""
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if argument == "-m":
            return list(arguments[: index + 2]), list(arguments[index + 2 :])
        if argument == "--":
            return list(arguments[:index]), list(arguments[index + 1 :])
        name = argument.split("=", 1)[0]
        if name in valued and "=" not in argument:
            index += 2
        elif name in valued or argument in flags or (argument.startswith("-") and argument != "-"):
            index += 1  # an option of stepwatch's, or one it does not know: said so, not taken for the script
        else:
            break
    return list(arguments[:index]), list(arguments[index:])


def main(arguments: Sequence[str]) -> int:
    """Runs ``stepwatch run ARGS``; returns the exit code (or exits as the program does)."""
    own, program = split(arguments)
    parser = build_parser()
    try:
        args = parser.parse_args(own)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.stop and (args.active is None or args.every is not None):
        print("stepwatch run: --stop needs --active N (a window that closes)", file=sys.stderr)
        return 2
    refused = check_program("stepwatch run", parser, args.module, program)
    if refused is not None:
        return refused
    if args.module is not None:
        missing = _module_missing(args.module)
        if missing is not None:  # one line, as python -m says it, and no run saved
            print(f"stepwatch run: {missing}", file=sys.stderr)
            return 1
    from . import _save_at_exit
    from ._autostart import auto, run_file
    from ._config import live_from_env
    from ._default_instance import stopwatch as _default

    target = args.module if args.module is not None else program[0]
    try:
        _default.enable(
            out=args.out if args.out is not None else run_file(target, module=args.module is not None),
            warmup=args.warmup,
            active=args.active,
            every=args.every,
            trace_steps=args.trace_steps,
            stop=args.stop,
            live=True if args.live or live_from_env() else None,
            flops=True if args.flops else None,
            peak_flops=args.peak_flops,
        )
        _default.window_end.report = not args.quiet
        auto(val_phase=args.val_phase, device=args.device)
    except (ValueError, OSError) as error:
        print(f"stepwatch run: {error}", file=sys.stderr)
        return 2
    if not args.quiet:
        _save_at_exit.install(_default, report=True)
    return run_program(args.module, program)


def check_program(command: str, parser: argparse.ArgumentParser, module: str | None, program: list[str]) -> int | None:
    """The exit status for a program that cannot run (none given, or a missing script), said in one line; None
    when it can."""
    if module is None and not program:
        parser.print_usage(sys.stderr)
        print(f"{command}: give a script to run, or -m module", file=sys.stderr)
        return 2
    if module is None and not os.path.isfile(program[0]):
        print(f"{command}: {program[0]}: no such file", file=sys.stderr)
        return 2
    return None


def _module_missing(module: str) -> str | None:
    """Why ``python -m module`` could not run it, in python's words; None when it can be found."""
    import importlib.util

    sys.path.insert(0, os.getcwd())  # where python -m looks first
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:
        hint = f". Try using {module[:-3]!r} instead of {module!r} as the module name" if module.endswith(".py") else ""
        return f"Error while finding module specification for {module!r} ({type(error).__name__}: {error}){hint}"
    finally:
        sys.path.pop(0)
    return None if spec is not None else f"No module named {module}"


def run_program(module: str | None, program: list[str]) -> int:
    """Runs the program as ``__main__``; what it raises is reported as Python would report it."""
    try:
        if module is not None:
            sys.argv = [module, *program]  # runpy puts the module's file in argv[0], as python -m does
            sys.path[0] = os.getcwd()
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _run_script(program)
    except SystemExit:
        raise  # its code, or its message, as python gives them
    except KeyboardInterrupt as interrupt:
        _print_exception(interrupt)
        _die_of_sigint()
    except BaseException as error:
        _print_exception(error)
        return 1
    return 0


def _run_script(program: list[str]) -> None:
    """Runs a script file as ``python script.py args`` does: ``sys.argv`` as typed, its directory first on
    ``sys.path``, an absolute ``__file__``, and a fresh ``__main__`` module (pickling, spawned workers)."""
    script = os.path.abspath(program[0])
    sys.argv = list(program)
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    with io.open_code(script) as file:
        code = compile(file.read(), script, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    main.__spec__ = None
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _print_exception(error: BaseException) -> None:
    """The traceback through ``sys.excepthook`` (stepwatch's own saves the run and reports), from the
    program's first frame, as ``python`` would print it."""
    tb = _program_frames(error.__traceback__)
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _program_frames(tb: TracebackType | None) -> TracebackType | None:
    here = os.path.dirname(os.path.abspath(__file__))
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(here) or filename in ("<frozen runpy>", runpy.__file__)):
            break
        tb = tb.tb_next
    return tb


def _die_of_sigint() -> None:
    """Ends the process as an uncaught KeyboardInterrupt ends python: killed by SIGINT (exit status 130)."""
    from ._save_at_exit import save_all

    save_all("KeyboardInterrupt")
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(130)  # where a signal cannot kill
