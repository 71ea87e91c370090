"""Papers and claims as data, checks as code.

A *paper* is one source the project cites, known by a short name (``DISA``, ``FlowRL``,
``PACED-RL``, ``LAD``, ``FPA``, ...); the index is ``paper_checks/papers.toml`` (``[[paper]]``
tables), rendered for readers as ``docs/papers.md``.

A *claim* is one statement of one paper: an id (the propositions restated in ``docs/math.md``
plus the empirical claims of the papers' tables and figures), the paper's short name, the
section, the statement. Claims are declared in the TOML files of ``paper_checks/claims/``
(``[[claim]]`` tables; any number of files, loaded in name order). A claim is cited as
``"<paper> <section>"``, e.g. ``DISA §2.2 eq. (10)`` (:func:`cite`).

A *check* is a function ``fn(seed: int) -> CheckResult`` attached to a claim with
:func:`register_check`. A claim may carry several checks (one per layer: ``theory``
for sympy, ``sim`` for the exact simulator, ``llm`` for the LLM layer). Every check
records the verdict it is *expected* to return; ``tiltlab check`` fails only when a
verdict changes, so a claim that is refuted and stays refuted is green, and a change
is loud.

Layers register their checks on import. Which modules hold checks is not this module's business: the
top layer's catalog (:mod:`tiltlab.paper_checks.catalog`) imports them, statically, and then calls
:func:`mark_catalogued`; what needs every check (the shipped record's registry hash, the pins) asks
:func:`require_catalogued` first. This module is the base of the check layers: it imports nothing else
of the project, so ``theory``, ``sim`` and ``llm`` check modules can import it without a cycle.
"""

from __future__ import annotations

import enum
import fnmatch
import math
import time
import tomllib
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiltlab.claims import paths
from tiltlab.claims.pinned import EXACT, Pin, PinSpec, pins

__all__ = [
    "Check",
    "CheckRef",
    "CheckResult",
    "Claim",
    "Outcome",
    "Paper",
    "PinSpec",
    "Verdict",
    "checks",
    "cite",
    "claims",
    "claims_dir",
    "declare_claim",
    "declare_paper",
    "get_claim",
    "get_paper",
    "load_claims",
    "load_papers",
    "mark_catalogued",
    "papers",
    "papers_file",
    "register_check",
    "require_catalogued",
    "validate",
]


def claims_dir() -> Path:
    """The project's claim files (``claims/`` of the data folder, :func:`tiltlab.claims.paths.data_dir`)."""
    return paths.data_dir() / "claims"


def papers_file() -> Path:
    """The project's paper index (``papers.toml`` of the data folder, :func:`tiltlab.claims.paths.data_dir`)."""
    return paths.data_dir() / "papers.toml"


#: Layers whose checks run only when asked for by name (``--layer llm``, ``reproduce --llm``):
#: they train models for minutes each.
OPT_IN_LAYERS: frozenset[str] = frozenset({"llm"})


class Verdict(str, enum.Enum):  # noqa: UP042  (StrEnum would change format() of records; kept as is)
    VERIFIED = "verified"
    REFUTED = "refuted"
    PARTLY = "partly"
    #: the evidence this layer can produce cannot decide the claim (a toy proxy of an LLM-scale
    #: claim); neither support nor a refutation. Another layer (``llm``) may decide it.
    INCONCLUSIVE = "inconclusive"
    OUT_OF_REACH = "out_of_reach"

    def __str__(self) -> str:  # pragma: no cover - cosmetic
        return self.value

    @classmethod
    def of_items(cls, holds: Iterable[bool]) -> Verdict:
        """The deterministic checks' mapping of sub-statements: all hold -> VERIFIED, none -> REFUTED,
        some -> PARTLY (the statistical rules live in :mod:`tiltlab.claims.stats`)."""
        hs = [bool(h) for h in holds]
        if not hs:
            raise ValueError("Verdict.of_items needs at least one item")
        return cls.VERIFIED if all(hs) else (cls.PARTLY if any(hs) else cls.REFUTED)


