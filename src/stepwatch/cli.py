"""The ``stepwatch`` command: read saved runs and print or export them."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._render import FORMATS, format_for_path
from ._saved import FormatError, load_summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepwatch", description="Where each training step's time goes.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = commands.add_parser("report", help="print the report of a saved run")
    report.add_argument("file", help="a run saved by stepwatch.save() or STEPWATCH_OUT")

    export = commands.add_parser("export", help="convert a saved run to another format")
    export.add_argument("file", help="a saved run")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.add_argument(
        "-f",
        "--format",
        choices=sorted(FORMATS),
        help="output format (default: guessed from --output's extension, else text)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI; returns the exit code (2 for a bad file or bad arguments)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        summary = load_summary(args.file)
    except FormatError as error:
        print(f"stepwatch: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"stepwatch: {args.file}: cannot read: {error.strerror or error}", file=sys.stderr)
        return 2
    if args.command == "report":
        sys.stdout.write(FORMATS["text"].render(summary))
        return 0
    chosen = FORMATS[args.format] if args.format else None
    if chosen is None and args.output:
        chosen = format_for_path(args.output)
    text = (chosen or FORMATS["text"]).render(summary)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as file:
                file.write(text)
        except OSError as error:
            print(f"stepwatch: {args.output}: cannot write: {error.strerror or error}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    return 0


def entry_point() -> None:
    sys.exit(main())
