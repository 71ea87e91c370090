"""The opt-in ``llm`` layer: selection (only when named), ``tiltlab check --layer llm --slow``,
``tiltlab reproduce --llm``, claim verdicts decided by the llm layer over an out-of-reach data
check or an inconclusive toy proxy, and per-item expected outcomes."""

from __future__ import annotations

import json

import pytest

from tiltlab.claims.registry import Check, CheckResult, Outcome, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import cli as pcli
from tiltlab.paper_checks.report import claim_decision

CID = "zz_fake.llm_claim"


def _setup(reg, llm_verdict=Verdict.VERIFIED, data_verdict=Verdict.OUT_OF_REACH, calls=None):
    reg.declare_claim(CID, "DISA", "Sec. 0", "a fake LLM-scale claim", kind="empirical")

    def data(seed: int) -> CheckResult:
        return CheckResult(data_verdict, "recorded, not re-measured")

    def llm(seed: int) -> CheckResult:
        if calls is not None:
            calls.append(seed)
        return CheckResult(llm_verdict, "trained a small model", {"acc": 0.5})

    reg.register_check(CID, layer="data", expected=data_verdict, name="llm_scale")(data)
    reg.register_check(CID, layer="llm", expected=llm_verdict, name="small_model", slow=True)(llm)


def test_llm_checks_run_only_when_the_layer_is_named(isolated_registry):
    reg = isolated_registry
    _setup(reg)
    assert [c.layer for c in reg.select("zz_fake", include_slow=True)] == ["data"]  # --slow alone: not llm
    assert [c.layer for c in reg.select("zz_fake", "llm", include_slow=True)] == ["llm"]
    assert [c.layer for c in reg.select("zz_fake", include_slow=True, include_llm=True)] == ["data", "llm"]


def test_check_layer_llm_slow_runs_them_and_the_claim_takes_the_llm_verdict(isolated_registry, tmp_path, capsys):
    calls: list[int] = []
    _setup(isolated_registry, calls=calls)
    out = tmp_path / "c.json"
    assert main(["check", "--only", "zz_fake", "--layer", "llm", "--slow", "--seed", "3", "--out", str(out)]) == 0
    assert calls == [3]
    rec = json.loads(out.read_text())
    assert [(c["layer"], c["verdict"]) for c in rec["checks"]] == [("llm", "verified")]
    assert "--layer llm" in rec["checks"][0]["reproducer"] and "--slow" in rec["checks"][0]["reproducer"]


def test_no_llm_checks_message_only_when_none_is_registered(isolated_registry, tmp_path, capsys):
    _setup(isolated_registry)
    # an llm check exists: without --slow the message is the slow one, not "no llm checks exist yet"
    assert main(["check", "--layer", "llm", "--only", "zz_fake", "--out", str(tmp_path / "c.json")]) == 2
    assert "no llm checks exist yet" not in capsys.readouterr().err


def test_reproduce_llm_adds_the_llm_checks(isolated_registry, tmp_path, monkeypatch, capsys):
    reg = isolated_registry
    calls: list[int] = []
    _setup(reg, calls=calls)
    monkeypatch.setattr(reg, "_CHECKS", {k: c for k, c in reg._CHECKS.items() if c.claim_id == CID})
    monkeypatch.setattr(pcli.reproduce, "make_figures", lambda out_dir, quick, seed, progress=True: ([], {}))
    out = tmp_path / "plain"
    assert main(["reproduce", "--quick", "--jobs", "1", "--out", str(out)]) == 0
    assert calls == [] and [c["layer"] for c in json.loads((out / "claims.json").read_text())["checks"]] == ["data"]
    out = tmp_path / "llm"
    assert main(["reproduce", "--quick", "--llm", "--jobs", "1", "--out", str(out)]) == 0
    rec = json.loads((out / "claims.json").read_text())
    assert calls == [0] and sorted(c["layer"] for c in rec["checks"]) == ["data", "llm"]
    (row,) = [r for r in rec["claims"] if r["claim"] == CID]
    assert row["verdict"] == "verified" and row["decided_by"] == ["llm"]
    md = (out / "REPORT.md").read_text()
    assert f"### `{CID}` — verified (decided by llm)" in md


def _outcome(layer: str, verdict: Verdict) -> Outcome:
    chk = Check(CID, layer, f"c_{layer}", verdict, lambda s: CheckResult(verdict, ""))
    return Outcome(chk, CheckResult(verdict, "x"), 0.0)


@pytest.mark.parametrize(
    ("verdicts", "want"),
    [
        ({"data": Verdict.OUT_OF_REACH, "llm": Verdict.VERIFIED}, ("verified", ["llm"])),
        ({"data": Verdict.OUT_OF_REACH, "llm": Verdict.REFUTED}, ("refuted", ["llm"])),
        ({"sim": Verdict.INCONCLUSIVE, "llm": Verdict.PARTLY}, ("partly", ["llm"])),
        ({"sim": Verdict.INCONCLUSIVE, "data": Verdict.OUT_OF_REACH}, ("inconclusive", ["sim"])),
        ({"data": Verdict.OUT_OF_REACH}, ("out_of_reach", ["data"])),
    ],
)
def test_claim_decision_takes_the_deciding_layer(verdicts, want):
    assert claim_decision([_outcome(layer, v) for layer, v in verdicts.items()]) == want


def test_a_changed_item_fails_the_check_even_when_the_verdict_stays(isolated_registry):
    reg = isolated_registry
    reg.declare_claim(CID, "DISA", "Sec. 0", "a fake claim of two parts", kind="empirical")
    got = {"a": True, "b": False}

    def fn(seed: int) -> CheckResult:
        return CheckResult(Verdict.PARTLY, "one of two", items=dict(got))

    reg.register_check(CID, layer="sim", expected=Verdict.PARTLY, name="two", expected_items={"a": True, "b": False})(
        fn
    )
    (chk,) = reg.select(CID)
    assert reg.run_one(chk).ok
    got.update(a=False, b=True)  # the other part holds now: same category "partly", different items
    out = reg.run_one(chk)
    assert out.verdict == "partly" and not out.ok and out.item_changes == {"a": (True, False), "b": (False, True)}
