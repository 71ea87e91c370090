"""One serialisable form of a check's outcome (:class:`tiltlab.claims.registry.Outcome`): the runner writes
:meth:`~Outcome.to_row`, a record is read back with :meth:`~Outcome.from_row`, the two round-trip exactly, and
a row whose check module is not loaded is an outcome of the :class:`~tiltlab.claims.registry.CheckRef` it
names (``loaded`` False), judged as it was recorded."""

from __future__ import annotations

import json

import pytest

import tiltlab.paper_checks  # noqa: F401  (gives the claims core its data folder)
from tiltlab.claims import registry, rows
from tiltlab.claims.registry import CheckRef, CheckResult, Outcome, Verdict

CID = "zz_outcome.claim"


@pytest.fixture
def reg():
    """The registry with one fake claim and check; restored exactly afterwards."""
    saved = dict(registry._CLAIMS), dict(registry._CHECKS)
    registry.declare_claim(CID, "DISA", "Sec. 9", "a fake claim", kind="empirical")
    try:
        yield registry
    finally:
        for live, old in zip((registry._CLAIMS, registry._CHECKS), saved, strict=True):
            live.clear()
            live.update(old)


def _register(reg, expected=Verdict.PARTLY, items=(("x", True),)):
    result = CheckResult(Verdict.PARTLY, "two of three", {"a": 1.5, "never": "inf"}, items={"x": True, "y": False})
    reg.register_check(CID, layer="sim", name="thing", expected=expected, expected_items=dict(items))(lambda s: result)
    return reg._CHECKS[f"{CID}[sim:thing]"]


def test_a_live_outcome_round_trips_through_its_row_and_through_json(reg):
    chk = _register(reg)
    out = registry.run_one(chk, seed=3)
    row = {**out.to_row(3), "run_at": "2026-01-01T00:00:00+00:00", "source": "run", "seed": 3}
    assert row["claim"] == CID and row["paper"] == "DISA" and row["statement"] == "a fake claim"
    assert (row["verdict"], row["ok"], row["items"], row["expected_items"]) == (
        "partly", True, {"x": True, "y": False}, {"x": True}
    )  # fmt: skip
    assert row["reproducer"] == f"tiltlab check --only {CID} --layer sim --check thing --seed 3"
    back = Outcome.from_row(json.loads(json.dumps(row)), chk)
    assert back.to_row() == row  # exact: every key and value, through JSON
    assert back.loaded and back.check is chk and back.source == "run"
    assert back.provenance == {"run_at": "2026-01-01T00:00:00+00:00", "source": "run", "seed": 3}
    assert (back.result, back.seconds, back.error) == (out.result, round(out.seconds, 4), None)
    # the same row read by the registry-aware reader (its check loaded)
    assert rows.outcome_of_row(row, set(), []).to_row() == row


def test_a_crash_round_trips_as_an_error_row(reg):
    chk = _register(reg)
    out = Outcome(chk, None, 0.25, "Traceback ...\nValueError: boom")
    row = out.to_row(0)
    assert (row["verdict"], row["ok"], row["summary"], row["numbers"]) == ("error", False, None, {})
    assert Outcome.from_row(row, chk).to_row(0) == row
    assert Outcome.from_row(row, chk).failure == "crashed: ValueError: boom"


def test_a_live_check_and_its_row_name_the_same_check_ref(reg):
    chk = _register(reg)
    row = registry.run_one(chk).to_row(0)
    assert (
        CheckRef.of(chk)
        == CheckRef.from_row(row)
        == CheckRef(CID, "sim", "thing", Verdict.PARTLY, False, (("x", True),))
    )
    assert CheckRef.of(chk).key == chk.key and CheckRef.of(chk).reproducer(5) == chk.reproducer(5)


def test_a_row_whose_check_is_not_loaded_keeps_its_recorded_judgement_and_its_own_keys(reg):
    row = {
        "claim": CID, "paper": "DISA", "section": "Sec. 9", "cite": "as recorded", "statement": "as recorded",
        "layer": "llm", "check": "gone", "expected": "verified", "verdict": "partly", "ok": True, "summary": "s",
        "numbers": {"a": 1.0}, "figure": None, "items": {"x": True}, "evidence": None, "expected_items": {"x": False},
        "seconds": 2.5, "error": None, "reproducer": "tiltlab check --layer llm --check gone --slow",
        "rule_commit": "abc", "commit": "c0ffee", "source": "recorded",
    }  # fmt: skip
    (o,) = rows.outcomes_from_rows([row])
    assert not o.loaded and isinstance(o.check, CheckRef) and o.source == "recorded"
    assert o.check.key == f"{CID}[llm:gone]" and o.check.expected is Verdict.VERIFIED
    # judged now it would fail (verdict and item differ from the row's expectations); it keeps the recorded ok
    assert o.ok is True and o.ok_recorded is True
    assert o.extra == {
        "paper": "DISA", "section": "Sec. 9", "cite": "as recorded", "statement": "as recorded",
        "reproducer": "tiltlab check --layer llm --check gone --slow", "rule_commit": "abc",
    }  # fmt: skip
    assert o.to_row() == row  # the claim's text, the reproducer and the other keys as recorded
    assert Outcome.from_row({**row, "ok": False}).ok is False


def test_a_loaded_check_judges_a_row_again_against_its_expectations_now(reg):
    chk = _register(reg, expected=Verdict.VERIFIED)
    row = {**registry.run_one(_register_copy(reg)).to_row(0), "ok": True}
    o = Outcome.from_row(row, chk)
    assert o.loaded and o.ok is False and o.to_row()["expected"] == "verified"


def _register_copy(reg):
    """The check as it was registered when its row was written (expected partly), outside the registry."""
    live = reg._CHECKS[f"{CID}[sim:thing]"]
    return registry.Check(live.claim_id, live.layer, live.name, Verdict.PARTLY, live.fn, expected_items=(("x", True),))
