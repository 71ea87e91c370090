"""The ``tiltlab`` console command.

Each layer owns its subcommands: its ``cli`` module exposes ``register(subparsers)``, which adds
them. The table below names every command and the module that owns it, so ``tiltlab --help``
lists the commands without importing any layer (no torch, under a second), and ``tiltlab CMD ...``
imports only the module that owns ``CMD``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (owning module, one-line help). Order = order in ``tiltlab --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("tiltlab.paper_checks.cli", "run the claim checks (theory + sim + data)"),
    "reproduce": ("tiltlab.paper_checks.cli", "all checks + all simulator figures -> REPORT.md and report.html"),
    "sim": ("tiltlab.sim.cli", "run one exact-simulator experiment"),
    "figures": ("tiltlab.sim.cli", "regenerate the ten toy figures (PNG + JSON)"),
    "llm": ("tiltlab.llm.cli", "LLM layer: DISA stages 1-2, training, evaluation, demo"),
}

_DESCRIPTION = "Distribution-matching RL for LLMs: claim checks, simulator figures, LLM training."


def _base_parser() -> argparse.ArgumentParser:
    from tiltlab import __version__

    parser = argparse.ArgumentParser(prog="tiltlab", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tiltlab {__version__}")
    return parser


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
