"""What a report states once and links to: the decision rules that claim statements and llm check summaries
repeat word for word, and the claims that differ only in their backbone (``disa.table1.math_qwen2.5_7b`` /
``_qwen3_4b``), rendered as one group. Inline text of both formats (:func:`md_inline`, :func:`html_inline`):
a backtick span becomes code, a decision rule a link to its entry in the report's "Decision rules" section.

Only the rendering changes: the record (``claims.json``, the shipped llm record) keeps every statement and
summary in full, and ``tiltlab report --rejudge`` reads the record, not the report.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    """A decision rule stated once in the report: ``#rule-<key>`` holds ``text`` verbatim; the claims and checks
    whose text holds it link there with ``name``."""

    key: str
    name: str
    text: str
    what: str = ""

    @property
    def anchor(self) -> str:
        return f"rule-{self.key}"

    @property
    def body(self) -> str:
        """The text without the separators (``; ``) it starts or ends with."""
        return self.text.strip("; ")

    def around(self) -> tuple[str, str]:
        """The separators ``text`` starts and ends with: kept outside the link, so the sentence still reads."""
        t = self.text
        return t[: len(t) - len(t.lstrip("; "))], t[len(t.rstrip("; ")) :]


# The words the llm claims' statements (paper_checks/claims/*.toml) repeat; a test checks that each still occurs
# in the registered statements, so a reworded registry fails it instead of silently showing the full text again.
_PAIRED = (
    "per-seed paired differences (every arm trained from the same warm-up model with the same seed), each item "
    "oriented so the paper's statement predicts > 0, with the kind and margin its [[claim.item]] row declares; "
)
_JUDGE = (
    "the one symmetric rule (tiltlab.claims.stats.judge): a direction item (threshold 0) or an effect item "
    "(threshold +-margin) supports if a one-sided t-test rejects mean <= +threshold and goes against if the mirror "
    "test rejects mean >= -threshold, an equivalence item supports inside +-margin, a context item is reported and "
    "never judged; one Holm family at 0.05 two-sided (0.025 per side); verified if every judged item supports, "
    "partly if some, refuted if none supports and one goes against, else inconclusive"
)
_TRAINED = (
    "; inconclusive whatever the items if a run did not train (losses, weights and accuracy must move). Seed "
    "count, items, kinds and margins fixed before the run; the report shows the verdict at the first 3 and 5 seeds "
    "and under the other threshold choice too"
)

#: The rules of the claim statements, in the order the section lists them.
STATEMENT_RULES = (
    Rule("paired", "rule P (paired seeds)", _PAIRED, "how an llm claim's items are formed"),
    Rule("judge", "rule J (symmetric t-test, Holm)", _JUDGE, "how an item and a check are judged"),
    Rule("trained", "rule T (it trained; fixed in advance)", _TRAINED, "what a run must show, and what was fixed"),
)

#: The units of the llm checks' summary form of the rule (``tiltlab.llm.checks.rules.rule_text``).
_SUMMARY_UNITS = ("per-seed", "per-prompt", "per-training-run")


def summary_rules() -> tuple[Rule, ...]:
    """The llm checks' one-line form of rule J, per paired unit, in the words of its one home
    (:func:`tiltlab.llm.checks.rules.rule_text`); none when the llm layer cannot be imported (no ``[llm]``
    extra: its summaries are then shown in full)."""
    try:
        from tiltlab.llm.checks.rules import rule_text
    except ImportError:
        return ()
    return tuple(
        Rule(
            f"summary-{unit}",
            f"rule J, {unit} (summary form)",
            rule_text(unit),
            f"rule J as an llm check's summary states it, {unit} units",
        )
        for unit in _SUMMARY_UNITS
    )


def all_rules() -> tuple[Rule, ...]:
    return (*STATEMENT_RULES, *summary_rules())


def segments(text: str, rules: Sequence[Rule]) -> list[str | Rule]:
    """``text`` cut into plain pieces and the rules it holds verbatim (leftmost first, the longest at a tie)."""
    out: list[str | Rule] = []
    pos = 0
    while True:
        hits = [(i, -len(r.text), r) for r in rules if r.text and (i := text.find(r.text, pos)) >= 0]
        if not hits:
            break
        i, _, r = min(hits, key=lambda h: (h[0], h[1]))
        if i > pos:
            out.append(text[pos:i])
        out.append(r)
        pos = i + len(r.text)
    if pos < len(text):
        out.append(text[pos:])
    return out


def rules_in(texts: Iterable[str], rules: Sequence[Rule]) -> list[Rule]:
    """The rules that occur in any of ``texts``, in ``rules``' order."""
    found = {s for t in texts for s in segments(t, rules) if isinstance(s, Rule)}
    return [r for r in rules if r in found]


_CODE = re.compile(r"`([^`\n]+)`")


def md_plain(s: str) -> str:
    """Plain text inside Markdown: no table breaks, no accidental emphasis or raw HTML (backticks too)."""
    # (underscores are left alone: GitHub Markdown does not emphasize inside words)
    for a, b in (("|", "\\|"), ("*", "\\*"), ("`", "\\`"), ("<", "&lt;"), ("\n", " ")):
        s = s.replace(a, b)
    return s


