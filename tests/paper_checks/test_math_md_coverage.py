"""Every claim id of ``shared/notes/math.md`` is declared (and, once theory/ and sim/ land, checked)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

MATH_MD = Path(__file__).resolve().parents[2] / ".." / "shared" / "notes" / "math.md"
_ID = re.compile(r"`((?:disa|paced|lad|fpa|flowrl)\.[A-Za-z0-9_.]+)`")


def _math_ids() -> list[str]:
    if not MATH_MD.is_file():
        pytest.skip(f"math.md not found at ../shared/notes/math.md relative to the repository root ({MATH_MD})")
    return sorted(set(_ID.findall(MATH_MD.read_text(encoding="utf-8"))))


def test_math_md_ids_parse():
    ids = _math_ids()
    assert len(ids) >= 25 and "disa.prop1.unbiased" in ids and "fpa.eq5" in ids


def test_every_math_md_id_is_declared(isolated_registry):
    declared = isolated_registry.claims()
    missing = [i for i in _math_ids() if i not in declared]
    assert not missing, f"math.md ids not declared in paper_checks/claims/*.toml: {missing}"


def test_every_math_md_id_has_a_check(isolated_registry):
    have = {c.claim_id for c in isolated_registry.checks()}
    missing = [i for i in _math_ids() if i not in have]
    assert not missing, f"math.md ids without a registered check: {missing}"
