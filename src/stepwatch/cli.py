"""The ``stepwatch`` command: read saved runs and print or export them."""

from __future__ import annotations

import argparse
import gzip
import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._compared import compare_runs
from ._ranks import merge_ranks
from ._render import FORMATS, format_for_path
from ._run_file import FormatError, write_atomically
from ._summary import Summary

if TYPE_CHECKING:
    from ._all_ranks import AllRanks


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepwatch", description="Where each training step's time goes.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = commands.add_parser(
        "report", help="print the report of a saved run, of several ranks' runs, or of a tuning (stepwatch tune -o)"
    )
    report.add_argument(
        "file", nargs="+", help="a run saved by stepwatch.save() or STEPWATCH_OUT; several: one per rank"
    )

    export = commands.add_parser("export", help="convert a saved run to another format")
    export.add_argument("file", help="a saved run")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.add_argument(
        "-f",
        "--format",
        choices=sorted(FORMATS),
        help="output format (default: guessed from --output's extension, else text)",
    )
    comparison = commands.add_parser("compare", help="compare two saved runs, stage by stage")
    comparison.add_argument("before", help="the earlier run")
    comparison.add_argument("after", help="the later run")
    comparison.add_argument(
        "--fail-if-slower",
        type=float,
        metavar="PCT",
        help="exit 1 when the time per step, or a stage named with --stage, got slower by more than PCT percent",
    )
    comparison.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="NAME",
        help="a stage to gate with --fail-if-slower (a path like step/forward, or a name); repeatable",
    )

    merge = commands.add_parser("merge", help="merge the runs of a job's ranks into one all-ranks file")
    merge.add_argument("file", nargs="+", help="the ranks' runs (runs/ddp.rank*.json), or all-ranks files")
    merge.add_argument("-o", "--output", required=True, help="the all-ranks file to write")
    plot = commands.add_parser("plot", help="draw a saved run, or two runs compared (needs stepwatch[plot])")
    plot.add_argument("file", nargs="+", help="a saved run or an all-ranks file; two: before and after")
    plot.add_argument("-o", "--output", required=True, help="the picture to write: .png, .svg or .pdf")
    commands.add_parser("run", help="run a training program unchanged and report where its steps' time goes")
    commands.add_parser("demo", help="train a small CNN twice and show what stepwatch tells (demo --help)")
    return parser


