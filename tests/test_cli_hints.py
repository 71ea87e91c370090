"""Hints that are true: every suggestion the commands print (:data:`tiltlab.hints.HINTS`, and every
backticked ``tiltlab`` command in the package's strings) names only options its command has, none
suggests an option that would overwrite a file that is not the command's output, and a mistyped
objective, loss type, claim id, check name or figure id gets its close match. The checker is run on
made-up hints too, which it must reject."""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tiltlab.cli import COMMANDS, build_parser, main
from tiltlab.hints import HINTS, OVERWRITING, Hint, hint, named_options

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tiltlab", "paper_checks", "llm", "sim", "theory", "objectives")

_PARSERS: dict[str, argparse.ArgumentParser] = {}


def _parser(command: str) -> tuple[argparse.ArgumentParser | None, list[str]]:
    """The (sub)parser ``command`` names (``"llm stage1 --top-p 1"`` -> the stage1 parser) and the words
    after its name; None for a command ``tiltlab`` does not have."""
    words = command.split()
    if not words or words[0] not in COMMANDS:
        return None, words
    if words[0] not in _PARSERS:
        _PARSERS[words[0]] = build_parser(words[0])
    parser, rest = _PARSERS[words[0]], words
    while rest:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or rest[0] not in subs[0].choices:
            break
        parser, rest = subs[0].choices[rest[0]], rest[1:]
    return parser, rest


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _command_of(command: str) -> str:
    """``"llm stage1 --top-p 1"`` -> ``"llm stage1"`` (the words that name parsers)."""
    _, rest = _parser(command)
    words = command.split()
    return " ".join(words[: len(words) - len(rest)])


def hint_problems(h: Hint) -> list[str]:
    """What is untrue in a hint: a command it names that does not exist, an option its command does not
    have, an overwriting option (:data:`OVERWRITING`) in a hint not about the command's own output."""
    problems = []
    for command in h.commands:
        parser, rest = _parser(command)
        if parser is None or rest:
            problems.append(f"no command `tiltlab {command}`")
    for named, option in named_options(h.text):
        commands = h.commands if named is None else (named,)
        if named is None and not h.commands:
            problems.append(f"{option} outside a backticked command, and the hint names no command")
        for command in commands:
            parser, _ = _parser(command)
            if parser is None:
                problems.append(f"no command `tiltlab {command}`")
            elif option not in _options(parser):
                problems.append(f"`tiltlab {_command_of(command)}` has no {option}")
            elif option in OVERWRITING.get(_command_of(command), ()) and not h.own_output:
                problems.append(f"{option} overwrites a file, in a hint not about the command's own output")
    return problems


@pytest.mark.parametrize("name", sorted(HINTS))
def test_every_hint_names_real_options_of_its_commands(name):
    assert hint_problems(HINTS[name]) == []


@pytest.mark.parametrize(
    ("made_up", "says"),
    [
        (Hint(("report",), "pass another path, or --replace to overwrite it"), "`tiltlab report` has no --replace"),
        (Hint(("check",), "pass --replace to overwrite it"), "overwrites a file"),
        (Hint(("llm stage1", "llm train"), "give the data directory: --data-dir DIR"), "has no --data-dir"),
        (Hint((), "`tiltlab check --nosuch` runs them"), "`tiltlab check` has no --nosuch"),
        (Hint((), "run `tiltlab check --out F && tiltlab report --pinn`"), "`tiltlab report` has no --pinn"),
        (Hint((), "pass --slow"), "outside a backticked command"),
        (Hint(("llm nosuch",), "x"), "no command `tiltlab llm nosuch`"),
        (Hint((), "`tiltlab chek --list`"), "no command `tiltlab chek --list`"),
    ],
)
def test_the_checker_rejects_made_up_hints(made_up, says):
    problems = hint_problems(made_up)
    assert any(says in p for p in problems), problems


def test_own_output_hints_may_name_the_overwriting_option():
    assert hint_problems(Hint(("check",), "--replace writes this run only", own_output=True)) == []
    assert HINTS["merged_into_record"].own_output and "--replace" in HINTS["merged_into_record"].text
    assert [n for n, h in HINTS.items() if "--replace" in h.text] == ["merged_into_record"]


