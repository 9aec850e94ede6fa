"""The `specdecode` command: one entry point, one subcommand per job.

Each subcommand's parser is built in `_build_parser`; its work lives in the module that owns
the concern, imported lazily so that `specdecode crd` does not pay for kopf or matplotlib.
User errors raise `UserError`: one line on stderr naming the field and the fix, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2, no traceback."""

    exit_code = 2


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdecode",
        description="Run vLLM with speculative decoding on Kubernetes, tuned by its own metrics.",
    )
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
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except ModuleNotFoundError as err:
        if not _is_tool_module(err.name):
            raise
        print(f"error: `specdecode {args.command}` needs the tools, which are not installed "
              f"(no module {err.name!r}): {TOOLS_INSTALL}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


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
