"""The `specdecode` command: one entry point, one subcommand per job.

Each subcommand's parser is built in `_build_parser`; its work lives in the module that owns
the concern, imported lazily so that `specdecode crd` does not pay for kopf or matplotlib.
User errors raise `UserError` (or one of its kinds below): one line on stderr naming the field
and the fix, the kind's exit code (`ExitCode`), no traceback.
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
from typing import Any, Callable, Sequence


@enum.unique
class ExitCode(enum.IntEnum):
    """What `specdecode`'s exit status means, the same in every command (the --help epilog)."""

    OK = 0
    FINDING = 1  # a check ran and found something short of failure
    USAGE = 2  # the command line is wrong (argparse's own code)
    NOT_RUNNING = 3  # `cluster status`: the local cluster is not running
    INVALID = 4  # a SpecDecodeService fails validation or cannot be rendered
    UNREADABLE = 5  # an input cannot be read: missing, not UTF-8, not YAML, a duplicate key
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)
    BROKEN_PIPE = 141  # the reader of standard output went away (128 + SIGPIPE, as `yes | head`)


EXIT_CODES_HELP = """\
exit codes:
  0    success
  1    a finding short of failure: vLLM would silently drop part of a config (validate --vllm),
       the cause is not known (diagnose), a target falls short (bench)
  2    usage error: a flag or its value is wrong, or the command needs the tools extra
  3    cluster status: the local cluster is not running
  4    invalid input: a SpecDecodeService fails validation or cannot be rendered, or vLLM's
       own parser refuses a config it would run (validate --vllm)
  5    unreadable input: a file is missing, not UTF-8, not YAML, or repeats a key
  130  interrupted (Ctrl-C)
  141  standard output was closed before the end (specdecode render ... | head)
"""


class UserError(Exception):
    """Bad input from the user: printed as one line, no traceback; exit code `exit_code`."""

    exit_code = ExitCode.USAGE


class InvalidInput(UserError):
    """The input was read and is not a valid SpecDecodeService (or vLLM would refuse it)."""

    exit_code = ExitCode.INVALID


class UnreadableInput(UserError):
    """An input file cannot be read: missing, not UTF-8, not YAML, a duplicate key."""

    exit_code = ExitCode.UNREADABLE


class _Deprecated(argparse.Action):
    """An old spelling of a flag, kept for one release: hidden from --help, it does what the
    new spelling does and says so on stderr."""

    def __init__(self, option_strings, dest, instead: str, const: Any = None, **kwargs):
        super().__init__(option_strings, dest, nargs=0 if const is not None else None, const=const,
                         default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.instead = instead

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"specdecode: {option_string} is deprecated and goes in the next release; use {self.instead}",
              file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_output_flag(parser: argparse.ArgumentParser, choices: Sequence[str] = ("text", "json"),
                    default: str = "text", help: str = "") -> None:
    """`-o/--output` (the one spelling of an output format), and `--json` as its old alias."""
    parser.add_argument("-o", "--output", choices=list(choices), default=default,
                        help=f"output format (default {default}){help}")
    parser.add_argument("--json", dest="output", action=_Deprecated, const="json", instead="-o json")


def add_cluster_name_flag(parser: argparse.ArgumentParser, default: str, help: str) -> None:
    """`--cluster-name` (the one spelling of the local control plane's name), and `--name` as its
    old alias; `args.name` holds it."""
    parser.add_argument("--cluster-name", dest="name", default=default, metavar="NAME", help=help)
    parser.add_argument("--name", dest="name", action=_Deprecated, instead="--cluster-name")


def version_text() -> str:
    """The package's version and the vLLM release the renderer writes flags for by default."""
    import importlib.metadata

    from . import constants

    try:
        version = importlib.metadata.version("specdecode-operator")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown (not installed)"
    return f"specdecode {version} (renders for vLLM {constants.DEFAULT_VLLM_VERSION} by default)"


class _Version(argparse.Action):
    """`--version`, read only when asked (importlib.metadata costs an import)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdecode",
        description="Run vLLM with speculative decoding on Kubernetes, tuned by its own metrics.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version,
                        help="print the version and the vLLM release rendered for by default")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # --- commands registered below; each sets `func` to a callable(args) -> int ---
    for register in _REGISTRARS:
        register(sub)
    return parser


_REGISTRARS: list[Callable[[argparse._SubParsersAction], None]] = []


def command(register: Callable[[argparse._SubParsersAction], None]):
    """Decorator for a function that adds one subcommand to the parser."""
    _REGISTRARS.append(register)
    return register


def main(argv: Sequence[str] | None = None) -> int:
    _import_commands()
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so that a closed pipe is met inside the try
        return code
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except ModuleNotFoundError as err:
        if not _is_tool_module(err.name):
            raise
        print(f"error: `specdecode {args.command}` needs the tools, which are not installed "
              f"(no module {err.name!r}): {TOOLS_INSTALL}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`specdecode render ... | head -1`): Python's documented way
        # (library/signal.html, "Note on SIGPIPE"): point stdout at devnull so that the flush
        # at exit does not raise again, and exit without a word.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.BROKEN_PIPE


# The tools (simulator, benchmark, demo, local stack) and the packages only they use are an
# extra, absent from the operator image; the commands that need them import them lazily.
TOOLS_INSTALL = "pip install 'specdecode-operator[tools]'"
TOOL_ONLY_PACKAGES = ("specdecode.tools", "rich", "matplotlib", "numpy")


def _is_tool_module(name: str | None) -> bool:
    return bool(name) and any(name == p or name.startswith(p + ".") for p in TOOL_ONLY_PACKAGES)


def _import_commands() -> None:
    """Import the modules that register subcommands (their `@command` functions run on import)."""
    import importlib

    for module in _COMMAND_MODULES:
        importlib.import_module(module)


# Modules whose import registers subcommands with @command. Keep imports at the top of those
# modules light; heavy imports go inside the command functions.
_COMMAND_MODULES = [
    "specdecode.commands.api_commands",
    "specdecode.commands.run",
    "specdecode.commands.cluster",
    "specdecode.commands.diagnose",
    "specdecode.commands.sim",
    "specdecode.commands.bench",
    "specdecode.commands.demo",
]


if __name__ == "__main__":  # pragma: no cover
    # Run through the package module, not this __main__ copy, so that commands registered by
    # `specdecode.commands.*` land in the registry main() reads.
    from specdecode.cli import main as package_main

    sys.exit(package_main())