def _source_strings(path: Path):
    """Every string literal of a module, an f-string with ``{}`` for its fields."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)


def _modules():
    return [f for d in PACKAGES for f in sorted((ROOT / d).rglob("*.py")) if not any(p.is_symlink() for p in f.parents)]


def test_every_backticked_command_in_the_package_names_real_options():
    """Messages, help and docstrings outside the table (the rule files' too) that quote a command."""
    bad, seen = [], set()
    for path in _modules():
        for line, text in _source_strings(path):
            for named, option in named_options(text):
                if named is None or not named.split():
                    continue
                seen.add(f"{_command_of(named)} {option}")
                parser, _ = _parser(named)
                if parser is None or option not in _options(parser):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: `tiltlab {named}` ({option})")
    assert bad == []
    # the scan sees the package's commands, a rule file's among them (a broken scan finds none)
    assert {"llm stage2-annotate --stage2-dir", "check --slow", "report --pin"} <= seen and len(seen) >= 15


def test_every_hint_is_used():
    source = "\n".join(p.read_text(encoding="utf-8") for p in _modules())
    unused = [n for n in HINTS if not re.search(rf"""\bhint\(\s*["']{n}["']""", source)]
    assert unused == []


def test_named_options_reads_backticked_commands_and_chains():
    text = "run `tiltlab check --out F && tiltlab report --record F --pin`, or pass --slow (`python -m x --y`)"
    assert named_options(text) == [
        ("check --out F", "--out"),
        ("report --record F --pin", "--record"),
        ("report --record F --pin", "--pin"),
        (None, "--slow"),
    ]


# --------------------------------------------------------------------------- the hints users met


def _one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


def test_report_record_that_is_not_json_names_report_options_only(capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["report", "--record", str(notes)]) == 2
    line = _one_line(capsys, f"tiltlab report: error: --record {notes} exists and is not a tiltlab record")
    assert "--replace" not in line and line.endswith(hint("record_for_report", path=notes))
    assert notes.read_text() == "my notes\n"


@pytest.mark.parametrize("extra", [[], ["--replace"]], ids=["merge", "replace"])
def test_check_out_that_is_not_a_record_is_never_overwritten(capsys, tmp_path, monkeypatch, extra):
    from tiltlab.paper_checks.cli import runner

    monkeypatch.setattr(runner, "_run", lambda *a, **k: pytest.fail("a check ran"))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["check", "--only", "disa.prop1", *extra, "--out", str(notes)]) == 2
    line = _one_line(capsys, f"tiltlab check: error: --out {notes} exists and is not a tiltlab record")
    assert "--replace" not in line and "pass another --out" in line
    assert notes.read_text() == "my notes\n"


@pytest.mark.parametrize(
    ("argv", "close"),
    [
        (["check", "--only", "disa.prp1"], "(did you mean --only disa.prop1?)"),
        (["check", "--only", "dsia"], "(did you mean --only disa?)"),
        (["check", "--check", "paced_vargrd"], "(did you mean --check paced_vargrad?)"),
        (["check", "--only", "disa.prp1", "--check", "paced_vargrd"], "--only disa.prop1, --check paced_vargrad?)"),
    ],
)
def test_mistyped_claim_ids_and_check_names_get_their_close_match(capsys, tmp_path, argv, close):
    assert main([*argv, "--out", str(tmp_path / "c.json")]) == 2
    line = _one_line(capsys, "tiltlab check: error: no check matches ")
    assert close in line and hint("list_checks") in line
    assert not (tmp_path / "c.json").exists()


def test_a_name_with_no_close_match_gets_none(capsys, tmp_path):
    assert main(["check", "--only", "zzzz.qqqq", "--out", str(tmp_path / "c.json")]) == 2
    assert "did you mean" not in _one_line(capsys, "tiltlab check: error: no check matches --only zzzz.qqqq")


def test_mistyped_figure_id_gets_its_close_match(capsys, tmp_path):
    assert main(["figures", "--only", "fig07_where_logz_maters", "--out", str(tmp_path)]) == 2
    line = _one_line(capsys, "tiltlab figures: error: unknown figure 'fig07_where_logz_maters'")
    assert "(did you mean 'fig07_where_logz_matters'?)" in line
    assert not (tmp_path / "index.json").exists()


def test_mistyped_sim_env_and_method(capsys):
    assert main(["sim", "--env", "banditt", "--steps", "1"]) == 2
    assert "(did you mean 'bandit'?)" in _one_line(capsys, "tiltlab sim: error: unknown --env 'banditt'")
    assert main(["sim", "--method", "flowrll", "--steps", "1"]) == 2
    assert "got 'flowrll' (did you mean 'flowrl'?)" in _one_line(capsys, "tiltlab sim: error: method must be")


def _run_yaml(tmp_path, **kw) -> str:
    lines = ["kind: online", "model: tiny", "dataset: synthetic:math:4:1", f"output_dir: {tmp_path / 'out'}"]
    lines += [f"{k}: {v}" for k, v in kw.items()]
    (tmp_path / "run.yaml").write_text("\n".join(lines) + "\n")
    return str(tmp_path / "run.yaml")


