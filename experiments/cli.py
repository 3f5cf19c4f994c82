"""The `servesim` command line. User errors exit 2 with one message; internal errors keep a traceback."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from experiments.commands import COMMANDS
from simcore import __version__
from simcore.errors import ServesimError


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds '(default: X)' to an option's help only where it tells the reader something: not for
    a default of None (the help says what happens then), not for on/off flags (True/False) or
    empty lists, and not when the help text already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default is None or isinstance(default, bool) or default == [] or default is argparse.SUPPRESS
                or "(default" in text or action.nargs == 0):
            return text
        return super()._get_help_string(action)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s own arguments are loaded (each command module is imported on use)."""
    parser = argparse.ArgumentParser(
        prog="servesim",
        description="Discrete-event simulator of an LLM serving engine with a real-execution backend.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=HelpFormatter)
        p.set_defaults(_module=module_name)
        if name == command:
            importlib.import_module(module_name).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("servesim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`servesim report DIR | head`): stop quietly, as a shell tool
        # killed by SIGPIPE does; stdout goes to /dev/null so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
