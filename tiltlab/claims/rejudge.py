"""Re-deriving a recorded row from its raw values: everything a verdict rests on, not only the verdict.

A row of a record keeps what its check measured (``evidence``: the per-unit item values, the rule's
settings, and for a check that keeps them the per-prompt values behind the item values, ``raw``) beside
what it concluded (``verdict``, the item flags ``items``, the item statistics in ``numbers``). A
re-judge that compared the recorded verdict with the evidence's *recorded* verdict would compare the
record with itself; :func:`rejudge_row` instead re-derives, bottom up, and compares each level with
what the row says:

1. **item values from the raw values** (where the row keeps ``raw``; its check registers the
   re-derivation, ``register_check(..., rederive=f)``, which :func:`tiltlab.claims.rejudging.rejudge_rows`
   looks up; e.g. per-prompt correct counts -> per-run Mean@8
   -> per-run paired differences): each item's values, and the per-run numbers the check reports;
2. **the judgement from the item values** (:func:`tiltlab.claims.stats.rejudge`): each item's mean,
   interval, margin and one-sided p-values in ``numbers``, the unit count ``seeds``, the item flags
   ``<item>_supports`` / ``_against`` and the "it ran" flags in ``items``, the verdict under the other
   threshold choice, the evidence's own verdicts, and the row's verdict.

Any difference beyond :data:`RTOL` / :data:`ATOL` (numbers) or any inequality (verdicts, flags) makes
the row ``differs`` and is named (``field: recorded X, re-derived Y``). The llm layer writes every
judged number in one layout (:func:`tiltlab.llm.checks.rules.judge`: ``<item>``, ``<item>_lo``,
``_hi``, ``_margin``, ``_p_supports``, ``_p_against``, ``seeds``, ``verdict_other_threshold``), so on
its rows a number that is not reported is a difference too; rows of the other layers (re-run and
pinned by every ``tiltlab check``) are compared where they report an item's numbers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tiltlab.claims import stats

__all__ = [
    "ATOL",
    "RTOL",
    "Rederive",
    "experiment_families",
    "judge_jointly",
    "per_experiment",
    "rejudge_row",
    "under_items",
]

#: Relative tolerance of a re-derived number. The numbers are re-derived by the same arithmetic from
#: the same values (JSON keeps every float exactly), so on one install they agree to the last bit; 1e-9
#: admits Student's t (``scipy.special.stdtr`` / ``stdtrit``) of another scipy build, which agree to
#: ~1e-14 relative, and is far below any printed digit (a moved raw value moves a mean by ~1e-3).
RTOL = 1e-9
#: Absolute tolerance, for numbers at zero (a zero-width interval's half width, a p-value of 1e-300).
ATOL = 1e-12

#: A check's re-derivation of its item values from its raw values: ``(raw, item names) -> (item values
#: by name, reported numbers by name)``; an item it cannot derive is left out (and then differs).
Rederive = Callable[[Mapping[str, Any], Sequence[str]], tuple[Mapping[str, Sequence[float]], Mapping[str, float]]]

_STRICT_LAYERS = ("llm",)


def _close(a: Any, b: float) -> bool:
    if isinstance(a, bool) or not isinstance(a, int | float):
        return False
    return math.isclose(float(a), float(b), rel_tol=RTOL, abs_tol=ATOL)


def _item_keys(nums: Mapping[str, Any], name: str) -> dict[str, str] | None:
    """Where a row's ``numbers`` report item ``name``'s statistics: ``{ItemTest field or "margin": key}``
    (the llm layout ``name, name_lo, ...``; ``name_mean, name_lo, name_hi, name_p, name_margin`` of
    :meth:`stats.Judgement.numbers`), None when neither is there."""
    if name in nums and f"{name}_lo" in nums and f"{name}_hi" in nums:
        keys = {"mean": name, "lo": f"{name}_lo", "hi": f"{name}_hi"}
        for field in ("margin", "p_supports", "p_against"):
            if f"{name}_{field}" in nums:
                keys[field] = f"{name}_{field}"
        return keys
    if f"{name}_mean" in nums and f"{name}_lo" in nums and f"{name}_hi" in nums:
        keys = {"mean": f"{name}_mean", "lo": f"{name}_lo", "hi": f"{name}_hi"}
        keys.update({f: f"{name}_{f}" for f in ("p", "margin") if f"{name}_{f}" in nums})
        return keys
    return None  # (a sim check's ``d_<name>`` is the raw difference, not always the item: d + m for non-inferiority)


def rejudge_row(
    row: Mapping[str, Any], rederive: Rederive | None = None, *, not_loaded: str | None = None, skip_raw: bool = False
) -> dict[str, Any]:
    """Re-derive one row bottom up (module docstring). ``rederive``: the check's re-derivation of its
    item values from ``evidence.raw`` (:attr:`tiltlab.claims.registry.Check.rederive`); a row that keeps
    raw values and gets none differs (the check keeps values nothing re-derives), unless ``not_loaded``
    says why there is none here (the check's module is not importable: the re-derivation starts from the
    item values) or ``skip_raw`` (start from the item values on purpose). Returns ``claim``, ``layer``,
    ``check``, ``recorded`` (verdict), ``rejudged``, ``other_threshold``, ``status`` (``same`` /
    ``differs`` / ``no raw values``), ``differences`` (one line per field that does not follow), and
    ``from`` (what the re-derivation started from). :func:`tiltlab.claims.rejudging.rejudge_rows` looks the
    re-derivation up in the registry."""
    out: dict[str, Any] = {
        "claim": row.get("claim"),
        "layer": row.get("layer"),
        "check": row.get("check"),
        "recorded": row.get("verdict"),
        "rejudged": None,
        "other_threshold": None,
        "differences": [],
        "from": None,
    }
    ev = row.get("evidence")
    if not ev:
        return {**out, "status": "no raw values"}
    diffs: list[str] = out["differences"]

    def differ(field: str, recorded: Any, derived: Any) -> None:
        diffs.append(f"{field}: recorded {recorded!r}, re-derived {derived!r}")

    strict = row.get("layer") in _STRICT_LAYERS
    nums: Mapping[str, Any] = row.get("numbers") or {}
    ev_items = list(ev.get("items") or [])
    # 1. the item values from the raw values
    out["from"] = "item values"
    raw = ev.get("raw")
    fn = rederive  # (narrowed below)
    if raw is not None and skip_raw:
        out["from"] = "item values (raw values kept, not re-derived by this call)"
    elif raw is not None:
        if fn is None and not_loaded is not None:
            out["from"] = f"item values (raw values kept; not re-derived: {not_loaded})"
        elif fn is None:
            differ("evidence.raw", "kept", f"no re-derivation registered for check {row.get('check')}")
        else:
            assert callable(fn)
            out["from"] = "raw values"
            failed = False
            try:
                values, reported = fn(raw, [str(it.get("name")) for it in ev_items])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                differ("evidence.raw", "kept", f"not re-derivable ({type(exc).__name__}: {exc})")
                values, reported, failed = {}, {}, True
            for it in ev_items:
                name, rec_vals = str(it.get("name")), list(it.get("values") or [])
                if name not in values:
                    if not failed:
                        differ(f"evidence.items.{name}.values", "kept", "not derived from the raw values")
                    continue
                new = [float(v) for v in values[name]]
                if len(new) != len(rec_vals):
                    differ(f"evidence.items.{name}.values", f"{len(rec_vals)} values", f"{len(new)} values")
                    continue
                for i, (a, b) in enumerate(zip(rec_vals, new)):
                    if not _close(a, b):
                        differ(f"evidence.items.{name}.values[{i}]", a, b)
            for k, v in reported.items():
                if not _close(nums.get(k), float(v)):
                    differ(f"numbers.{k}", nums.get(k, "not reported"), float(v))
    # 2. the judgement from the item values
    try:
        j = stats.rejudge(ev)
    except ValueError as exc:
        differ("evidence", "a record of stats.judge", f"not re-judgeable ({exc})")
        return {**out, "status": "differs"}
    out["rejudged"], out["other_threshold"] = j.verdict, j.alt_verdict
    if row.get("verdict") != j.verdict:
        differ("verdict", row.get("verdict"), j.verdict)
    if ev.get("verdict") != j.verdict:
        differ("evidence.verdict", ev.get("verdict"), j.verdict)
    if ev.get("alt_verdict") != j.alt_verdict:
        differ("evidence.alt_verdict", ev.get("alt_verdict"), j.alt_verdict)
    if ("verdict_other_threshold" in nums or strict) and nums.get("verdict_other_threshold") != j.alt_verdict:
        differ("numbers.verdict_other_threshold", nums.get("verdict_other_threshold", "not reported"), j.alt_verdict)
    flags = row.get("items") or {}
    for k, v in j.flags().items():
        if (k in flags or strict) and flags.get(k) is not v:
            differ(f"items.{k}", flags.get(k, "not reported"), v)
    for it in j.items:
        t = j.tests[it.name]
        keys = _item_keys(nums, it.name)
        if keys is None:
            if strict:
                differ(f"numbers.{it.name}", "not reported", t.mean)
            continue
        if strict:  # the llm layout reports every one of them
            for field in ("margin", "p_supports", "p_against"):
                if field not in keys:
                    want = it.margin if field == "margin" else float(getattr(t, field))
                    differ(f"numbers.{it.name}_{field}", "not reported", want)
        for field, key in keys.items():
            want = it.margin if field == "margin" else float(getattr(t, field))
            if not _close(nums.get(key), want):
                differ(f"numbers.{key}", nums.get(key), want)
    sampled = [it for it in j.items if not it.exact]
    if sampled and ("seeds" in nums or strict) and nums.get("seeds") != len(sampled[0].values):
        differ("numbers.seeds", nums.get("seeds", "not reported"), len(sampled[0].values))
    return {**out, "status": "differs" if diffs else "same"}


# --------------------------------------------------------------------------- one Holm family per experiment


def judge_jointly(evidences: Sequence[Mapping[str, Any]]) -> list[stats.Judgement]:
    """The judgements of several :meth:`stats.Judgement.evidence` records with *one* Holm family over all
    their judged items at their (common) level: an item two records share -- same name, kind, margin and
    values: one experiment's number judged for two claims -- is one hypothesis, counted once. Each item's
    test is :func:`stats.rejudge`'s with the outcome the joint family gives it; each record's verdict is
    then combined as :func:`stats.judge` combines (its "it ran" flags and cap included). With one record
    this is :func:`stats.rejudge`."""
    singles = [stats.rejudge(ev) for ev in evidences]
    alphas = {j.alpha for j in singles}
    if len(alphas) > 1:
        raise ValueError(f"one Holm family needs one level, got alpha {sorted(alphas)}")
    out: list[stats.Judgement] = []
    if not singles:
        return out
    alpha = alphas.pop()
    judged = list(dict.fromkeys(it for j in singles for it in j.items if it.kind != stats.CONTEXT and not it.exact))
    rejected: dict[bool, dict[stats.Item, bool]] = {}
    for swap in (False, True):
        ps = []
        for it in judged:
            p_sup, p_ag = it.pvalues(swap)
            ps.append(min(1.0, 2.0 * min(p_sup, p_ag)))
        rejected[swap] = dict(zip(judged, stats.holm(ps, alpha) if judged else []))

    def tests(j: stats.Judgement, swap: bool) -> dict[str, stats.ItemTest]:
        base = j.tests if not swap else stats._tests(j.items, alpha, swap=True)
        new = dict(base)
        for it in j.items:
            if it.kind == stats.CONTEXT or it.exact:
                continue
            t = base[it.name]
            side = stats.SUPPORTS if t.p_supports <= t.p_against else stats.AGAINST
            new[it.name] = dataclasses.replace(t, outcome=side if rejected[swap][it] else stats.UNDECIDED)
        return new

    for j in singles:
        t0, t1 = tests(j, False), tests(j, True)
        verdict = stats._verdict(t0, j.items, j.ran, j.not_ran, j.cap, stats.aggregate)
        alt = stats._verdict(t1, j.items, j.ran, j.not_ran, j.cap, stats.aggregate)
        out.append(dataclasses.replace(j, verdict=verdict, alt_verdict=alt, tests=t0))
    return out


def experiment_families(
    rows: Sequence[Mapping[str, Any]], shared: Iterable[tuple[str, Sequence[str]]]
) -> list[list[int]]:
    """Indices of ``rows`` grouped by experiment: rows whose claims a ``[[shared_run]]`` of the
    registration names together share one set of runs, transitively (a claim judged on two runs joins
    them); every other row is its own experiment. Groups in the order of their first row."""
    parent = list(range(len(rows)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_claim: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_claim.setdefault(str(r.get("claim")), []).append(i)
    for _, claims in shared:
        idx = [i for c in claims for i in by_claim.get(str(c), [])]
        for i in idx[1:]:
            parent[find(i)] = find(idx[0])
    groups: dict[int, list[int]] = {}
    for i in range(len(rows)):
        groups.setdefault(find(i), []).append(i)
    return list(groups.values())


def per_experiment(
    rows: Sequence[Mapping[str, Any]], shared: Iterable[tuple[str, Sequence[str]]]
) -> list[dict[str, Any] | None]:
    """Per row (None for a row without evidence): ``{"verdict", "alt_verdict", "family"}`` under one Holm
    family per experiment (:func:`experiment_families`, :func:`judge_jointly`; ``family``: the claims of
    the row's experiment), beside the registered rule's one family per check."""
    out: list[dict[str, Any] | None] = [None] * len(rows)
    for group in experiment_families(rows, list(shared)):
        members = [i for i in group if rows[i].get("evidence")]
        judged = judge_jointly([rows[i]["evidence"] for i in members])
        claims = [str(rows[i].get("claim")) for i in members]
        for i, j in zip(members, judged):
            out[i] = {"verdict": j.verdict, "alt_verdict": j.alt_verdict, "family": claims}
    return out


# --------------------------------------------------------------------------- a run under earlier items


def under_items(row: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The row's verdict under another item set (``[{"name", "kind", "margin"}]``: the items a claim was
    registered with before a re-specification, :func:`tiltlab.claims.prereg.respecifications`), from the
    per-unit values the row keeps for those items (any kind: a number reported as context keeps its values)
    and the row's own "it ran" flags, level and cap: ``{"verdict", "alt_verdict", "items": {name:
    outcome}, "missing": [names the row has no values for]}``; the verdict is None when an item is missing."""
    ev = row.get("evidence") or {}
    have = {str(r["name"]): r for r in ev.get("items") or []}
    missing = [str(i["name"]) for i in items if str(i["name"]) not in have]
    if missing or not ev:
        return {"verdict": None, "alt_verdict": None, "items": {}, "missing": missing}
    old = [
        {
            **have[str(i["name"])],
            "kind": str(i["kind"]),
            "margin": float(i["margin"]),
            "exact": bool(have[str(i["name"])].get("exact", False)),
        }
        for i in items
    ]
    j = stats.rejudge({**ev, "items": old})
    return {
        "verdict": j.verdict,
        "alt_verdict": j.alt_verdict,
        "items": {k: t.outcome for k, t in j.tests.items()},
        "missing": [],
    }