def test_mistyped_objective_gets_its_close_match(capsys, tmp_path):
    cfg = _run_yaml(tmp_path, objective="grpo")
    assert main(["llm", "train", "--config", cfg, "--objective", "dsia", "--dry-run"]) == 2
    line = _one_line(capsys, "tiltlab llm train: error: objective 'dsia' is not an online objective")
    assert "(did you mean 'disa'?)" in line and "choose from" in line
    assert main(["llm", "train", "--config", _run_yaml(tmp_path, objective="flowrlx")]) == 2
    assert "(did you mean 'flowrl'?)" in _one_line(capsys, "tiltlab llm train: error: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "named", "not_named"),
    [
        (["--top-p", "0.9"], ["top_p=0.9", "--top-p 1"], ["top_k", "--top-k"]),
        (["--top-k", "5"], ["top_k=5", "--top-k 0"], ["top_p", "--top-p"]),
        (["--top-k", "5", "--top-p", "0.9"], ["top_k=5 and top_p=0.9", "--top-k 0", "--top-p 1"], []),
    ],
)
def test_stage1_truncation_blames_only_what_truncates(capsys, tmp_path, flags, named, not_named):
    argv = ["llm", "stage1", "--proposal", "tiny", "--reference", "tiny", "--dataset", "synthetic:math:2"]
    assert main([*argv, *flags, "--out-dir", str(tmp_path / "s1")]) == 2
    line = _one_line(capsys, "tiltlab llm stage1: error: the sampler truncates the proposal's support")
    assert all(n in line for n in named) and not any(n in line for n in not_named), line
    assert "--allow-truncated" in line
    assert not (tmp_path / "s1").exists()


def test_a_missing_benchmark_names_only_what_the_command_takes(capsys, tmp_path, monkeypatch):
    """stage1 has no --data-dir: its message names TILTLAB_DATA; eval's adds its --data-dir."""
    monkeypatch.setenv("TILTLAB_DATA", str(tmp_path))
    argv = ["llm", "stage1", "--proposal", "tiny", "--reference", "tiny", "--dataset", "aime24"]
    assert main([*argv, "--out-dir", str(tmp_path / "s1")]) == 2
    line = _one_line(capsys, "tiltlab llm stage1: error: benchmark 'aime24' not found")
    assert "TILTLAB_DATA" in line and "--data-dir" not in line
    assert main(["llm", "eval", "--model", "tiny", "--datasets", "aime24", "--k", "1"]) == 2
    line = _one_line(capsys, "tiltlab llm eval: error: benchmark 'aime24' not found")
    assert "TILTLAB_DATA" in line and line.endswith(f"({hint('eval_data_dir')})")


def test_stage1_help_does_not_say_vllm_needs_a_gpu():
    parser, _ = _parser("llm stage1")
    (engine,) = [a for a in parser._actions if "--engine" in a.option_strings]
    assert "(GPU)" not in engine.help and "CPU" in engine.help and "vllm" in engine.help


def test_help_makes_no_timing_promise():
    """No --help line promises a run time (README's timings table is generated from records instead)."""
    promise = re.compile(r"\bunder \d|\d+ ?(s|sec|seconds|min|minutes)\b|minutes|hours", re.IGNORECASE)
    found = []
    for command in ["check", "reproduce", "report", "sim", "figures", "llm"]:
        parser, _ = _parser(command)
        stack = [parser]
        while stack:
            p = stack.pop()
            for a in p._actions:
                if isinstance(a, argparse._SubParsersAction):
                    stack += list(a.choices.values())
                elif a.help and promise.search(a.help):
                    found.append(f"{p.prog} {'/'.join(a.option_strings)}: {a.help}")
            if p.description and promise.search(p.description):
                found.append(f"{p.prog}: {p.description}")
    assert found == []
    assert promise.search("fast settings (under 2 minutes)")  # the pattern catches what the help said before


def test_verl_main_without_hydra_is_one_line_naming_the_install(tmp_path):
    """``python -m tiltlab.llm.verl --help`` where Hydra is missing (simulated: ``sys.modules['hydra'] = None``,
    so the test runs whether or not Hydra is installed)."""
    try:
        import verl  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"verl is not importable ({exc})")
    code = (
        "import runpy, sys\n"
        "sys.modules['hydra'] = None\n"
        "sys.argv = ['tiltlab.llm.verl', '--help']\n"
        "runpy.run_module('tiltlab.llm.verl', run_name='__main__', alter_sys=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines == [
        "python -m tiltlab.llm.verl: error: veRL's trainer needs hydra, which is not installed; "
        + hint("verl_stack", package="hydra-core")
    ]
    assert res.stdout == ""
