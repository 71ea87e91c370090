"""A NaN run is an error, never a verdict; pinned numbers fail a check whose verdict stays."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tiltlab.claims import pinned, pinning, prereg, registry
from tiltlab.claims.registry import Check, CheckResult, Outcome, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import catalog


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_number_raises(bad):
    with pytest.raises(ValueError, match=r"non-finite evidence number\(s\) x="):
        CheckResult(Verdict.VERIFIED, "s", {"x": bad, "y": 1.0})


def test_non_finite_numpy_and_torch_scalars_raise():
    import numpy as np
    import torch

    with pytest.raises(ValueError, match="non-finite"):
        CheckResult(Verdict.VERIFIED, "s", {"x": np.float64("nan")})
    with pytest.raises(ValueError, match="non-finite"):
        CheckResult(Verdict.VERIFIED, "s", {"x": torch.tensor(float("inf"))})


def test_opt_in_key_keeps_its_non_finite_value_as_text_and_only_that_key():
    r = CheckResult(Verdict.VERIFIED, "s", {"never": math.inf, "x": 2.0}, nonfinite=("never",))
    assert r.numbers == {"never": "inf", "x": 2.0}
    with pytest.raises(ValueError, match="y=nan"):
        CheckResult(Verdict.VERIFIED, "s", {"never": math.inf, "y": math.nan}, nonfinite=("never",))
    with pytest.raises(ValueError, match="not numbers of the result"):
        CheckResult(Verdict.VERIFIED, "s", {"x": 1.0}, nonfinite=("typo",))


def test_a_nan_check_fails_tiltlab_check(isolated_registry, tmp_path, capsys):
    reg = isolated_registry
    reg.declare_claim("zz_fake.claim", "DISA", "Sec. 0", "a fake claim", kind="empirical")

    def nan_run(seed):  # a rule helper that maps NaN to "inconclusive" would stay green without the guard
        return CheckResult(Verdict.INCONCLUSIVE, "nothing", {"diff_lo": math.nan, "diff_hi": math.nan})

    reg.register_check("zz_fake.claim", layer="sim", expected=Verdict.INCONCLUSIVE, name="nan")(nan_run)
    assert main(["check", "--only", "zz_fake", "--out", str(tmp_path / "c.json")]) == 1
    assert "crashed: ValueError: non-finite evidence number(s) diff_lo=nan" in capsys.readouterr().out


def _outcome(numbers, key="zz.c[sim:x]"):
    chk = Check("zz.c", "sim", "x", Verdict.VERIFIED, lambda s: None)
    return Outcome(chk, CheckResult(Verdict.VERIFIED, "s", numbers), 0.0)


@pytest.fixture
def pins():
    pinned.set_pins({"zz.c[sim:x]": {"a": (1.0, 1e-4), "b": (-2.0, 0.5)}})
    try:
        yield
    finally:
        pinned.set_pins(None)


def test_pinned_numbers_inside_tolerance_pass(pins):
    assert _outcome({"a": 1.0 + 0.9e-4, "b": -2.49}).ok
    assert _outcome({"a": 1.0 - 0.9e-4, "b": -1.51, "other": 9.0}).ok


@pytest.mark.parametrize(
    "numbers,moved",
    [
        ({"a": 1.0 + 1.1e-4, "b": -2.0}, ["a"]),
        ({"a": 1.0, "b": -2.51}, ["b"]),
        ({"a": 1.0, "b": -1.49}, ["b"]),
        ({"b": -2.0}, ["a"]),  # missing
        ({"a": "1.0", "b": -2.0}, ["a"]),  # not a number
        ({"a": True, "b": -2.0}, ["a"]),  # a bool is not a number here
    ],
)
def test_a_moved_or_missing_pinned_number_fails_the_check(pins, numbers, moved):
    o = _outcome(numbers)
    assert not o.ok and sorted(o.number_changes) == moved
    assert o.result.verdict == o.check.expected and not o.item_changes  # the verdict alone would pass


def test_pins_cli_fails_with_the_moved_number(isolated_registry, tmp_path, capsys):
    reg = isolated_registry
    reg.declare_claim("zz_fake.claim", "DISA", "Sec. 0", "a fake claim", kind="empirical")
    reg.register_check("zz_fake.claim", layer="sim", name="p")(
        lambda seed: CheckResult(Verdict.VERIFIED, "s", {"x": 0.25})
    )
    pinned.set_pins({"zz_fake.claim[sim:p]": {"x": (0.5, 0.01)}})
    try:
        assert main(["check", "--only", "zz_fake", "--out", str(tmp_path / "c.json")]) == 1
        assert (
            "verdict verified as expected, but 1 pinned number(s) moved: x 0.5 +- 0.01 got 0.25"
            in capsys.readouterr().out
        )
    finally:
        pinned.set_pins(None)


def _rec(rows, seed=0):
    return {"seed": seed, "commit": "abc", "checks": rows}


def _row(claim, layer, numbers, ok=True, source=None):
    r = {"claim": claim, "layer": layer, "check": "c", "numbers": numbers, "ok": ok}
    if source:
        r["source"] = source
    return r


def test_write_pins_pins_finite_numbers_of_deterministic_layers_only(tmp_path):
    rows = [
        _row("a.x", "sim", {"v": 2.0, "zero": 0.0, "flag": True, "text": "t", "n": 3}),
        _row("a.y", "llm", {"v": 1.0}),
        _row("a.z", "theory", {"v": -4.0}, source="recorded"),
    ]
    dest = tmp_path / "pins.json"
    catalog.discover()  # write_pins reads every registered check's pin kinds (not the order of the tests)
    n_checks, n_nums = pinning.write_pins(_rec(rows), dest, rtol=1e-3)
    pins = json.loads(dest.read_text())["pins"]
    assert (n_checks, n_nums) == (1, 3) and list(pins) == ["a.x[sim:c]"]
    assert pins["a.x[sim:c]"] == {
        "v": [2.0, 2e-3, "exact"],
        "zero": [0.0, pinning.PIN_ATOL, "exact"],
        "n": [3.0, 3e-3, "exact"],
    }
    assert pinned.pins(dest)["a.x[sim:c]"]["v"] == (2.0, 2e-3, "exact")
    # the regenerated file has the shipped file's layout, field for field
    payload = json.loads(dest.read_text())
    shipped = json.loads((Path(pinning.__file__).resolve().parents[2] / "paper_checks" / "pins.json").read_text())
    assert sorted(payload) == sorted(shipped) == ["about", "atol", "commit", "pins", "rtol"]
    assert (payload["rtol"], payload["atol"], payload["commit"]) == (1e-3, pinning.PIN_ATOL, _rec(rows).get("commit"))
    assert "tiltlab report --record F --pin" in payload["about"]


@pytest.mark.parametrize(
    "rec,msg",
    [
        (_rec([_row("a.x", "sim", {"v": 1.0}, ok=False)]), "failed or crashed"),
        (_rec([_row("a.x", "sim", {"v": 1.0})], seed=3), "seed 0"),
        (_rec([_row("a.x", "llm", {"v": 1.0})]), "no rows"),
    ],
)
def test_write_pins_refuses_a_wrong_record(tmp_path, rec, msg):
    with pytest.raises(ValueError, match=msg):
        pinning.write_pins(rec, tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()


def test_shipped_pins_are_well_formed_and_name_registered_checks():
    catalog.discover()
    keys = {c.key for c in registry.checks()}
    shipped = pinned.pins(pinned.pins_file())
    assert shipped, "paper_checks/pins.json is empty"
    unknown = sorted(set(shipped) - keys)
    assert not unknown, f"pins of checks that are not registered: {unknown[:5]}"
    assert all(c.split("[")[1].split(":")[0] in (*pinning.PIN_LAYERS, "llm") for c in shipped)


def test_llm_pins_are_the_judged_item_means_with_half_their_interval():
    llm = {
        "checks": [
            {
                "claim": "a.b",
                "layer": "llm",
                "check": "t",
                "ok": True,
                "numbers": {
                    "item": 0.1, "item_lo": 0.04, "item_hi": 0.16, "item_margin": 0.02,
                    "acc": 0.5, "acc_lo": 0.4, "acc_hi": 0.6,  # not a judged item: no margin
                    "seeds": 20,
                },
            },
            {"claim": "a.c", "layer": "llm", "check": "t", "ok": False, "numbers": {"x": 1.0, "x_lo": 0.0, "x_hi": 2.0, "x_margin": 0.1}},
        ]
    }  # fmt: skip
    pins = pinning.llm_pins(llm)
    assert list(pins) == ["a.b[llm:t]"]
    assert pins["a.b[llm:t]"] == {"item": [0.1, pytest.approx(0.06)]}
    assert pinning.llm_pins(None) == {}


def test_pin_file_validation_and_the_tolerance_boundary(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"pins": {"k": {"a": [1.0, 0.0, "exact"], "b": [2.0, 0.5, "residual"]}}}))
    assert pinned.pins(f) == {"k": {"a": (1.0, 0.0, "exact"), "b": (2.0, 0.5, "residual")}}  # zero tol allowed
    for bad in ([1.0, -0.1], [float("nan"), 0.1], [1.0, float("inf")], [float("inf"), 0.1]):
        f.write_text(json.dumps({"pins": {"k": {"a": [*bad, "exact"]}}}))
        with pytest.raises(ValueError, match="finite value and tolerance"):
            pinned.pins(f)
    for bad in ([1.0, 0.1], [1.0, 0.1, "approximate"], [1.0, 0.1, "exact", 3]):  # no kind, unknown kind, extra
        f.write_text(json.dumps({"pins": {"k": {"a": bad}}}))
        with pytest.raises(ValueError, match=r"must be \[value, tolerance, kind\]"):
            pinned.pins(f)
    pinned.set_pins({"zz.c[sim:x]": {"a": (1.0, 0.5)}})
    try:
        assert _outcome({"a": 1.5}).ok and _outcome({"a": 0.5}).ok  # exactly at the tolerance: inside
        assert not _outcome({"a": 1.5000001}).ok
    finally:
        pinned.set_pins(None)


def test_preregistration_boundaries(tmp_path):
    f = tmp_path / "p.toml"
    files = '[rule.files]\n"a.py" = "' + "0" * 64 + '"\n'
    f.write_text('[[rule]]\ncheck = "x"\nseeds = 1\n' + files, encoding="utf-8")
    assert prereg.preregistration(f)["x"]["seeds"] == 1
    f.write_text('[[rule]]\ncheck = ""\nseeds = 2\n' + files, encoding="utf-8")
    with pytest.raises(ValueError, match="needs check"):
        prereg.preregistration(f)


def test_write_pins_refuses_a_zero_or_nan_rtol_and_takes_a_record_without_seed(tmp_path):
    rows = [_row("a.x", "sim", {"v": 2.0})]
    for bad in (0.0, float("nan"), -1e-4):
        with pytest.raises(ValueError, match="pin-rtol"):
            pinning.write_pins(_rec(rows), tmp_path / "p.json", rtol=bad)
    rec = {"commit": "abc", "checks": rows}  # no seed key: a run at the default seed 0
    assert pinning.write_pins(rec, tmp_path / "p.json") == (1, 1)


def test_llm_pins_skip_items_whose_interval_is_not_numeric():
    row = {"claim": "a.b", "layer": "llm", "check": "t", "ok": True}
    for lo in ("n/a", True):
        nums = {"item": 0.1, "item_lo": lo, "item_hi": 0.2, "item_margin": 0.02}
        assert pinning.llm_pins({"checks": [{**row, "numbers": nums}]}) == {}


def test_verdict_of_items_all_some_none_and_empty():
    from tiltlab.claims.registry import Verdict

    assert Verdict.of_items([True, True]) is Verdict.VERIFIED
    assert Verdict.of_items([True, False]) is Verdict.PARTLY and Verdict.of_items([False, True]) is Verdict.PARTLY
    assert Verdict.of_items([False, False]) is Verdict.REFUTED
    assert Verdict.of_items(iter([True])) is Verdict.VERIFIED  # any iterable, consumed once
    with pytest.raises(ValueError, match="at least one item"):
        Verdict.of_items([])
