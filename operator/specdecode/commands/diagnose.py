"""`specdecode diagnose -f LOGFILE [--spec FILE]`: why a vLLM pod will not start, from its log.

The same classifier the operator runs on failing pods (specdecode.control.failures), for a log a
user saved or pipes in (`kubectl logs POD --previous | specdecode diagnose -f -`). The pod's
speculation words the fixes that depend on it (memory, a missing draft): from the
SpecDecodeService given with `--spec`, else from the arguments vLLM logs at start-up.
Exit codes: 0 classified, 1 unknown, 2 unreadable file.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TextIO

from ..cli import UnreadableInput, UserError, command

EXIT_CLASSIFIED = 0
EXIT_UNKNOWN = 1


@command
def _diagnose(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diagnose",
        help="classify why a vLLM pod does not start, from its log, and print the fix",
        description="Read a vLLM log (kubectl logs POD --previous) and print the classified cause, "
        "the line that shows it, and the fix. Exit 0 when the cause is known, 1 when not.",
    )
    p.add_argument("-f", "--filename", required=True, metavar="LOGFILE", help="log file, or - for standard input")
    p.add_argument("--spec", metavar="FILE", help="the SpecDecodeService the pod runs (its speculation words "
                   "the fix; without it, the arguments vLLM logged at start-up are used)")
    p.set_defaults(func=run_diagnose)


def read_log(path: str) -> str:
    """The text of ``path`` (``-``: standard input); bytes that are not UTF-8 are replaced,
    since logs mix encodings and a stray byte must not hide the error."""
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", errors="replace")
    except OSError as err:
        raise UnreadableInput(f"{path}: cannot read the file ({err.strerror}); check the path") from None


def run_diagnose(args: argparse.Namespace) -> int:
    from ..control.failures import PodSpeculation, classify_log, speculation_from_log

    text = read_log(args.filename)
    if args.spec:
        from .api_commands import load_service

        try:
            spec = load_service(args.spec).spec
        except UserError as err:  # keep its exit code (invalid or unreadable), name the flag
            raise type(err)(f"--spec {err}") from None
        speculation = PodSpeculation.of(spec, enabled=True)
    else:
        speculation = speculation_from_log(text)
    diagnosis = classify_log(text, speculation)
    if sys.stdout.isatty() and importlib.util.find_spec("rich") is not None:  # rich is in the tools extra
        _print_rich(diagnosis)
    else:
        _print_plain(diagnosis, sys.stdout)
    return EXIT_CLASSIFIED if diagnosis.classified else EXIT_UNKNOWN


def _where(line_number: int | None) -> str:
    return f" (line {line_number})" if line_number else ""


def _print_plain(diagnosis, out: TextIO) -> None:
    out.write(f"cause: {diagnosis.cause}\n")
    out.write(f"line{_where(diagnosis.line_number)}: {diagnosis.line or '-'}\n")
    out.write(f"fix: {diagnosis.fix}\n")


def _print_rich(diagnosis) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # A two-column grid keeps wrapped lines under their value, not under the labels.
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    colour = "green" if diagnosis.classified else "yellow"
    grid.add_row("cause", Text(str(diagnosis.cause), style=f"bold {colour}"))
    grid.add_row("line", Text(diagnosis.line or "-") + Text(_where(diagnosis.line_number), style="dim"))
    grid.add_row("fix", Text(diagnosis.fix))
    Console().print(grid)