def _compare(args: argparse.Namespace) -> int:
    gate = args.fail_if_slower
    if gate is not None and not (math.isfinite(gate) and gate >= 0):
        print(f"stepwatch: --fail-if-slower needs a percentage of 0 or more, got {gate:g}", file=sys.stderr)
        return 2
    before_runs, after_runs = _load_runs([args.before]), _load_runs([args.after])
    if before_runs is None or after_runs is None:
        return 2
    try:
        compared = compare_runs(before_runs, after_runs, (args.before, args.after))
    except ValueError as error:  # no phase in common
        print(f"stepwatch: {error}", file=sys.stderr)
        return 2
    comparisons = compared.phases
    known = {change.path for comparison in comparisons for change in comparison.stages}
    unknown = [name for name in args.stage if not any(p == name or p.endswith(f"/{name}") for p in known)]
    if unknown:
        print(f"stepwatch: no stage named {', '.join(unknown)} in either run", file=sys.stderr)
        return 2
    sys.stdout.write(compared.render())
    if gate is None:
        return 0
    gated = comparisons[0]  # the main phase in common (train when both have it)
    pairs = ((args.before, gated.step.before), (args.after, gated.step.after))
    empty = [name for name, per_step in pairs if per_step is None]
    if empty:
        print(
            f"stepwatch: nothing to compare: {' and '.join(empty)} measured no steps in phase {gated.phase}",
            file=sys.stderr,
        )
        return 2
    failures = [f"{gated.phase}: {failure}" for failure in gated.slower_than(gate, args.stage)]
    if failures:
        print(f"stepwatch: slower by more than {gate:g}%: {'; '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def _load_jobs(paths: list[str]) -> list[AllRanks] | None:
    """Each file as a job: a saved run (a job of one rank) or an all-ranks file; None after one line on stderr."""
    from ._all_ranks import load_ranks

    jobs: list[AllRanks] = []
    for path in paths:
        try:
            jobs.append(load_ranks(path))
        except FormatError as error:
            print(f"stepwatch: {error}", file=sys.stderr)
            return None
        except OSError as error:
            print(f"stepwatch: {path}: cannot read: {error.strerror or error}", file=sys.stderr)
            return None
    return jobs


def _load_runs(paths: list[str]) -> list[Summary] | None:
    """The runs in saved files and all-ranks files, or None after one line on stderr."""
    jobs = _load_jobs(paths)
    return None if jobs is None else [run for job in jobs for run in job.runs]


def _one_job(path: str, job: AllRanks) -> AllRanks | None:
    """A file's job as ``report`` takes it (ordered by rank, checked: one run per rank, a rank that measured a
    step), or None after one line on stderr: what ``report`` refuses, ``export`` and ``plot`` refuse too."""
    from ._all_ranks import combine_jobs

    try:
        checked = combine_jobs([(path, job)])
        if len(checked.runs) > 1:
            checked.report()
    except ValueError as error:
        print(f"stepwatch: {path}: {error}", file=sys.stderr)
        return None
    return checked


def _report_ranks(paths: list[str]) -> int:
    """The report of one run, else the all-ranks report of an all-ranks file or of one run per rank (merged
    offline)."""
    from ._all_ranks import combine_jobs
    from ._render import missing_line

    if len(paths) == 1:  # a tuning saved by stepwatch tune -o
        from ._tuning import load_tuning

        try:
            tuning = load_tuning(paths[0])
        except ValueError as error:
            print(f"stepwatch: {paths[0]}: {error}", file=sys.stderr)
            return 2
        if tuning is not None:
            sys.stdout.write(tuning.render())
            return 0
    jobs = _load_jobs(paths)
    if jobs is None:
        return 2
    try:
        job = combine_jobs(list(zip(paths, jobs, strict=True)))
    except ValueError as error:
        print(f"stepwatch: {error}", file=sys.stderr)
        return 2
    if len(job.runs) == 1:
        sys.stdout.write(FORMATS["text"].render(job.runs[0]))
        if job.missing:  # a job where only this rank answered
            sys.stdout.write(
                f"{missing_line(job.missing)} (1 of {job.world_size} ranks answered: this report is one rank's)\n"
            )
        return 0
    try:
        job.report()
    except ValueError as error:
        print(f"stepwatch: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(job.render())
    return 0


def _merge(paths: list[str], output: str) -> int:
    """``stepwatch merge``: one all-ranks file from the ranks' runs (ordered by rank, with the job's world size
    and the ranks it lacks), checked to make an all-ranks report."""
    from ._all_ranks import combine_jobs
    from ._run_file import save_ranks

    jobs = _load_jobs(paths)
    if jobs is None:
        return 2
    try:
        job = combine_jobs(list(zip(paths, jobs, strict=True)))
        job.report()
        save_ranks(list(job.runs), output, job.world_size, job.missing)
    except ValueError as error:
        print(f"stepwatch: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"stepwatch: {output}: cannot write: {error.strerror or error}", file=sys.stderr)
        return 2
    shape = f" of {job.world_size} (missing: rank {', '.join(map(str, job.missing))})" if job.missing else ""
    print(f"stepwatch: {len(job.runs)} ranks{shape} merged into {output}", file=sys.stderr)
    return 0


def _plot(paths: list[str], output: str) -> int:
    """``stepwatch plot``: one run (or all-ranks file) drawn, or two compared."""
    from ._render import plot as plots

    if len(paths) > 2:
        print("stepwatch: plot takes one run, or two to compare (before and after)", file=sys.stderr)
        return 2
    if not output.lower().endswith((".png", ".svg", ".pdf")):
        print(f"stepwatch: cannot tell the picture format of {output}: use .png, .svg or .pdf", file=sys.stderr)
        return 2
    jobs = _load_jobs(paths)
    if jobs is None:
        return 2
    checked = [_one_job(path, job) for path, job in zip(paths, jobs, strict=True)]
    if any(job is None for job in checked):
        return 2
    jobs = [job for job in checked if job is not None]
    try:
        if len(jobs) == 1:
            job = jobs[0]
            figure = plots.run_figure(job.runs[0] if len(job.runs) == 1 else job, paths[0])
        else:
            before, after = (merge_ranks(job.runs) for job in jobs)
            figure = plots.comparison_figure(before, after, paths[0], paths[1])
        plots.save(figure, output)
    except ImportError as error:
        print(f"stepwatch: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"stepwatch: {output}: cannot write: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"stepwatch: wrote {output}", file=sys.stderr)
    return 0


def _export(path: str, format_name: str | None, output: str | None) -> int:
    """``stepwatch export``: one run, or a job's ranks, in the format asked for or guessed from ``output``'s
    extension; written atomically to ``output`` (compressed for ``.gz``), else to stdout."""
    jobs = _load_jobs([path])
    if jobs is None:
        return 2
    one = _one_job(path, jobs[0])
    if one is None:
        return 2
    job, runs = one, one.runs
    chosen = FORMATS[format_name] if format_name else None
    if output:
        guessed = format_for_path(output)
        if chosen is None and guessed is None:
            known = ", ".join(ext for format in FORMATS.values() for ext in format.extensions)
            print(f"stepwatch: cannot tell the format of {output} ({known}): give --format", file=sys.stderr)
            return 2
        if chosen is not None and guessed is not None and guessed is not chosen:
            print(f"stepwatch: --format {chosen.name} does not match {output}", file=sys.stderr)
            return 2
        chosen = chosen or guessed
    chosen = chosen or FORMATS["text"]
    if chosen.name == "trace" and not any(run.trace for run in runs):
        print(
            f"stepwatch: {path} kept no timeline: record with Stopwatch(trace_steps=200) or"
            " stepwatch run --trace-steps 200",
            file=sys.stderr,
        )
        return 2
    if len(runs) == 1 and not (job.missing and chosen.render_ranks is not None):
        text = chosen.render(runs[0])
    elif chosen.render_ranks is not None:  # several ranks, or one that answered for a job of several
        text = chosen.render_ranks(job)
    else:
        print(
            f"stepwatch: {path} holds {len(runs)} ranks: export it as html or trace, or one rank's own file"
            f" as {chosen.name}",
            file=sys.stderr,
        )
        return 2
    if output:
        data = text.encode("utf-8")
        try:
            write_atomically(gzip.compress(data) if output.lower().endswith(".gz") else data, output)
        except OSError as error:
            print(f"stepwatch: {output}: cannot write: {error.strerror or error}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit code (2 for a bad file or bad arguments)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["run"]:  # the program's own arguments follow: parsed apart
        from ._runner import main as run_main

        return run_main(arguments[1:])
    if arguments[:1] == ["tune"]:  # the program's own arguments follow: parsed apart
        from ._tune_run import main as tune_main

        return tune_main(arguments[1:])
    if arguments[:1] == ["demo"]:  # the demo parses its own options
        from .demo import main as demo_main

        return demo_main(arguments[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.command == "compare":
        return _compare(args)
    if args.command == "merge":
        return _merge(args.file, args.output)
    if args.command == "report":
        return _report_ranks(args.file)
    if args.command == "plot":
        return _plot(args.file, args.output)
    return _export(args.file, args.format, args.output)


def entry_point() -> None:
    sys.exit(main())
