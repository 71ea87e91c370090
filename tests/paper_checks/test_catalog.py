"""The catalog of check layers (tiltlab.paper_checks.catalog): which layers load, which may be skipped,
and that what needs every check refuses to run on a registry the catalog has not completed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tiltlab.llm
import tiltlab.theory
from tiltlab.claims import llm_record, pinning, registry
from tiltlab.paper_checks import catalog


def _block(monkeypatch, package, name: str) -> None:
    """Make ``from package import name`` raise ImportError (as an absent or broken module would)."""
    monkeypatch.setitem(sys.modules, f"{package.__name__}.{name}", None)
    monkeypatch.delattr(package, name, raising=False)


def test_discover_loads_every_layer_and_completes_the_registry(isolated_registry):
    catalog.discover()
    assert catalog.check_modules() == [
        "tiltlab.theory.checks",
        "tiltlab.sim.checks",
        "tiltlab.paper_checks.data_checks",
        "tiltlab.llm.checks",
    ]
    assert catalog.SKIPPED_MODULES == {}
    assert {c.layer for c in registry.checks()} == {"theory", "sim", "data", "llm"}
    registry.require_catalogued("this test")  # does not raise


def test_an_unimportable_llm_layer_is_skipped_and_said(isolated_registry, monkeypatch):
    _block(monkeypatch, tiltlab.llm, "checks")
    monkeypatch.setattr(catalog, "SKIPPED_MODULES", {})
    catalog.discover()
    assert list(catalog.SKIPPED_MODULES) == [catalog.LLM_CHECKS]
    assert catalog.SKIPPED_MODULES[catalog.LLM_CHECKS].startswith("not importable: ")
    assert catalog.check_modules()[-1] == catalog.LLM_CHECKS
    assert catalog.check_modules()[:3] == [
        "tiltlab.theory.checks",
        "tiltlab.sim.checks",
        "tiltlab.paper_checks.data_checks",
    ]


def test_an_unimportable_core_layer_is_an_error_not_a_skip(isolated_registry, monkeypatch):
    _block(monkeypatch, tiltlab.theory, "checks")
    monkeypatch.setattr(catalog, "SKIPPED_MODULES", {})
    with pytest.raises(ImportError):
        catalog.discover()
    assert catalog.SKIPPED_MODULES == {}


@pytest.mark.parametrize(
    "call",
    [
        lambda tmp: llm_record.llm_registry_hash(),
        lambda tmp: llm_record.set_llm_expectations(tmp / "none.json"),
        lambda tmp: llm_record.ship_llm_record(tmp / "none.json", tmp / "out.json", machine_desc="m"),
        lambda tmp: pinning.write_pins(
            {"checks": [{"layer": "sim", "ok": True, "claim": "c", "check": "x"}]}, tmp / "p.json"
        ),
    ],
    ids=["llm_registry_hash", "set_llm_expectations", "ship_llm_record", "write_pins"],
)
def test_what_needs_every_check_refuses_an_uncatalogued_registry(monkeypatch, tmp_path, call):
    monkeypatch.setattr(registry, "_CATALOGUED", [False])
    with pytest.raises(
        RuntimeError, match=r"needs every registered check: call tiltlab\.paper_checks\.catalog\.discover"
    ):
        call(tmp_path)


def test_a_layer_that_loads_again_is_no_longer_reported_skipped(isolated_registry, monkeypatch):
    monkeypatch.setattr(catalog, "SKIPPED_MODULES", {catalog.LLM_CHECKS: "not importable: an earlier failure"})
    catalog.discover()
    assert catalog.SKIPPED_MODULES == {}
    assert catalog.check_modules().count(catalog.LLM_CHECKS) == 1


def test_the_data_folder_is_the_checkouts_and_holds_every_registered_rule_file():
    """The data folder paper_checks gives the claims core (:func:`tiltlab.claims.paths.configure`, called on
    its import) is the real ``paper_checks/`` folder, resolved (not the ``tiltlab/paper_checks`` link), so
    the root that ``tiltlab report --preregister`` reads rule files from (the registration file's
    grandparent) holds every file the registration names."""
    from tiltlab import paper_checks
    from tiltlab.claims import paths, prereg

    data = paths.data_dir()
    assert data == paper_checks.DATA_DIR == Path(paper_checks.__file__).resolve().parent
    assert data.resolve() == data and data.name == "paper_checks" and not data.is_symlink()
    assert prereg.prereg_file() == data / "preregistration.toml"
    root = prereg.prereg_file().parents[1]
    files = {p for entry in prereg.preregistration().values() for p in entry["files"]}
    assert files and all((root / p).is_file() for p in files), sorted(p for p in files if not (root / p).is_file())


def test_the_claims_core_without_a_data_folder_says_how_to_give_one(monkeypatch):
    """The claims core never reaches for the top layer's folder: without :func:`~tiltlab.claims.paths.configure`
    it refuses in one line naming the fix, and a folder that does not exist is refused when given."""
    from tiltlab.claims import paths

    monkeypatch.setattr(paths, "_DATA_DIR", [None])
    with pytest.raises(RuntimeError, match=r"import tiltlab\.paper_checks .*configure\(DIR\)"):
        paths.data_dir()
    with pytest.raises(ValueError, match="does not exist"):
        paths.configure(Path("/nonexistent/tiltlab-data"))
    assert paths.configured() is False


def test_the_shipped_pins_are_what_a_check_is_judged_against_by_default():
    from tiltlab.claims import pinned

    pinned.set_pins(None)  # re-read on next use
    try:
        loaded = pinned.pins()
        assert loaded and loaded == pinned.pins(pinned.pins_file())
    finally:
        pinned.set_pins(None)
