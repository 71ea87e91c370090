"""A claim's one verdict from its checks' verdicts (the rule the report shows and ``tiltlab check``
prints per claim)."""

from __future__ import annotations

from collections.abc import Sequence

from tiltlab.claims.registry import Outcome

__all__ = ["DECISION_ORDER", "claim_decision", "claim_rows", "claim_status"]

#: Which verdict decides a claim with several checks, most decisive first.
DECISION_ORDER = ("error", "refuted", "partly", "verified", "inconclusive", "out_of_reach")

_LAYER_ORDER = {"theory": 0, "sim": 1, "data": 2, "llm": 3}


def claim_decision(outs: Sequence[Outcome]) -> tuple[str, list[str]]:
    """One verdict per claim and the layers whose checks decided it.

    An error wins, then the most informative decided verdict (refuted > partly > verified), then
    ``inconclusive`` (a toy proxy that cannot decide), then ``out_of_reach``. So a claim whose data
    check is out of reach, or whose sim proxy is inconclusive, takes the verdict of the layer that
    decided it (e.g. ``llm``); ``(unchecked, [])`` without checks. A verdict the order does not name
    ranks after all of them (the first by name among several); the deciding layers come in the order
    theory, sim, data, llm, then any other layer by name."""
    if not outs:
        return "unchecked", []
    vs = {o.verdict for o in outs}
    # a verdict outside the order (a recorded row of another version) ranks after every known one
    v = min(vs, key=lambda x: (DECISION_ORDER.index(x) if x in DECISION_ORDER else len(DECISION_ORDER), x))
    return v, sorted({o.check.layer for o in outs if o.verdict == v}, key=_layer_rank)


def _layer_rank(layer: str) -> tuple[int, str]:
    """theory, sim, data, llm; another layer after them, by name."""
    return _LAYER_ORDER.get(layer, len(_LAYER_ORDER)), layer


def claim_status(outs: Sequence[Outcome]) -> str:
    """The verdict of :func:`claim_decision` (``unchecked`` without checks)."""
    return claim_decision(outs)[0]


def claim_rows(outs: Sequence[Outcome]) -> list[dict[str, object]]:
    """One row per claim with checks in ``outs`` (sorted by claim): ``{"claim", "verdict", "decided_by",
    "checks"}``, the claim's verdict its most informative check's (:func:`claim_decision`)."""
    by_claim: dict[str, list[Outcome]] = {}
    for o in outs:
        by_claim.setdefault(o.check.claim_id, []).append(o)
    rows: list[dict[str, object]] = []
    for cid, os_ in sorted(by_claim.items()):
        verdict, layers = claim_decision(os_)
        rows.append({"claim": cid, "verdict": verdict, "decided_by": layers, "checks": [o.check.name for o in os_]})
    return rows