def md_inline(text: str, rules: Sequence[Rule] = ()) -> str:
    """Markdown of a text: backtick spans kept as code spans (their content is literal in Markdown), the rest
    escaped (:func:`md_plain`), each rule in ``rules`` a link to its entry."""
    out = []
    for seg in segments(text, rules):
        if isinstance(seg, Rule):
            lead, trail = seg.around()
            out.append(f"{lead}[{seg.name}](#{seg.anchor}){trail}")
            continue
        pos = 0
        for m in _CODE.finditer(seg):
            out.append(md_plain(seg[pos : m.start()]))
            out.append(f"`{m.group(1)}`")
            pos = m.end()
        out.append(md_plain(seg[pos:]))
    return "".join(out)


def html_inline(text: str, rules: Sequence[Rule] = ()) -> str:
    """HTML of a text: every piece escaped, a backtick span as ``<code>`` (its escaped content), each rule in
    ``rules`` a link to its entry."""
    e = html.escape
    out = []
    for seg in segments(text, rules):
        if isinstance(seg, Rule):
            lead, trail = seg.around()
            out.append(f'{e(lead)}<a class="rule" href="#{e(seg.anchor)}">{e(seg.name)}</a>{e(trail)}')
            continue
        pos = 0
        for m in _CODE.finditer(seg):
            out.append(e(seg[pos : m.start()]))
            out.append(f"<code>{e(m.group(1))}</code>")
            pos = m.end()
        out.append(e(seg[pos:]))
    return "".join(out)


# --------------------------------------------------------------------------- claims per backbone

#: ``<stem>_<backbone>``: a claim of one paper's table, one per backbone model.
_BACKBONE_ID = re.compile(r"^(?P<stem>.+?)_(?P<bb>(?:qwen|llama|mistral|gemma|deepseek|phi|olmo)[0-9a-z._]*)$")


def backbone_suffix(claim_id: str) -> tuple[str, str] | None:
    """``(stem, backbone suffix)`` of a per-backbone claim id, ``None`` for any other id."""
    m = _BACKBONE_ID.match(claim_id)
    return (m["stem"], m["bb"]) if m else None


def claim_groups(rows: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The rows in report order, as groups: the claims of one paper that differ only in their backbone suffix
    (two or more) form one group, at the place of its first member; every other row is a group of one."""
    by_stem: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        sb = backbone_suffix(r["id"])
        if sb is not None:
            by_stem.setdefault((r["paper"], sb[0]), []).append(r)
    out: list[list[Mapping[str, Any]]] = []
    done: set[str] = set()
    for r in rows:
        if r["id"] in done:
            continue
        sb = backbone_suffix(r["id"])
        group = by_stem.get((r["paper"], sb[0]), [r]) if sb is not None else [r]
        if len(group) < 2:
            group = [r]
        done.update(x["id"] for x in group)
        out.append(list(group))
    return out


def group_title(group: Sequence[Mapping[str, Any]]) -> str:
    """``disa.table1.math_{qwen2.5_7b, qwen3_4b}``."""
    sbs = [backbone_suffix(r["id"]) for r in group]
    if len(group) < 2 or any(s is None for s in sbs):
        return ", ".join(r["id"] for r in group)
    return f"{sbs[0][0]}_{{{', '.join(s[1] for s in sbs)}}}"  # type: ignore[index]


def backbone_names(claims: Mapping[str, Any]) -> dict[str, str]:
    """Backbone suffix -> the model's name (``qwen3_4b`` -> ``Qwen3-4B-Base``), from the claims' paper numbers."""
    out: dict[str, str] = {}
    for cid, c in sorted(claims.items()):
        sb = backbone_suffix(cid)
        bb = (getattr(c, "paper_numbers", None) or {}).get("backbone")
        if sb is not None and bb and sb[1] not in out:
            out[sb[1]] = str(bb)
    return out


def shared_statement(statements: Sequence[str], names: Sequence[str]) -> tuple[str, list[str]] | None:
    """The text a group's statements share, with ``⟨…⟩`` where they differ, and each member's differing part:
    the backbone names (``names``, one per statement) are first read as ``⟨backbone⟩``. ``None`` when the
    statements share less than half of the shortest one (each is then shown whole)."""
    norm = [s.replace(n, "⟨backbone⟩") if n else s for s, n in zip(statements, names)]
    if len(set(norm)) == 1:
        return norm[0], ["" for _ in norm]
    words = [s.split(" ") for s in norm]
    k = 0
    while all(len(w) > k for w in words) and len({w[k] for w in words}) == 1:
        k += 1
    j = 0
    while all(len(w) - k > j for w in words) and len({w[len(w) - 1 - j] for w in words}) == 1:
        j += 1
    shared = k + j
    if shared * 2 < min(len(w) for w in words):
        return None
    head, tail = " ".join(words[0][:k]), " ".join(words[0][len(words[0]) - j :]) if j else ""
    text = " ".join(p for p in (head, "⟨…⟩", tail) if p)
    return text, [" ".join(w[k : len(w) - j]) for w in words]
