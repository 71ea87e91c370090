"""Imports in ``llm/`` sit at the top of their modules, except the deferred ones docs/architecture.md lists
("Deferred imports"), each for a reason :mod:`tests.import_rules` states as code; the entry points those
exceptions keep light load no package they may not."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests import import_rules as R

DOC = R.ROOT / "docs" / "architecture.md"
START, END = "<!-- deferred-imports:start -->", "<!-- deferred-imports:end -->"


@pytest.fixture(scope="module")
def sets():
    return R.entry_sets()


@pytest.fixture(scope="module")
def surveyed(sets):
    return R.survey(sets=sets)


def test_every_import_inside_a_function_in_llm_has_a_reason(surveyed):
    allowed, violations = surveyed
    assert not violations, "imports inside functions with no reason to be there (move them to the top):\n" + "\n".join(
        f"{v.module}:{v.line} {v.target}" for v in violations
    )
    assert allowed  # the survey saw the deferred imports the doc lists (a walker that found none passes vacuously)


def test_the_architecture_doc_lists_the_deferred_imports_as_they_are(surveyed):
    text = DOC.read_text()
    assert START in text and END in text, f"docs/architecture.md lacks the {START} ... {END} table"
    listed = text.split(START, 1)[1].split(END, 1)[0].strip()
    expected = R.render(R.deferred_table(surveyed[0]))
    assert listed == expected, "regenerate the table with `python tests/import_rules.py`"


def test_the_entry_points_load_no_package_they_may_not():
    assert R.entry_packages() == {label: set() for label in [*R.LIGHT_ENTRIES, R.BASE_ENTRY]}


def test_the_entry_points_load_what_the_rule_says_they_load(sets):
    """The light sets are what they are named for: `tiltlab llm --help` loads every subcommand's module,
    the run-config check loads the run config, the catalog loads the checks."""
    assert {"tiltlab.llm.cli", "tiltlab.llm.train.cli", "tiltlab.llm.eval.cli"} <= sets["tiltlab llm --help"]
    assert {"tiltlab.llm.train.config", "tiltlab.llm.base.run_config"} <= sets["a run-config check"]
    assert {"tiltlab.llm.checks", "tiltlab.llm.experiments.task"} <= sets[R.BASE_ENTRY]
    assert "tiltlab.llm.train.online.trainer" not in set().union(*sets.values())


# ---- negative controls: each rule refuses what it should


def test_an_entry_that_loads_torch_is_flagged():
    code = "import tiltlab.llm.cli; import torch"
    assert "torch" in R.entry_packages({"tiltlab llm --help": code})["tiltlab llm --help"]
    assert "transformers" in R.entry_packages({R.BASE_ENTRY: "import tiltlab.llm.checks, transformers"})[R.BASE_ENTRY]
    # the catalog may load the base install's packages
    assert R.entry_packages({R.BASE_ENTRY: "import tiltlab.llm.checks, numpy"})[R.BASE_ENTRY] == set()


def _one(source: str, here: str = "tiltlab.llm.train.online.trainer") -> R.Deferred:
    _top, deferred = R.walk_source(textwrap.dedent(source), here)
    assert len(deferred) == 1, deferred
    return deferred[0]


@pytest.mark.parametrize(
    "module, target, reason",
    [
        # a module no entry point loads: nothing may wait inside a function
        ("tiltlab.llm.train.online.trainer", "os", None),
        ("tiltlab.llm.train.online.trainer", "torch", None),
        ("tiltlab.llm.train.online.trainer", "tiltlab.llm.base.models", None),
        ("tiltlab.llm.train.online.trainer", "vllm", "optional extra (vllm)"),
        ("tiltlab.llm.train.online.trainer", "verl.utils", "optional extra (verl)"),
        # a light module: third-party packages and the tiltlab modules that load one, never the stdlib
        ("tiltlab.llm.train.cli", "torch", "light: tiltlab llm --help"),
        ("tiltlab.llm.train.cli", "tiltlab.llm.train.online", "light: tiltlab llm --help"),
        ("tiltlab.llm.train.cli", "tiltlab.llm.base.models", None),  # light itself: at the top
        ("tiltlab.llm.train.cli", "json", None),
        ("tiltlab.llm.train.config", "yaml", "light: tiltlab llm --help, a run-config check"),
        # the catalog's modules: outside the base install only
        ("tiltlab.llm.experiments.task", "transformers", "base install"),
        ("tiltlab.llm.experiments.task", "numpy", None),
        ("tiltlab.llm.experiments.task", "torch", None),
        # the sandbox's programs import what a value needs, when it needs it
        ("tiltlab.llm.base.sandbox.programs.codec", "fractions", "sandbox program"),
    ],
)
def test_each_reason_allows_only_what_it_names(sets, module, target, reason):
    assert R.classify(R.Deferred(module, 1, target), sets) == reason


def test_the_walker_sees_imports_inside_functions_and_only_those():
    src = """
    import os
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        import torch
    def f():
        from tiltlab.objectives import tb, catalog
    """
    top, deferred = R.walk_source(textwrap.dedent(src), "tiltlab.llm.x")
    assert top == ["os", "typing"]  # TYPE_CHECKING's block is not an import at run time
    assert deferred == [R.Deferred("tiltlab.llm.x", 7, "tiltlab.objectives.tb, tiltlab.objectives.catalog")]
    # relative imports resolve against the module (a package's against itself)
    assert _one("def f():\n    from .run import x\n", "tiltlab.llm.eval.cli").target == "tiltlab.llm.eval.run"
    assert R.walk_source("def f():\n    from . import run\n", "tiltlab.llm.eval", True)[1][0].target == (
        "tiltlab.llm.eval.run"
    )
    # an import whose ImportError the function handles is a probe of what is installed
    d = _one("def f():\n    try:\n        import vllm\n    except ImportError:\n        return None\n")
    assert d.guarded and R.classify(d, {k: set() for k in [*R.LIGHT_ENTRIES, R.BASE_ENTRY]}).startswith("guarded")
    # ... but a handler of something else does not make it one
    assert not _one("def f():\n    try:\n        import os\n    except KeyError:\n        pass\n").guarded


def test_the_closure_follows_module_level_imports_only():
    assert R.third_party_closure("tiltlab.objectives.catalog") == frozenset()
    assert "torch" in R.third_party_closure("tiltlab.objectives.tb")
    assert "trl" in R.third_party_closure("tiltlab.llm.train.online")
    assert R.third_party_closure("tiltlab.llm.base.run_config") == frozenset()


def test_the_doc_states_the_measured_cost_it_rests_on(surveyed):
    """The section quotes the benchmark's table (benchmarks/import_cost.py) with the machine it ran on."""
    section = DOC.read_text().split("## Deferred imports", 1)[1].split("\n## ", 1)[0]
    assert "benchmarks/import_cost.py" in section and re.search(r"CPU: \S", section)
    timed = set(re.findall(r"\| `import (\w+)` \| \d+\.\d\d \|", section))
    allowed, _ = surveyed
    light = {
        t.split(".")[0]
        for d, why in allowed
        if why.startswith("light")
        for t in d.target.split(", ")
        if not t.startswith("tiltlab")
    }
    assert light <= timed, f"packages deferred for the light entry points but not timed: {sorted(light - timed)}"
