"""The ``tiltlab`` entry point: a static command table, a light ``--help``, one-line errors."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tiltlab import cli


def test_help_imports_no_layer_and_no_torch():
    code = (
        "import sys\n"
        "from tiltlab.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('tiltlab.sim', 'tiltlab.llm', "
        "'tiltlab.theory', 'tiltlab.paper_checks', 'tiltlab.objectives')))\n"
        "sys.stderr.write(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == ""
    for name in cli.COMMANDS:
        assert name in out.stdout


def test_command_table_matches_the_layers():
    """Every command in the table is registered by the module the table names, and no module
    registers a command the table does not list (so ``--help`` never hides a command)."""
    registered: dict[str, set[str]] = {}
    for load in {load for load, _ in cli.COMMANDS.values()}:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        module = load()
        module.register(sub)
        registered[module.__name__] = set(sub.choices)
    assert sorted(registered) == ["tiltlab.llm.cli", "tiltlab.paper_checks.cli", "tiltlab.sim.cli"]
    for name, (load, _) in cli.COMMANDS.items():
        assert name in registered[load().__name__], (name, load)
    assert set().union(*registered.values()) == set(cli.COMMANDS)


def test_unknown_command_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["nosuchcommand"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1]
        == "tiltlab: error: unknown command 'nosuchcommand' (choose from check, reproduce, report, sim, figures, llm)"
    )


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


# --------------------------------------------------------------------------- close matches and field types


def test_did_you_mean_picks_the_closest_or_nothing():
    from tiltlab.dataclass_cli import close_matches, did_you_mean

    assert did_you_mean("evl", ["stage1", "eval", "train"]) == " (did you mean 'eval'?)"
    assert did_you_mean("--onyl", ["--only", "--json", "--jobs"], "{}") == " (did you mean --only?)"
    assert did_you_mean("ONLY", ["only"]) == " (did you mean 'only'?)"  # case-insensitive both ways:
    assert did_you_mean("m", ["M", "beta"]) == " (did you mean 'M'?)"  # Stage1Config's field M
    assert did_you_mean("xyzzy", ["stage1", "eval"]) == ""
    assert close_matches("epohcs", ["epochs", "hidden", "lr"]) == ["epochs"]
    assert close_matches("epoch", ["epochs_max", "epochs"], n=2) == ["epochs", "epochs_max"]  # best first


def test_unknown_keys_message_one_and_several():
    from tiltlab.dataclass_cli import unknown_keys_message

    valid = ["epochs", "hidden", "lr"]
    assert unknown_keys_message(["epohcs"], valid, "`stage2:`") == (
        "unknown keys ['epohcs'] in `stage2:` (did you mean 'epochs'?); valid keys: epochs, hidden, lr"
    )
    assert unknown_keys_message(["zzz", "hiden", "epohcs"], valid, "X") == (
        "unknown keys ['epohcs', 'hiden', 'zzz'] in X (did you mean 'epochs' for 'epohcs', 'hidden' for 'hiden'?); "
        "valid keys: epochs, hidden, lr"
    )
    assert unknown_keys_message(["zzz"], valid, "X") == "unknown keys ['zzz'] in X; valid keys: epochs, hidden, lr"


def test_check_field_values_accepts_and_coerces_each_type():
    import dataclasses

    from tiltlab.dataclass_cli import check_field_values

    @dataclasses.dataclass
    class C:
        n: int = 1
        x: float = 0.5
        s: str = "a"
        b: bool = False
        xs: list[int] = dataclasses.field(default_factory=list)
        d: dict = dataclasses.field(default_factory=dict)
        o: float | None = None
        free: object = None  # a type no flag can express: passed through

    good = {"n": 3, "x": 2, "s": "b", "b": True, "xs": [1, 2], "d": {"k": 1}, "o": None, "free": [1], "extra": 7}
    out = check_field_values(C, good)
    assert out == {**good, "x": 2.0} and isinstance(out["x"], float)
    assert check_field_values(C, {"x": "2e-6"})["x"] == 2e-6  # YAML 1.1 reads 2e-6 as a string
    assert check_field_values(C, {"o": 3})["o"] == 3.0


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("n", 3.0, "an integer"),
        ("n", "3", "an integer"),
        ("n", True, "an integer"),
        ("x", "abc", "a number"),
        ("x", False, "a number"),
        ("x", None, "a number"),
        ("s", 3, "a string"),
        ("b", 1, "true or false"),
        ("b", "yes", "true or false"),
        ("xs", 3, "a list of integers"),
        ("xs", [1, "a"], "a list of integers"),
        ("d", [1], "a mapping"),
        ("o", "abc", "a number or null"),
        ("names", "math500", "a list of strings"),  # a string is not a list of its characters
    ],
)
def test_check_field_values_names_the_expected_type(key, value, expected):
    import dataclasses

    from tiltlab.dataclass_cli import check_field_values

    @dataclasses.dataclass
    class C:
        n: int = 1
        x: float = 0.5
        s: str = "a"
        b: bool = False
        xs: list[int] = dataclasses.field(default_factory=list)
        d: dict = dataclasses.field(default_factory=dict)
        o: float | None = None
        names: list[str] = dataclasses.field(default_factory=list)

    with pytest.raises(ValueError) as exc:
        check_field_values(C, {key: value}, prefix="sec.")
    assert str(exc.value) == f"sec.{key}: expected {expected}, got {value!r}"


# --------------------------------------------------------------------------- library warnings


def test_quiet_library_warnings_here_and_in_child_processes():
    import builtins
    import os
    import warnings

    env: dict[str, str] = {"PYTHONWARNINGS": "default::ResourceWarning"}
    messages = [(getattr(builtins, c), m + " (and the rest)") for c, m, _ in cli.QUIET_WARNINGS]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_library_warnings(env)
        cli.quiet_library_warnings(env)  # idempotent
        for category, message in messages:
            warnings.warn(message, category, stacklevel=1)
        warnings.warn("some other deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["some other deprecation"]
    specs = env["PYTHONWARNINGS"].split(",")
    assert specs[0] == "default::ResourceWarning" and len(specs) == 1 + len(cli.QUIET_WARNINGS)
    code = (
        "import warnings\n"
        + "".join(f"warnings.warn({m!r}, {c.__name__})\n" for c, m in messages)
        + "warnings.warn('keep me', FutureWarning)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert out.returncode == 0
    assert "keep me" in out.stderr and not any(m in out.stderr for _, m in messages), out.stderr


def test_main_quiets_library_output_unless_verbose_or_debug(monkeypatch, capsys):
    """``-v`` / ``--verbose`` / ``--debug`` anywhere: the library output is shown; the flags are the CLI's own
    (taken off the command line, so a subcommand never sees them)."""
    calls = []
    monkeypatch.setattr(cli, "library_output", lambda verbose: calls.append(verbose))
    assert cli.main([]) == 2
    assert cli.main(["--debug"]) == 2
    assert cli.main(["-v"]) == 2
    assert cli.main(["--verbose"]) == 2
    assert calls == [False, True, True, True]
    seen = []
    monkeypatch.setitem(cli.COMMANDS, "sim", (lambda: _Recorder(seen), "x"))
    assert cli.main(["sim", "-v", "--n", "3"]) == 0 and cli.main(["sim", "--n", "4", "--verbose"]) == 0
    assert seen == [3, 4] and calls[-2:] == [True, True]
    capsys.readouterr()


class _Recorder:
    """A layer whose one command records the arguments it was given."""

    def __init__(self, seen: list):
        self.seen = seen

    def register(self, sub) -> None:
        p = sub.add_parser("sim")
        p.add_argument("--n", type=int)  # and nothing else: a -v left on the command line is an error
        p.set_defaults(func=lambda args: self.seen.append(args.n))


def _log_lines(records: list[tuple[str, str]]) -> list[str]:
    """The messages of ``(logger, message)`` records that reach a handler on each logger."""
    import logging

    got: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record.getMessage())

    handler = Keep()
    loggers = {logging.getLogger(name) for name, _ in records}
    for lg in loggers:
        lg.addHandler(handler)
    try:
        for name, message in records:
            logging.getLogger(name).warning(message)
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
    return got


def test_quiet_library_logs_drop_the_known_lines_only(monkeypatch):
    """Each :data:`QUIET_LOGS` line is dropped on its logger; another message of the same logger, the same
    message on another logger, and the message's start on its own logger at a later position all show."""
    import logging

    for name, _, _ in cli.QUIET_LOGS:  # the filters this test installs go away with it
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    known = [(name, message + " (and the rest)") for name, message, _ in cli.QUIET_LOGS]
    others = [(name, "a different warning of the same logger") for name, _, _ in cli.QUIET_LOGS]
    others += [("vllm.somewhere.else", cli.QUIET_LOGS[0][1]), (cli.QUIET_LOGS[0][0], "see: " + cli.QUIET_LOGS[0][1])]
    assert len(_log_lines(known)) == len(known)  # before: every line shows
    cli.quiet_library_logs()
    cli.quiet_library_logs()  # idempotent: one filter per logger
    assert _log_lines(known) == []
    assert _log_lines(others) == [m for _, m in others]
    names = {name for name, _, _ in cli.QUIET_LOGS}
    assert all(len(logging.getLogger(n).filters) == 1 for n in names)
    # a message formatted from arguments is matched as rendered (vLLM's LD_PRELOAD hint is "%s is not ...")
    ld = next(n for n, m, _ in cli.QUIET_LOGS if m.startswith("libtcmalloc"))
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger(ld).addHandler(handler)
    try:
        logging.getLogger(ld).warning("%s is not found in LD_PRELOAD. For best performance ...", "libtcmalloc")
        logging.getLogger(ld).warning("%s is not found in LD_PRELOAD. For best performance ...", "libfoo")
    finally:
        logging.getLogger(ld).removeHandler(handler)
    assert seen == ["libfoo is not found in LD_PRELOAD. For best performance ..."]


