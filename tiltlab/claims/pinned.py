"""Pinned evidence numbers: what kind each number of a check's evidence is (exact, a residual under a
bound, or stochastic above a measured floor, :class:`PinSpec`), and the pins file of the shipped values
(:func:`pins_file`, written by ``tiltlab report --pin``), which fails a check whose number leaves its pin
even when its verdict stays (docs/pins.md)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiltlab.claims import paths

__all__ = [
    "EXACT",
    "PIN_KINDS",
    "Pin",
    "PinSpec",
    "looks_like_residual",
    "pins",
    "pins_file",
    "residual",
    "set_pins",
    "stochastic",
]

#: The kinds of pinned evidence number (:class:`PinSpec`).
PIN_KINDS = ("exact", "residual", "stochastic")

#: Names that read as an error or residual (``max_err``, ``max_hessian_err``, ``err_tree``,
#: ``max_optimum_error``, ``*residual*``): such a number is never pinned by value
#: (tests/claims/test_pin_kinds.py), nor is a non-zero number smaller than :data:`TINY`.
RESIDUAL_NAME = re.compile(r"(?:^|_)(?:err|error)$|^err_|residual")

TINY = 1e-6


def looks_like_residual(name: str, value: float) -> bool:
    """Whether an evidence number reads as a residual: named like an error (:data:`RESIDUAL_NAME`) or
    non-zero and smaller than :data:`TINY` in magnitude (an exact zero is a count or a closed form)."""
    return bool(RESIDUAL_NAME.search(name)) or 0 < abs(value) < TINY


@dataclass(frozen=True)
class PinSpec:
    """What one pinned evidence number is, declared with its check (``register_check(pins=...)``)
    and judged accordingly by :attr:`Outcome.number_changes`:

    - ``exact`` (the default: symbolic values, closed forms, counts, paper numbers, deterministic
      simulator output): pinned by value within ``max(rtol |v|, 1e-9)`` (``tiltlab report --pin``);
    - ``residual`` (an optimizer's or solver's error, a float-rounding gap, a quantity that is zero in
      exact arithmetic): judged as an upper bound, ``|got| <= bound``, where ``bound`` is the check's
      own tolerance for it; never pinned by value;
    - ``stochastic`` (selection-driven or Monte-Carlo numbers that move across CPU kernel paths):
      pinned by value within ``max(rtol |v|, floor)``, ``floor`` justified by ``why`` (the spread
      measured across kernel paths and CPU vendors).
    """

    kind: str = "exact"
    bound: float = 0.0
    why: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PIN_KINDS:
            raise ValueError(f"pin kind must be one of {', '.join(PIN_KINDS)}, got {self.kind!r}")
        if not (math.isfinite(self.bound) and self.bound >= 0):
            raise ValueError(f"a {self.kind} pin needs a finite bound / floor >= 0, got {self.bound!r}")
        if self.kind == "residual" and self.bound <= 0:
            raise ValueError("a residual pin needs a bound > 0 (the check's own tolerance)")
        if self.kind == "stochastic" and not (self.bound > 0 and self.why.strip()):
            raise ValueError("a stochastic pin needs a floor > 0 and a why (the spread it was measured from)")


EXACT = PinSpec()


def residual(bound: float, why: str = "") -> PinSpec:
    """A residual judged as ``|number| <= bound`` (``bound``: the check's own tolerance)."""
    return PinSpec("residual", float(bound), why)


def stochastic(floor: float, why: str) -> PinSpec:
    """A number pinned by value within ``max(rtol |v|, floor)``; ``why`` names the measured spread."""
    return PinSpec("stochastic", float(floor), why)


class Pin(tuple):
    """One pinned number as stored in ``pins.json``: ``(value, tol, kind)``. ``exact`` /
    ``stochastic``: ``|got - value| <= tol``; ``residual``: ``|got| <= tol`` (``value`` is what the
    pinning run saw, for the reader)."""

    __slots__ = ()

    def __new__(cls, value: float, tol: float, kind: str = "exact") -> Pin:
        if kind not in PIN_KINDS:
            raise ValueError(f"pin kind must be one of {', '.join(PIN_KINDS)}, got {kind!r}")
        return super().__new__(cls, (float(value), float(tol), kind))

    value = property(lambda self: self[0])
    tol = property(lambda self: self[1])
    kind = property(lambda self: self[2])

    def holds(self, got: Any) -> bool:
        if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(float(got)):
            return False
        if self.kind == "residual":
            return abs(float(got)) <= self.tol
        return abs(float(got) - self.value) <= self.tol

    def describe(self, got: Any) -> str:
        """The words the terminal and both reports use for a pin that did not hold."""
        shown = "missing" if got is None else (f"{got:.6g}" if isinstance(got, float) else str(got))
        if self.kind == "residual":
            return f"{shown} above its bound {self.tol:.2g} (residual)"
        return f"{self.value:.6g} +- {self.tol:.2g} got {shown}" + (
            " (stochastic)" if self.kind == "stochastic" else ""
        )


def pins_file() -> Path:
    """The pinned evidence numbers, ``pins.json`` of the data folder (:func:`tiltlab.claims.paths.data_dir`):
    ``{check key: {number: [value, tolerance, kind]}}`` (``tiltlab report --pin``; :class:`Pin`)."""
    return paths.data_dir() / "pins.json"


_PINS: dict[str, dict[str, Pin]] | None = None


def pins(path: Path | None = None) -> dict[str, dict[str, Pin]]:
    """The pinned numbers of every check, ``{key: {name: (value, absolute tolerance)}}``; read once
    from :func:`pins_file` (empty when there is none). A pinned number outside its tolerance, or
    missing, fails the check (:attr:`Outcome.ok`) even when the verdict and items stay."""
    global _PINS
    if path is not None:
        return _read_pins(Path(path))
    if _PINS is None:
        path = pins_file()
        _PINS = _read_pins(path) if path.is_file() else {}
    return _PINS


def _read_pins(path: Path) -> dict[str, dict[str, Pin]]:
    import json

    raw = json.loads(path.read_text(encoding="utf-8"))
    out: dict[str, dict[str, Pin]] = {}
    for key, nums in raw.get("pins", {}).items():
        row = {}
        for name, entry in nums.items():
            if not (isinstance(entry, list) and len(entry) == 3 and entry[2] in PIN_KINDS):
                raise ValueError(f"{path}: pin {key} {name} must be [value, tolerance, kind], got {entry}")
            value, tol = float(entry[0]), float(entry[1])
            if not (math.isfinite(value) and math.isfinite(tol) and tol >= 0):
                raise ValueError(f"{path}: pin {key} {name} needs a finite value and tolerance >= 0, got {entry}")
            row[name] = Pin(value, tol, entry[2])
        out[key] = row
    return out


def set_pins(value: Mapping[str, Mapping[str, tuple]] | None) -> None:
    """Replace the loaded pins (tests; ``None`` re-reads :func:`pins_file` on next use); a
    ``(value, tol)`` pair is an exact pin."""
    global _PINS
    _PINS = None if value is None else {k: {n: Pin(*p) for n, p in row.items()} for k, row in value.items()}
