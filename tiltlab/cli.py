"""The ``tiltlab`` console command.

Each layer owns its subcommands: a package that has a ``cli`` module exposing
``register(subparsers)`` gets its commands added here. Layers are imported lazily
inside their command handlers, so ``tiltlab --help`` stays fast and the core
never imports the LLM stack.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Order = order in ``tiltlab --help``.
_LAYERS = ("tiltlab.paper_checks.cli", "tiltlab.theory.cli", "tiltlab.sim.cli", "tiltlab.llm.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiltlab",
        description="Distribution-matching RL for LLMs: claim checks, simulator figures, LLM training.",
    )
    from tiltlab import __version__

    parser.add_argument("--version", action="version", version=f"tiltlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _LAYERS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a layer not written yet / not installed
            if exc.name == name or exc.name == name.split(".")[0]:
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
