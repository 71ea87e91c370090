"""Writing the pins (``pins.json``, :mod:`tiltlab.claims.pinned`) and the check costs (``costs.json``) from a
record: ``tiltlab report --pin`` / ``--costs``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiltlab.claims import pinned, registry
from tiltlab.claims.rows import row_key
from tiltlab.files import write_text

__all__ = ["PIN_ATOL", "PIN_LAYERS", "llm_pins", "write_costs", "write_pins"]


PIN_LAYERS = ("theory", "sim", "data")
"""Layers whose numbers are deterministic at a fixed seed and run in every ``tiltlab check``."""
PIN_ATOL = 1e-9
"""Absolute floor of a pin's tolerance (residuals of order 1e-17 are rounding, not evidence)."""


def llm_pins(llm_rec: Mapping[str, Any] | None) -> dict[str, dict[str, list[float]]]:
    """Pins of the shipped llm record: every judged item's mean (a number ``k`` with ``k_margin``,
    ``k_lo`` and ``k_hi`` beside it), with half its 95% interval as the tolerance. The tiny-model
    runs are bit-reproducible at a fixed thread count on one machine but not across machines; a
    re-run that moves an item's mean by more than half its interval is a regression, whatever the
    verdict."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in (llm_rec or {}).get("checks", []):
        nums = r.get("numbers", {})
        pins = {}
        for k, v in nums.items():
            lo, hi = nums.get(f"{k}_lo"), nums.get(f"{k}_hi")
            numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (v, lo, hi))
            if f"{k}_margin" in nums and numeric and math.isfinite(float(v)):
                pins[k] = [float(v), max((float(hi) - float(lo)) / 2, PIN_ATOL)]
        if pins and r.get("ok"):
            out[row_key(r)] = dict(sorted(pins.items()))
    return out


def write_pins(
    rec: Mapping[str, Any],
    dest: Path,
    rtol: float = 1e-4,
    layers=PIN_LAYERS,
    llm_rec: Mapping[str, Any] | None = None,
    checks: Mapping[str, Any] | None = None,
) -> tuple[int, int]:
    """Pin every finite number of the record's rows of ``layers`` run at seed 0 (not recorded rows) by
    its declared kind (:meth:`registry.Check.pin_spec`): ``exact`` as ``[value, max(rtol |value|,
    PIN_ATOL), "exact"]``, ``stochastic`` with the check's floor as well, ``residual`` as ``[value,
    bound, "residual"]`` (judged ``|got| <= bound``); plus the judged items of the shipped llm record
    ``llm_rec`` (:func:`llm_pins`), written atomically to ``dest``. ``checks``: check key -> object
    with ``pin_spec(name)`` (default: the registered checks). Returns ``(checks, numbers)`` pinned.
    Refuses a record with a failed or crashed row, or a residual above its own bound (a pin of a
    wrong run would make the wrong numbers the expected ones)."""
    if not (math.isfinite(rtol) and rtol > 0):
        raise ValueError(f"--pin-rtol must be a finite number > 0, got {rtol}")
    if rec.get("seed", 0) != 0:
        raise ValueError(
            f"pins come from a run at seed 0 (what `tiltlab check` runs); this record has seed {rec.get('seed')}"
        )
    rows = [r for r in rec.get("checks", []) if r.get("layer") in layers and r.get("source") != "recorded"]
    bad = [row_key(r) for r in rows if not r.get("ok")]
    if bad:
        raise ValueError(
            f"the record has {len(bad)} failed or crashed check(s) ({', '.join(bad[:3])}); fix them before pinning"
        )
    if not rows:
        raise ValueError(f"the record has no rows of layers {', '.join(layers)} to pin")
    if checks is None:
        registry.require_catalogued("pinning.write_pins")
        checks = {c.key: c for c in registry.checks()}
    out: dict[str, dict[str, list[Any]]] = {}
    n = 0
    over: list[str] = []
    by_value: list[str] = []
    for r in sorted(rows, key=row_key):
        chk = checks.get(row_key(r))
        nums: dict[str, list[Any]] = {}
        for k, v in sorted(r.get("numbers", {}).items()):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
                continue
            spec = chk.pin_spec(k) if chk is not None else pinned.EXACT
            if spec.kind != "residual" and pinned.looks_like_residual(k, float(v)):
                by_value.append(f"{row_key(r)} {k} = {v:.3g}")
            if spec.kind == "residual":
                if abs(float(v)) > spec.bound:
                    over.append(f"{row_key(r)} {k} {v:.3g} > {spec.bound:.3g}")
                nums[k] = [float(v), spec.bound, "residual"]
            else:
                floor = spec.bound if spec.kind == "stochastic" else 0.0
                nums[k] = [float(v), max(rtol * abs(float(v)), PIN_ATOL, floor), spec.kind]
        if nums:
            out[row_key(r)] = nums
            n += len(nums)
    if by_value:
        raise ValueError(
            f"{len(by_value)} number(s) read as residuals (named like an error, or 0 < |v| < {pinned.TINY:g}) but "
            f"would be pinned by value: {'; '.join(by_value[:3])}; declare each with register_check(pins={{name: "
            "residual(bound)}) (bound: the check's own tolerance)"
        )
    if over:
        raise ValueError(f"{len(over)} residual(s) above their check's own bound: {'; '.join(over[:3])}")
    for key, pins in llm_pins(llm_rec).items():
        out[key] = {k: [*v, "stochastic"] for k, v in pins.items()}  # seeded means: half their interval
        n += len(pins)
    payload = {
        "about": "pinned evidence numbers: [value, tolerance, kind]; exact and stochastic numbers fail "
        "`tiltlab check` when |got - value| > tolerance, a residual when |got| > its bound (the check's own "
        "tolerance; value is what the pinning run saw), even when the verdict stays; kinds are declared "
        "with each check (register_check(pins=...)); regenerate with `tiltlab check --out F && tiltlab "
        "report --record F --pin` after a change that moves them on purpose",
        "commit": rec.get("commit"),
        "rtol": rtol,
        "atol": PIN_ATOL,
        "pins": out,
    }
    write_text(Path(dest), json.dumps(payload, indent=1, sort_keys=True) + "\n")
    pinned.set_pins(None)
    return len(out), n


def write_costs(rec: Mapping[str, Any], dest: Path, layers=PIN_LAYERS) -> int:
    """Write the seconds of the record's rows of ``layers`` (run, not recorded) as the check costs
    that ``tiltlab check --jobs N`` starts longest first (``tiltlab.paper_checks.cli.longest_first``);
    from a ``--jobs 1`` run, whose seconds are each check's own. Returns the number of checks."""
    rows = [r for r in rec.get("checks", []) if r.get("layer") in layers and r.get("source") != "recorded"]
    if not rows:
        raise ValueError(f"the record has no rows of layers {', '.join(layers)} with run times")
    out = {
        "about": "seconds each fast check took in one `tiltlab check --jobs 1` run: `tiltlab check --jobs N` "
        "starts the longest first (a scheduling hint; it changes no result); regenerate with "
        "`tiltlab check --jobs 1 --out F && tiltlab report --record F --costs`",
        "commit": rec.get("commit"),
        "cpu": (rec.get("machine") or {}).get("cpu"),
        "seconds": {row_key(r): round(float(r.get("seconds", 0.0)), 3) for r in sorted(rows, key=row_key)},
    }
    write_text(dest, json.dumps(out, indent=1) + "\n")
    return len(out["seconds"])