Number = float | int | bool | str


# --------------------------------------------------------------------------- kinds of pinned numbers


@dataclass(frozen=True)
class Paper:
    """One source of claims.

    Attributes:
        short: the name claims and citations use (``DISA``).
        title: full title.
        authors: authors and year.
        source: where a reader finds it (arXiv id, venue, code).
        about: one paragraph on what it contributes to the project.
        cites: ``(ref, what)`` pairs: the sections / equations the project cites, and why.
    """

    short: str
    title: str
    authors: str = ""
    source: str = ""
    about: str = ""
    cites: tuple[tuple[str, str], ...] = ()


ITEM_KINDS = ("direction", "effect", "equivalence", "context")
"""Item kinds of the decision rule (:mod:`tiltlab.claims.stats`)."""


@dataclass(frozen=True)
class ItemSpec:
    """The declaration of one judged item of a claim (``[[claim.item]]``): which layer's check judges
    it, its name, its kind (:data:`ITEM_KINDS`: ``direction`` threshold 0, ``effect`` threshold
    +-margin, ``equivalence`` inside +-margin, ``context`` reported and never judged: it holds by
    construction) and its margin (smallest effect of interest, in the item's units), and why."""

    layer: str
    name: str
    kind: str
    margin: float
    why: str = ""

    def __post_init__(self) -> None:
        if self.layer not in {"theory", "sim", "llm", "data"}:
            raise ValueError(f"item {self.name!r}: unknown layer {self.layer!r}")
        if not self.name:
            raise ValueError("an item needs a name")
        if self.kind not in ITEM_KINDS:
            raise ValueError(f"item {self.name!r}: kind must be one of {', '.join(ITEM_KINDS)}, got {self.kind!r}")
        m = self.margin
        if isinstance(m, bool) or not (isinstance(m, (int, float)) and math.isfinite(m) and m >= 0):
            raise ValueError(f"item {self.name!r}: margin must be a finite number >= 0, got {m!r}")
        if self.kind == "context" and not self.why:
            raise ValueError(f"item {self.name!r}: a context item says why it holds by construction (why = ...)")
        object.__setattr__(self, "margin", float(m))


@dataclass(frozen=True)
class Claim:
    """One statement of one paper.

    Attributes:
        id: dotted id, e.g. ``disa.prop1.unbiased`` (the ids ``docs/math.md`` uses).
        paper: short name of a paper in the index (``DISA``, ``PACED-RL``, ...; see :func:`papers`).
        section: section / equation / table / figure of that paper (``§2.2 eq. (10)``).
        statement: the claim in one line.
        kind: ``proposition`` (a theorem-like statement), ``empirical`` (a number or a
            figure of the paper), ``beyond`` (a result of ours, not in the paper), ``open``
            (a question the notes raise), or ``typo`` (a table's own consistency, e.g. a printed
            average against its cells; refuted = a printing error, kept apart from the claim
            whose table holds it).
        paper_numbers: the paper's own numbers, as data, to compare re-measured numbers with.
        llm_command: for LLM-scale claims, the ``tiltlab llm ...`` command and config
            that would test it.
        items: the items its statistical checks judge (:class:`ItemSpec`, ``[[claim.item]]``):
            a check's recorded evidence must name exactly these, with these kinds and margins.
    """

    id: str
    paper: str
    section: str
    statement: str
    kind: str = "proposition"
    paper_numbers: Mapping[str, Any] = field(default_factory=dict)
    llm_command: str | None = None
    notes: str = ""
    items: tuple[ItemSpec, ...] = ()

    def __post_init__(self) -> None:
        specs = []
        for it in self.items:
            if isinstance(it, ItemSpec):
                specs.append(it)
                continue
            try:
                specs.append(ItemSpec(**it))
            except TypeError as exc:
                raise ValueError(f"claim {self.id}: bad item {it!r}: {exc}") from None
        keys = [(i.layer, i.name) for i in specs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"claim {self.id}: an item is declared twice: {keys}")
        object.__setattr__(self, "items", tuple(specs))

    def items_for(self, layer: str) -> dict[str, ItemSpec]:
        """The declared items a ``layer`` check of this claim judges, by name."""
        return {i.name: i for i in self.items if i.layer == layer}


