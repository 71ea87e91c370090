"""The ``tiltlab`` entry point: a static command table, a light ``--help``, one-line errors."""

from __future__ import annotations

import argparse
import subprocess
import sys

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
    for module in sorted({m for m, _ in cli.COMMANDS.values()}):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        __import__(module, fromlist=["register"]).register(sub)
        registered[module] = set(sub.choices)
    for name, (module, _) in cli.COMMANDS.items():
        assert name in registered[module], (name, module)
    assert set().union(*registered.values()) == set(cli.COMMANDS)


def test_unknown_command_is_a_one_line_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["nosuchcommand"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1] == "tiltlab: error: unknown command 'nosuchcommand' (choose from check, reproduce, report, sim, figures, llm)"
    )


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
