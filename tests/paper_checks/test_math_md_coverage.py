"""docs/math.md, the project's specification, and the claim registry cover each other.

- Every claim id in docs/math.md is declared and has a registered check.
- docs/math.md keeps the ids of the original specification (``SPEC_IDS``): the propositions and
  simulator claims of the five papers may not silently drop out of it.
- Reverse direction: every declared claim of kind proposition, beyond or open appears in
  docs/math.md. Empirical claims are exempt: they restate a paper's table cells and figure
  readings (``disa.table1.*``, ``lad.table8.*``, ...), which are data in
  ``paper_checks/claims/*.toml``, not mathematics; the few empirical claims that are stated as
  mathematics (``disa.d3.m_study``, ``paced.tau_sweep``, ...) are in ``SPEC_IDS``.
- Every ``objectives.<module>.<name>`` docs/math.md names exists in ``tiltlab.objectives``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

MATH_MD = Path(__file__).resolve().parents[2] / "docs" / "math.md"
_ID = re.compile(r"`((?:disa|paced|lad|fpa|flowrl)\.[A-Za-z0-9_.]+)`")
_FN = re.compile(r"\bobjectives\.([a-z_]+)\.([A-Za-z_][A-Za-z0-9_]*)")

#: The claim ids of the specification the registry was built from.
SPEC_IDS = frozenset(
    {
        "disa.c5.counterexample",
        "disa.c5.offpolicy_breaks",
        "disa.d3.m_study",
        "disa.prop1.log_jensen",
        "disa.prop1.unbiased",
        "disa.prop2.geomean_bias",
        "disa.prop3i.exact_fixed_point",
        "disa.prop3ii.biased_stationary",
        "disa.prop4.envelope",
        "disa.sens.beta_cliff",
        "disa.sens.proposal",
        "fpa.dpo_equiv",
        "fpa.entanglement",
        "fpa.eq5",
        "fpa.simper",
        "lad.B5.flowrl_special_case",
        "lad.fig1.bandit",
        "lad.lemma31",
        "lad.lemma32",
        "lad.practical",
        "lad.strict_better",
        "lad.thmB1",
        "paced.estimator",
        "paced.prop41",
        "paced.replay",
        "paced.selection",
        "paced.tau_sweep",
        "paced.vargrad",
    }
)

#: Claim kinds that must be stated in docs/math.md (see the module docstring for "empirical").
MATH_KINDS = frozenset({"proposition", "beyond", "open"})


def _text() -> str:
    return MATH_MD.read_text(encoding="utf-8")


def _math_ids() -> set[str]:
    return set(_ID.findall(_text()))


def test_math_md_ids_parse():
    ids = _math_ids()
    assert "disa.prop1.unbiased" in ids and "fpa.eq5" in ids and len(ids) >= len(SPEC_IDS)


def test_math_md_keeps_the_specification_ids():
    missing = sorted(SPEC_IDS - _math_ids())
    assert not missing, f"claim ids dropped from docs/math.md: {missing}"


def test_every_math_md_id_is_declared(isolated_registry):
    declared = isolated_registry.claims()
    missing = sorted(i for i in _math_ids() if i not in declared)
    assert not missing, f"docs/math.md ids not declared in paper_checks/claims/*.toml: {missing}"


def test_every_math_md_id_has_a_check(isolated_registry):
    have = {c.claim_id for c in isolated_registry.checks()}
    missing = sorted(i for i in _math_ids() if i not in have)
    assert not missing, f"docs/math.md ids without a registered check: {missing}"


def test_every_mathematical_claim_is_in_math_md(isolated_registry):
    ids = _math_ids()
    missing = sorted(c.id for c in isolated_registry.claims().values() if c.kind in MATH_KINDS and c.id not in ids)
    assert not missing, f"claims of kind {sorted(MATH_KINDS)} not stated in docs/math.md: {missing}"


def test_named_objective_functions_exist():
    names = sorted(set(_FN.findall(_text())))
    assert len(names) >= 30, names  # the document names the implementing function of each formula
    missing = []
    for module, attr in names:
        try:
            mod = importlib.import_module(f"tiltlab.objectives.{module}")
        except ModuleNotFoundError:
            missing.append(f"objectives.{module} (no such module)")
            continue
        if not hasattr(mod, attr):
            missing.append(f"objectives.{module}.{attr}")
    assert not missing, f"docs/math.md names functions that tiltlab.objectives does not have: {missing}"