@dataclass
class CheckResult:
    """What a check returns.

    Attributes:
        verdict: the verdict this run reached.
        summary: one line of evidence, with the decisive numbers in it.
        numbers: the evidence numbers (machine-readable; go into ``claims.json``).
        figure: optional figure id (``sim`` figures) that shows the claim.
        items: per-item outcomes of a verdict that summarizes several statements (name -> holds);
            compared with the check's ``expected_items``, so a changed item is loud even when the
            verdict category stays the same.
        evidence: the raw record of a statistical verdict (:meth:`stats.Judgement.evidence`: every
            item's kind, margin and per-unit values, the "it ran" flags): ``tiltlab report --rejudge``
            re-derives the verdict from it; its items must be those the claim declares for the layer.
        nonfinite: the keys of ``numbers`` that may be NaN or infinite because that value means
            something (e.g. "never reached" as ``inf``); they are stored as the strings ``'nan'`` /
            ``'inf'`` / ``'-inf'``. Any other non-finite number raises ``ValueError``: a run that
            produced a NaN is an error, never a verdict.
    """

    verdict: Verdict
    summary: str
    numbers: dict[str, Number] = field(default_factory=dict)
    figure: str | None = None
    items: dict[str, bool] = field(default_factory=dict)
    nonfinite: tuple[str, ...] = ()
    evidence: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)
        self.nonfinite = tuple(str(k) for k in self.nonfinite)
        unknown = [k for k in self.nonfinite if k not in self.numbers]
        if unknown:
            raise ValueError(f"nonfinite names keys that are not numbers of the result: {unknown}")
        bad = []
        for k, v in list(self.numbers.items()):
            if hasattr(v, "item"):
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                if k not in self.nonfinite:
                    bad.append(f"{k}={v}")
                v = str(v)
            self.numbers[k] = v
        if bad:
            raise ValueError(
                f"non-finite evidence number(s) {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}: a NaN/inf run "
                "cannot give a verdict (list a key in CheckResult(nonfinite=...) only where non-finite is meaningful)"
            )
        self.items = {str(k): bool(v) for k, v in self.items.items()}


CheckFn = Callable[[int], CheckResult]


class _Named:
    """The name of a check (:class:`Check`, :class:`CheckRef`): its registry key and the command that re-runs it."""

    claim_id: str
    layer: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.claim_id}[{self.layer}:{self.name}]"

    def reproducer(self, seed: int) -> str:
        return f"tiltlab check --only {self.claim_id} --layer {self.layer} --check {self.name} --seed {seed}"


@dataclass(frozen=True)
class Check(_Named):
    claim_id: str
    layer: str
    name: str
    expected: Verdict
    fn: CheckFn
    slow: bool = False
    expected_items: tuple[tuple[str, bool], ...] = ()
    pin_specs: tuple[tuple[str, PinSpec], ...] = ()
    long: bool = False
    """A check of hours (slow too): run only with ``--long``, never by a layer's run; shipped with its own record row."""
    rederive: Callable[..., Any] | None = None
    """``(raw, item names) -> (item values, reported numbers)``: how the check's item values follow from the
    raw values it keeps in ``evidence["raw"]`` (:mod:`tiltlab.claims.rejudge`); None: it keeps none."""

    def pin_spec(self, number: str) -> PinSpec:
        """The declared kind of evidence number ``number``: the first ``pins`` pattern
        (:func:`fnmatch.fnmatchcase`) that matches it, else ``exact``."""
        for pattern, spec in self.pin_specs:
            if fnmatch.fnmatchcase(number, pattern):
                return spec
        return EXACT


