"""What the one-line errors (and notes) of the ``tiltlab`` commands tell the user to do next, in one
table: :data:`HINTS`.

Each entry names the commands that print it; every ``--option`` its text names outside backticks must
be an option of each of those commands, and every option inside a backticked command (```tiltlab
check --list```) one of that command (:func:`named_options`; ``tests/test_cli_hints.py`` builds the
parsers and checks every entry). An option that overwrites an existing file (:data:`OVERWRITING`) is
named only by a hint about the command's own output (:attr:`Hint.own_output`): a file that is not
the command's output, e.g. an ``--out`` that is not a record, gets "pass another --out", never an
option that would write over it. A close match of a mistyped name is
:func:`tiltlab.dataclass_cli.did_you_mean`'s. Standard library only, so every layer can import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HINTS", "OVERWRITING", "Hint", "hint", "named_options"]


@dataclass(frozen=True)
class Hint:
    """One suggestion: the commands whose options it names outside backticks (``"check"``, ``"llm
    stage1"``: the commands that print it, or the one the report's text speaks of; empty when every
    option it names sits in a backticked command), its text (a :meth:`str.format` template), and
    whether it is only ever said of the command's own output (then it may name an option of
    :data:`OVERWRITING`)."""

    commands: tuple[str, ...]
    text: str
    own_output: bool = False


#: options that write over an existing file, per command
OVERWRITING: dict[str, frozenset[str]] = {"check": frozenset({"--replace"})}

_RECORD_RUN = "`tiltlab check` or `tiltlab reproduce`"

HINTS: dict[str, Hint] = {
    # ------------------------------------------------------------------ check / reproduce / report
    "another_out": Hint(("check", "figures"), "pass another --out ({path} is left as it is)"),
    "record_for_report": Hint(
        ("report",), "pass --record with the claims.json a " + _RECORD_RUN + " run wrote ({path} is left as it is)"
    ),
    "record_to_rejudge": Hint(
        ("report",),
        "pass --rejudge with the claims.json of a " + _RECORD_RUN + " run or the shipped llm record "
        "(paper_checks/records/llm.json)",
    ),
    "record_for_timings": Hint(("report",), "pass --timings with the claims.json of a " + _RECORD_RUN + " run"),
    "record_to_ship": Hint(
        ("report",), "pass --ship-llm with the claims.json of a `tiltlab check --layer llm --slow` run"
    ),
    "no_record_yet": Hint((), "run `tiltlab reproduce` (or `tiltlab check`) first"),
    "report_needs_reproduce": Hint(
        ("report",), "the full report needs a `tiltlab reproduce` record, or pass --format / --docs"
    ),
    "quick_over_full": Hint(
        ("reproduce", "figures"),
        "--quick would replace {what}: pass another --out (the default for --quick is {default})",
    ),
    "add_slow": Hint(("check",), "add --slow"),
    "add_long": Hint(("check",), "add --long"),
    "add_opt_in_layer": Hint(("check",), "add --layer {layer} --slow"),
    "use_data_layer": Hint(("check",), "the LLM-scale claims are recorded as data: use --layer data"),
    "list_checks": Hint((), "`tiltlab check --list` prints every check (claim, check name, layer)"),
    "only_or_layer": Hint(("check",), "give one of --only and --layer"),
    "slow_not_run": Hint(("reproduce",), "run `tiltlab reproduce` without --quick, or `tiltlab check --slow`"),
    "llm_rows_check": Hint((), "`tiltlab check --layer llm --slow` runs them"),
    "llm_rows_reproduce": Hint((), "`tiltlab reproduce --llm` runs them"),
    "merged_into_record": Hint(("check",), "--replace writes this run only", own_output=True),
    # ------------------------------------------------------------------ sim / figures
    "figure_number": Hint((), "or a number: fig1 = fig01"),
    # ------------------------------------------------------------------ llm
    "config_file": Hint(
        ("llm stage1", "llm stage2", "llm eval", "llm train"), "pass --config with a YAML run config (configs/*.yaml)"
    ),
    "flags_or_config": Hint(("llm stage1", "llm stage2", "llm eval"), "give the flags or a --config with them"),
    "stage1_first": Hint(
        ("llm stage2",),
        "run `tiltlab llm stage1 --out-dir {labels} ...` first, or point --labels at a Stage 1 output folder",
    ),
    "untruncated_top_k": Hint(("llm stage1",), "top_k=0 (--top-k 0)"),
    "untruncated_top_p": Hint(("llm stage1",), "top_p=1 (--top-p 1)"),
    "allow_truncated": Hint(("llm stage1",), "pass allow_truncated=True (--allow-truncated) to proceed anyway"),
    "eval_model": Hint(
        ("llm eval",), "pass --model with a local model directory, a hub id (org/name), tiny or one of {aliases}"
    ),
    "train_first": Hint(("llm eval",), "run `tiltlab llm train --config {config}` first, or pass --model"),
    "eval_data_dir": Hint(("llm eval",), "on this command line: --data-dir DIR"),
    "resume_from": Hint(("llm train",), "pass --resume with a checkpoint-N directory, or --resume latest"),
    "save_checkpoints": Hint(("llm train",), "train with --set trl.save_strategy=steps first"),
    "verl_stack": Hint(
        (),
        "pip install {package} (veRL's GPU stack, docs/verl.md); `python -m tiltlab.llm.verl prepare` needs only "
        "the verl extra",
    ),
}


def hint(name: str, **fields: object) -> str:
    """The text of ``HINTS[name]`` with ``fields`` filled in."""
    return HINTS[name].text.format(**fields)


_BACKTICKED = re.compile(r"`([^`]*)`")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
_CHAIN = re.compile(r"&&|\|\||[;|]")


def named_options(text: str) -> list[tuple[str | None, str]]:
    """``(command, option)`` for every ``--option`` in ``text``: ``command`` is the words after ``tiltlab``
    of the backticked command the option appears in (``"check --list"`` for ```tiltlab check --list```, each
    command of a chain ``a && b`` on its own; the
    option's own command is found by descending the parsers), None outside backticks (the hint's own
    commands). A backticked text that is not a ``tiltlab`` command (``python -m ...``) names no options
    here."""
    found: list[tuple[str | None, str]] = []
    for m in _BACKTICKED.finditer(text):
        for part in _CHAIN.split(m.group(1)):  # `tiltlab check --out F && tiltlab report --record F`
            words = part.split()
            if words[:1] == ["tiltlab"]:
                found += [(" ".join(words[1:]), o) for o in _OPTION.findall(part)]
    outside = _BACKTICKED.sub(" ", text)
    return found + [(None, o) for o in _OPTION.findall(outside)]