def test_library_output_sets_the_child_environment(monkeypatch):
    """Quiet: vLLM at WARNING on stderr, the warnings and the log filters for the child processes; a level or
    stream the user set is kept. Verbose: vLLM at INFO (DEBUG kept), no filters for the children."""
    import logging

    for name, _, _ in cli.QUIET_LOGS:
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    env: dict[str, str] = {}
    cli.library_output(False, env)
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING" and env["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"
    assert env[cli.QUIET_LOGS_ENV] == "1" and "TRL currently supports vLLM versions" in env["PYTHONWARNINGS"]
    assert logging.getLogger(cli.QUIET_LOGS[0][0]).filters  # and in this process
    cli.library_output(True, env)
    assert env["VLLM_LOGGING_LEVEL"] == "INFO" and cli.QUIET_LOGS_ENV not in env
    assert env["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"
    mine = {"VLLM_LOGGING_LEVEL": "ERROR", "VLLM_LOGGING_STREAM": "ext://sys.stdout"}
    cli.library_output(False, mine)
    assert (mine["VLLM_LOGGING_LEVEL"], mine["VLLM_LOGGING_STREAM"]) == ("ERROR", "ext://sys.stdout")
    debug = {"VLLM_LOGGING_LEVEL": "debug"}
    cli.library_output(True, debug)
    assert debug["VLLM_LOGGING_LEVEL"] == "debug" and "PYTHONWARNINGS" not in debug


_SPAWNER = """\
import logging
import multiprocessing
import sys

from tiltlab.cli import library_output  # as the `tiltlab` console script imports tiltlab.cli


def child():
    log = logging.getLogger("vllm.platforms.cpu")  # before any handler: Python's last-resort one, on stderr
    log.warning("Triton is not installed. triton-cpu is expected on x86 CPUs.")
    log.warning("a different warning of the same logger")


if __name__ == "__main__":
    library_output(verbose=sys.argv[1:] == ["-v"])
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    sys.exit(p.exitcode)
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_a_spawned_child_of_a_quiet_command_drops_the_known_lines(tmp_path, verbose):
    """vLLM's engine core and workers are ``spawn`` children: the child runs the main script again, which
    imports tiltlab.cli, whose last lines install the filters there (quiet only)."""
    script = tmp_path / "spawner.py"
    script.write_text(_SPAWNER)
    env = {k: v for k, v in os.environ.items() if k != cli.QUIET_LOGS_ENV}
    env["PYTHONPATH"] = str(Path(cli.__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, str(script), *(["-v"] if verbose else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "a different warning of the same logger" in out.stderr
    assert ("Triton is not installed" in out.stderr) is verbose, out.stderr


def test_a_plain_argparse_subparser_keeps_the_one_line_error(capsys):
    """A subcommand added with another parser class: the error is still one line, reported by the
    top parser (the close-match lookup stops where the parsers are no longer tiltlab's)."""
    top = cli.Parser(prog="top")
    sub = top.add_subparsers(dest="cmd", parser_class=argparse.ArgumentParser)
    sub.add_parser("x").add_argument("--only")
    with pytest.raises(SystemExit) as exc:
        top.parse_args(["x", "--onyl", "1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "top: error: unrecognized arguments: --onyl 1\n"


def test_tiltlab_llm_without_a_command_prints_its_help_and_exits_2(capsys):
    from tiltlab.cli import main as cli_main

    assert cli_main(["llm"]) == 2
    out = capsys.readouterr().out
    assert "usage:" in out and "COMMAND" in out


def _sympy_cache_size_seen(env_value: str | None) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k != "SYMPY_CACHE_SIZE"}
    if env_value is not None:
        env["SYMPY_CACHE_SIZE"] = env_value
    code = (
        "import os, contextlib, io\nfrom tiltlab.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n    main(['--help'])\n"
        "print(os.environ['SYMPY_CACHE_SIZE'])\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout


def test_the_cli_enlarges_sympys_cache_unless_the_user_set_it():
    assert _sympy_cache_size_seen(None).strip() == cli.SYMPY_CACHE_SIZE != "1000"
    assert _sympy_cache_size_seen("777").strip() == "777"


def test_sympys_cache_size_changes_no_theory_number(tmp_path):
    """The check whose derivatives gain from the larger cache (LAD eq. 9), at sympy's default size and at
    the CLI's: the same verdicts and bit-identical numbers."""
    import json
    import os

    recs = {}
    for size in ("1000", cli.SYMPY_CACHE_SIZE):
        out = tmp_path / f"{size}.json"
        env = {**os.environ, "SYMPY_CACHE_SIZE": size}
        cmd = [sys.executable, "-m", "tiltlab.cli", "check", "--only", "lad.eq9", "--jobs", "1", "--out", str(out)]
        subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        recs[size] = {
            (r["claim"], r["check"]): (r["verdict"], r["numbers"])
            for r in json.loads(out.read_text())["checks"]
            if r["layer"] == "theory"
        }
    assert recs["1000"] and recs["1000"] == recs[cli.SYMPY_CACHE_SIZE]


def test_llm_subcommands_are_the_documented_ones():
    """``tiltlab llm`` registers one command per module of ``subcommand_modules()``, each documented in
    docs/llm.md (a module dropped from the table would silently remove its command)."""
    from tiltlab.llm import cli as llm_cli

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    llm_cli.register(sub)
    (llm_sub,) = [a for a in sub.choices["llm"]._actions if isinstance(a, argparse._SubParsersAction)]
    names = set(llm_sub.choices)
    assert names == {"stage1", "stage2", "stage2-annotate", "eval", "train", "diagnose", "demo", "prepare"}
    doc = (Path(__file__).resolve().parents[1] / "docs" / "llm.md").read_text(encoding="utf-8")
    assert all(f"tiltlab llm {n}" in doc for n in names), sorted(n for n in names if f"tiltlab llm {n}" not in doc)