@dataclass(frozen=True)
class CheckRef(_Named):
    """A check as a record's row names it: the check of an :class:`Outcome` read back whose check module is not
    loaded (the llm layer without ``[llm]``); a live check (:meth:`of`) and its row (:meth:`from_row`) give the same."""

    claim_id: str
    layer: str
    name: str
    expected: Verdict
    slow: bool = False
    expected_items: tuple[tuple[str, bool], ...] = ()
    long: bool = False

    @classmethod
    def of(cls, check: Check | CheckRef) -> CheckRef:
        if isinstance(check, CheckRef):
            return check
        return cls(
            check.claim_id, check.layer, check.name, check.expected, check.slow, check.expected_items, check.long
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> CheckRef:
        """The reference a record's row names (``slow``: the row's, i.e. whether its run took slow checks)."""
        items = tuple((str(k), bool(v)) for k, v in (row.get("expected_items") or {}).items())
        return cls(row["claim"], row["layer"], row["check"], Verdict(row["expected"]), bool(row.get("slow")), items)


#: Provenance fields of a record's row (:mod:`tiltlab.claims.provenance`), :attr:`Outcome.provenance` when read back.
PROVENANCE_FIELDS = ("run_at", "run_id", "command", "mode", "slow", "commit", "commit_sha", "seed", "source")

#: The keys of a row :meth:`Outcome.to_row` derives from the outcome's check and result; the other keys of a row
#: read back (the claim's text and the reproducer as written, rule hashes, ...) are kept as they were (``extra``).
ROW_FIELDS = (
    "claim", "layer", "check", "expected", "verdict", "ok", "summary", "numbers", "figure", "items", "evidence",
    "expected_items", "seconds", "error",
)  # fmt: skip


@dataclass
class Outcome:
    """A check's outcome, in the one form the runner writes (:meth:`to_row`), a record merges and the report
    reads (:meth:`from_row`). ``check``: the registered :class:`Check`, or for a row read back whose check module
    is not loaded the :class:`CheckRef` it names (:attr:`loaded`); ``result`` None: it crashed (``error``). A row
    read back keeps its :data:`PROVENANCE_FIELDS` (``provenance``, empty for an outcome of this process), the
    ``ok`` it was recorded with (``ok_recorded``), whether it ran under an earlier rule (``legacy``, a
    ``[[legacy]]`` registration) or items re-specified since (``respecified``, the ``[[respecification]]``),
    and its other keys (``extra``)."""

    check: Check | CheckRef
    result: CheckResult | None
    seconds: float
    error: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    ok_recorded: bool | None = None
    legacy: bool = False
    respecified: Mapping[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def loaded(self) -> bool:
        """Whether the check is registered in this process (False: only the record's row names it)."""
        return isinstance(self.check, Check)

    @property
    def source(self) -> str:
        """``run`` (measured, by this process or an earlier run) or ``recorded`` (the shipped llm record's)."""
        return str(self.provenance.get("source") or "run")

    @property
    def ref(self) -> CheckRef:  # the check as a record names it
        return CheckRef.of(self.check)

    @property
    def verdict(self) -> str:
        return "error" if self.result is None else self.result.verdict.value

    @property
    def item_changes(self) -> dict[str, tuple[bool, bool | None]]:
        """Items whose outcome differs from the expected one: name -> (expected, got; None = missing)."""
        if self.result is None:
            return {}
        got = self.result.items
        return {k: (v, got.get(k)) for k, v in self.check.expected_items if got.get(k) is not v}

    @property
    def number_changes(self) -> dict[str, tuple[Pin, Number | None]]:
        """Pinned numbers (:func:`pins`) that did not hold (:meth:`Pin.holds`: moved beyond their
        tolerance, a residual above its bound) or were not reported: name -> (pin, got; None = missing)."""
        if self.result is None:
            return {}
        got = self.result.numbers
        return {k: (pin, got.get(k)) for k, pin in pins().get(self.check.key, {}).items() if not pin.holds(got.get(k))}

    @property
    def failure(self) -> str | None:
        """Why this outcome is not :attr:`ok`, in the words the terminal and both reports print; None when ok."""
        if self.result is None:
            last = (self.error or "").strip().splitlines()[-1:] or ["?"]
            return f"crashed: {last[0]}"
        if self.result.verdict != self.check.expected:
            return f"returned {self.verdict}, expected {self.check.expected.value} — {self.result.summary}"
        parts = []
        if self.item_changes:
            parts.append(
                "items changed: "
                + ", ".join(
                    f"{k} expected {exp} got {'missing' if got is None else got}"
                    for k, (exp, got) in self.item_changes.items()
                )
            )
        changes = self.number_changes
        if changes:
            parts.append(
                f"{len(changes)} pinned number(s) moved: "
                + ", ".join(f"{k} {pin.describe(got)}" for k, (pin, got) in changes.items())
            )
        return f"verdict {self.verdict} as expected, but " + "; ".join(parts) if parts else None

    @property
    def ok(self) -> bool:
        """True when the check ran, returned the verdict recorded as expected and, where it records
        expected per-item outcomes, every item came out as expected, and every pinned number
        (:func:`pins`) is within its tolerance: a regression moves the check even when the verdict
        does not. A row read back whose check is not loaded, a legacy row (run under an earlier rule,
        preregistration.toml ``[[legacy]]``) and a row judged under items re-specified since keep the
        judgement made when it ran (:attr:`ok_recorded`)."""
        earlier = self.legacy or self.respecified is not None
        if (not self.loaded or earlier) and self.ok_recorded is not None:
            return self.ok_recorded
        return (
            self.result is not None
            and self.result.verdict == self.check.expected
            and not self.item_changes
            and not self.number_changes
        )

    def to_row(self, seed: int | None = None) -> dict[str, Any]:
        """The outcome's row of a record (``claims.json``): what it derives (:data:`ROW_FIELDS`, the claim's text,
        the reproducer at ``seed``: default the provenance's, else 0), then ``extra`` and ``provenance``;
        ``Outcome.from_row(row).to_row() == row`` for a row it writes (``ok``: the judgement now, :attr:`ok`)."""
        seed = int(self.provenance.get("seed") or 0) if seed is None else seed
        return {**self._fields(seed, _CLAIMS.get(self.check.claim_id)), **self.extra, **self.provenance}

    def _fields(self, seed: int, claim: Claim | None) -> dict[str, Any]:
        ref = self.ref
        about = {"paper": claim.paper, "section": claim.section, "cite": cite(claim), "statement": claim.statement}
        return {
            "claim": ref.claim_id,
            **({} if claim is None else about),
            "layer": ref.layer,
            "check": ref.name,
            "expected": ref.expected.value,
            "verdict": self.verdict,
            "ok": self.ok,
            "summary": None if self.result is None else self.result.summary,
            "numbers": {} if self.result is None else self.result.numbers,
            "figure": None if self.result is None else self.result.figure,
            "items": {} if self.result is None else dict(self.result.items),
            "evidence": None if self.result is None else self.result.evidence,
            "expected_items": dict(ref.expected_items),
            "seconds": round(self.seconds, 4),
            "error": self.error,
            "reproducer": ref.reproducer(seed),
        }

    @classmethod
    def from_row(
        cls,
        row: Mapping[str, Any],
        check: Check | None = None,
        *,
        legacy: bool = False,
        respecified: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """The outcome of a record's row: judged by ``check`` (the registered check of the row's key, when it
        is loaded) or else by the :class:`CheckRef` the row names; ``legacy`` and ``respecified`` as the
        pre-registration says of the row (:func:`tiltlab.claims.rows.outcome_of_row` finds all three)."""
        verdict = row.get("verdict")
        result = None
        if verdict not in (None, "error"):
            result = CheckResult(
                Verdict(verdict),
                row.get("summary") or "",
                dict(row.get("numbers") or {}),
                row.get("figure"),
                dict(row.get("items") or {}),
                evidence=row.get("evidence"),
            )
        return cls(
            CheckRef.from_row(row) if check is None else check,
            result,
            float(row.get("seconds") or 0.0),
            row.get("error"),
            {k: row[k] for k in PROVENANCE_FIELDS if k in row},
            row.get("ok"),
            legacy,
            respecified,
            {k: v for k, v in row.items() if k not in ROW_FIELDS and k not in PROVENANCE_FIELDS},
        )


_PAPERS: dict[str, Paper] = {}
_CLAIMS: dict[str, Claim] = {}
_CHECKS: dict[str, Check] = {}
_LOADED: set[Path] = set()  # claim directories and paper files already read


def declare_paper(
    short: str,
    title: str,
    authors: str = "",
    source: str = "",
    about: str = "",
    cites: Iterable[Mapping[str, str] | tuple[str, str]] = (),
) -> Paper:
    """Declare a paper. Re-declaring the same short name with different content is an error."""
    if not short or not short.strip() or short != short.strip():
        raise ValueError(f"paper short name must be a non-empty name without surrounding spaces, got {short!r}")
    if not title:
        raise ValueError(f"paper {short!r} has no title")
    rows = []
    for c in cites:
        ref, what = (c["ref"], c["what"]) if isinstance(c, Mapping) else c
        rows.append((str(ref), str(what)))
    paper = Paper(short=short, title=title, authors=authors, source=source, about=about, cites=tuple(rows))
    old = _PAPERS.get(short)
    if old is not None and old != paper:
        raise ValueError(f"paper {short!r} declared twice with different content")
    _PAPERS[short] = paper
    return paper


def load_papers(path: Path | None = None) -> None:
    """Read ``[[paper]]`` tables from ``path`` (default the project's index, :func:`papers_file`)."""
    path = Path(papers_file() if path is None else path).resolve()
    if path in _LOADED:
        return
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    _declare_paper_rows(path, data.get("paper", []))
    _LOADED.add(path)


def _declare_paper_rows(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    for row in rows:
        try:
            declare_paper(**row)
        except (TypeError, KeyError) as exc:
            raise ValueError(f"{path.name}: bad paper row {row.get('short')!r}: {exc}") from None


def papers() -> dict[str, Paper]:
    """The paper index (short name -> :class:`Paper`), in the order of ``papers.toml``."""
    load_papers()
    return dict(_PAPERS)


def get_paper(short: str) -> Paper:
    known = papers()
    try:
        return known[short]
    except KeyError:
        raise KeyError(f"unknown paper {short!r}; known papers: {', '.join(known)}") from None


def cite(claim: Claim) -> str:
    """``"<paper> <section>"``, e.g. ``DISA §2.2 eq. (10)``: how reports cite a claim."""
    return f"{claim.paper} {claim.section}"


def declare_claim(id: str, paper: str, section: str, statement: str, **kw: Any) -> Claim:
    """Declare a claim of a known paper (see :func:`papers`). Re-declaring the same id with
    different content is an error."""
    known = papers()
    if paper not in known:
        raise ValueError(
            f"claim {id!r} names unknown paper {paper!r}; known papers: {', '.join(known)} "
            "(declare new ones as [[paper]] tables)"
        )
    claim = Claim(id=id, paper=paper, section=section, statement=statement, **kw)
    old = _CLAIMS.get(id)
    if old is not None and old != claim:
        raise ValueError(f"claim {id!r} declared twice with different content")
    _CLAIMS[id] = claim
    return claim


def register_check(
    claim_id: str,
    *,
    layer: str,
    expected: Verdict | str = Verdict.VERIFIED,
    name: str | None = None,
    slow: bool = False,
    expected_items: Mapping[str, bool] | None = None,
    pins: Mapping[str, PinSpec] | None = None,
    long: bool = False,
    rederive: Callable[..., Any] | None = None,
) -> Callable[[CheckFn], CheckFn]:
    """Decorator: attach ``fn(seed) -> CheckResult`` to ``claim_id``.

    ``expected`` is the verdict this check is known to return; ``tiltlab check``
    exits non-zero when it changes. ``expected_items`` (for a verdict that summarizes several
    statements) records the per-item outcomes (:attr:`CheckResult.items`) the check is known to
    return; a changed item fails the check too. ``pins`` declares what its evidence numbers are
    (:class:`PinSpec`; keys are number names or :mod:`fnmatch` patterns, the first match wins, the rest
    are ``exact``): :func:`residual` for an error or rounding gap, judged against the check's own
    tolerance as an upper bound; :func:`stochastic` for a number that moves across CPU kernel paths
    (a selection that amplifies last-bit differences), with its floor and the measured spread behind
    it, below the smallest effect the check judges. ``long``: a check of hours, outside its layer's
    run (:func:`select` takes it only with ``include_long``); a long check is slow too. ``rederive``: the
    re-derivation of the item values from the raw values the check keeps (:attr:`Check.rederive`). The claim must be
    declared (in ``paper_checks/claims/*.toml``) by the time :func:`validate` runs.
    """
    if layer not in {"theory", "sim", "llm", "data"}:
        raise ValueError(f"unknown layer {layer!r}")
    specs = tuple((str(k), v) for k, v in (pins or {}).items())
    bad = [k for k, v in specs if not isinstance(v, PinSpec)]
    if bad:
        raise ValueError(f"pins values must be PinSpec (residual(...), stochastic(...)): {bad}")

    def deco(fn: CheckFn) -> CheckFn:
        items = tuple((str(k), bool(v)) for k, v in (expected_items or {}).items())
        chk = Check(
            claim_id, layer, name or fn.__name__, Verdict(expected), fn, slow or long, items, specs, long, rederive
        )
        if chk.key in _CHECKS and _CHECKS[chk.key].fn is not fn:
            raise ValueError(f"check {chk.key} registered twice")
        _CHECKS[chk.key] = chk
        return fn

    return deco


def load_claims(directory: Path | None = None) -> None:
    """Read claim declarations from every ``*.toml`` file in ``directory``.

    A file may also declare ``[[paper]]`` tables (another project's sources); every file's
    papers are read before any claim, so a claim may name a paper declared in any file. Default: the
    project's claims (:func:`claims_dir`).
    """
    directory = Path(claims_dir() if directory is None else directory).resolve()
    if directory in _LOADED:
        return
    if not directory.is_dir():
        raise ValueError(f"claims directory {directory} does not exist")
    load_papers()
    files = []
    for path in sorted(directory.glob("*.toml")):
        with open(path, "rb") as fh:
            files.append((path, tomllib.load(fh)))
    for path, data in files:
        _declare_paper_rows(path, data.get("paper", []))
    for path, data in files:
        for row in data.get("claim", []):
            row = dict(row)
            if "item" in row:  # [[claim.item]] tables
                row["items"] = tuple(row.pop("item"))
            try:
                declare_claim(**row)
            except TypeError as exc:
                raise ValueError(f"{path.name}: bad claim row {row.get('id')!r}: {exc}") from None
            except ValueError as exc:
                raise ValueError(f"{path.name}: {exc}") from None
    _LOADED.add(directory)


_CATALOGUED: list[bool] = [False]


def mark_catalogued() -> None:
    """Called by the catalog once every check module it knows is imported (its checks registered)."""
    _CATALOGUED[0] = True


def require_catalogued(what: str) -> None:
    """Raise unless the catalog has registered every check: ``what`` needs all of them, and a partial
    registry would give a wrong answer without an error."""
    if not _CATALOGUED[0]:
        raise RuntimeError(f"{what} needs every registered check: call tiltlab.paper_checks.catalog.discover() first")


def claims() -> dict[str, Claim]:
    return dict(_CLAIMS)


def checks() -> list[Check]:
    return list(_CHECKS.values())


def get_claim(claim_id: str) -> Claim:
    try:
        return _CLAIMS[claim_id]
    except KeyError:
        raise KeyError(f"claim {claim_id!r} is not declared in paper_checks/claims/*.toml") from None


def validate() -> None:
    """Every check points at a declared claim."""
    missing = sorted({c.claim_id for c in _CHECKS.values() if c.claim_id not in _CLAIMS})
    if missing:
        raise ValueError(f"checks registered for undeclared claims: {missing}")


def select(
    prefix: str | None = None,
    layer: str | None = None,
    include_slow: bool = False,
    include_llm: bool | None = None,
    include_long: bool = False,
) -> list[Check]:
    """Checks matching ``prefix`` and ``layer``; slow ones only with ``include_slow``, long ones
    (:attr:`Check.long`) only with ``include_long`` (which implies ``include_slow``). Checks of an
    opt-in layer (:data:`OPT_IN_LAYERS`: ``llm``) are selected only when ``layer`` names it or
    ``include_llm`` is true (the default, ``None``, means "only when named")."""
    if include_llm is None:
        include_llm = layer in OPT_IN_LAYERS
    out = []
    for c in _CHECKS.values():
        if prefix and not (
            c.claim_id == prefix or c.claim_id.startswith(prefix.rstrip(".") + ".") or c.claim_id.startswith(prefix)
        ):
            continue
        if layer and c.layer != layer:
            continue
        if c.layer in OPT_IN_LAYERS and not include_llm:
            continue
        if c.long and not include_long:
            continue
        if c.slow and not (include_slow or include_long):
            continue
        out.append(c)
    return sorted(out, key=lambda c: (c.claim_id, c.layer, c.name))


def check_evidence(check: Check, res: CheckResult) -> None:
    """A statistical verdict's items are the ones its claim declares for the check's layer, with the
    declared kinds and margins, and its recorded verdict, item flags and item numbers are the ones its raw
    values re-derive (:func:`tiltlab.claims.rejudge.rejudge_row`, what ``--rejudge`` does later); a claim
    that declares items for the layer needs the evidence. Raises ``ValueError`` naming the difference."""
    declared = get_claim(check.claim_id).items_for(check.layer)
    ev = res.evidence
    if ev is None:
        if declared:
            raise ValueError(
                f"{check.key}: the claim declares items {sorted(declared)} but the check recorded no evidence"
            )
        return
    got = {r["name"]: (r["kind"], float(r["margin"])) for r in ev.get("items", [])}
    want = {n: (i.kind, i.margin) for n, i in declared.items()}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))
        raise ValueError(f"{check.key}: recorded items differ from the registry's [[claim.item]] declarations: {diff}")
    from tiltlab.claims import stats

    again = stats.rejudge(ev)
    if not (ev.get("verdict") == again.verdict == res.verdict.value):
        raise ValueError(
            f"{check.key}: verdict {res.verdict.value}, evidence verdict {ev.get('verdict')}, its values give "
            f"{again.verdict}: a verdict must be the one its recorded values re-derive"
        )
    from tiltlab.claims import rejudge

    row = {"claim": check.claim_id, "layer": check.layer, "check": check.name, "verdict": res.verdict.value}
    out = rejudge.rejudge_row({**row, "items": res.items, "numbers": res.numbers, "evidence": ev}, check.rederive)
    if out["differences"]:
        raise ValueError(
            f"{check.key}: its record would not re-derive (`tiltlab report --rejudge`): {out['differences'][0]}"
            + (f" (and {len(out['differences']) - 1} more)" if len(out["differences"]) > 1 else "")
        )


def run_one(check: Check, seed: int = 0) -> Outcome:
    t0 = time.perf_counter()
    try:
        res = check.fn(seed)
        if not isinstance(res, CheckResult):
            raise TypeError(f"check {check.key} returned {type(res).__name__}, not CheckResult")
        check_evidence(check, res)
        return Outcome(check, res, time.perf_counter() - t0)
    except Exception:  # a crashing check is reported, never hidden
        return Outcome(check, None, time.perf_counter() - t0, traceback.format_exc())
