"""The ``tiltlab`` console command.

Each layer owns its subcommands: its ``cli`` module exposes ``register(subparsers)``, which adds
them. The table below names every command and the module that owns it, so ``tiltlab --help``
lists the commands without importing any layer (no torch, under a second), and ``tiltlab CMD ...``
imports only the module that owns ``CMD``.

Errors: a parse error is one line on stderr (exit 2). An exception raised by a command is caught
in :func:`main` and printed as one line ``tiltlab CMD: error: ...``: exit 2 when the input was
wrong (a missing file, a bad value: ``ValueError``, ``FileNotFoundError``, ...), 1 when the run
itself failed. ``--debug`` (anywhere on the command line) re-raises instead, with the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (owning module, one-line help). Order = order in ``tiltlab --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("tiltlab.paper_checks.cli", "run the claim checks (theory + sim + data)"),
    "reproduce": ("tiltlab.paper_checks.cli", "all checks + all simulator figures -> REPORT.md and report.html"),
    "report": ("tiltlab.paper_checks.cli", "the report, the per-claim table or the README sections, from a record"),
    "sim": ("tiltlab.sim.cli", "run one exact-simulator experiment"),
    "figures": ("tiltlab.sim.cli", "regenerate the ten toy figures (PNG + JSON)"),
    "llm": ("tiltlab.llm.cli", "LLM layer: DISA stages 1-2, training, evaluation, demo"),
}

_DESCRIPTION = "Distribution-matching RL for LLMs: claim checks, simulator figures, LLM training."

#: exceptions that mean "the input was wrong" (exit 2); any other exception is a failed run (exit 1)
USAGE_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    KeyError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (``PROG: error: MESSAGE``, exit 2);
    ``PROG --help`` shows the usage. Sub-parsers inherit the class."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _base_parser() -> argparse.ArgumentParser:
    from tiltlab import __version__

    parser = Parser(prog="tiltlab", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tiltlab {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (anywhere on the command line)"
    )
    return parser


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (a ``KeyError`` without its quotes)."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = " ".join(text.split())
    return text or type(exc).__name__


def _is_usage_error(exc: BaseException) -> bool:
    if isinstance(exc, USAGE_ERRORS):
        return True
    # a malformed YAML / JSON file the user passed (yaml is optional: matched by name)
    return any(c.__name__ in ("YAMLError", "JSONDecodeError") for c in type(exc).__mro__)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for ``command`` (its owning layer is imported), or the light top-level parser.

    With ``command=None`` every command is listed from :data:`COMMANDS` with its help and no layer
    is imported; such a parser is only good for ``--help`` / ``--version``.
    """
    parser = _base_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    if command is None:
        for name, (_, help_) in COMMANDS.items():
            sub.add_parser(name, help=help_, add_help=False)
        return parser
    module = importlib.import_module(COMMANDS[command][0])
    module.register(sub)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, "llm_command", None)
    return f"tiltlab {args.command}" + (f" {sub}" if sub else "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or command not in COMMANDS:
        parser = build_parser(None)
        if command is not None:
            parser.error(f"unknown command {command!r} (choose from {', '.join(COMMANDS)})")
        parser.parse_args(argv)  # --help / --version exit here
        parser.print_help()
        return 2
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{_command_name(args)}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        if _is_usage_error(exc):
            print(f"{_command_name(args)}: error: {_one_line(exc)}", file=sys.stderr)
            return 2
        print(
            f"{_command_name(args)}: error: {type(exc).__name__}: {_one_line(exc)} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
