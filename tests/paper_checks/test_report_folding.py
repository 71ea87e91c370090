"""A report a reviewer reads in ten minutes: each decision rule stated once and linked, the claims of one table
per backbone grouped, full claim ids in the sidebar, backtick spans rendered as code (escaped)."""

from __future__ import annotations

import re

import pytest

from tiltlab.claims import llm_record, registry
from tiltlab.claims import rows as record_rows
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks.report import ReportInput, render_html, render_markdown
from tiltlab.paper_checks.report import folding as F


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """Every declared claim with the shipped llm record's outcomes, rendered in both formats."""
    catalog.discover()
    outs = record_rows.outcomes_from_rows(llm_record.recorded_llm_rows()[0])
    inp = ReportInput(claims=registry.claims(), outcomes=outs, out_dir=tmp_path_factory.mktemp("rep"))
    return inp, render_markdown(inp), render_html(inp)


def _body(page: str) -> str:
    return page.split('id="rules"', 1)[1]


def test_each_statement_rule_is_still_in_the_registry():
    """The folded words are the registry's: a reworded claim file fails here instead of silently unfolding."""
    catalog.discover()
    statements = [c.statement for c in registry.claims().values()]
    for rule in F.STATEMENT_RULES:
        assert sum(rule.text in s for s in statements) >= 2, rule.key
    assert [r.key for r in F.summary_rules()] == ["summary-per-seed", "summary-per-prompt", "summary-per-training-run"]


def test_each_decision_rule_is_stated_once_and_every_llm_claim_links_to_it(shipped):
    inp, md, page = shipped
    rules = F.all_rules()
    used = F.rules_in([c.statement for c in inp.claims.values()] + [o.result.summary for o in inp.outcomes], rules)
    assert {r.key for r in used} >= {"paired", "judge", "trained", "summary-per-seed"}
    for rule in used:
        assert md.count(F.md_inline(rule.body)) == 1, rule.key  # in the Decision rules section only
        assert page.count(F.html_inline(rule.body)) == 1, rule.key
        assert f'<a id="{rule.anchor}"></a>' in md and f'<li id="{rule.anchor}">' in page
    for cid, c in inp.claims.items():
        for rule in F.rules_in([c.statement], rules):
            assert f"[{rule.name}](#{rule.anchor})" in md, (cid, rule.key)
    llm_rows = [o for o in inp.outcomes if o.check.layer == "llm" and o.result is not None]
    linked = [o for o in llm_rows if F.rules_in([o.result.summary], rules)]
    assert len(linked) >= 20  # most llm summaries end in the rule: each links instead
    assert md.index("## Decision rules") < md.index("## DISA")
    assert "[Decision rules](#rules)" in md and '<a href="#rules">Decision rules</a>' in page


def test_folding_only_changes_the_rendering():
    """The no-op: without rules the text comes back whole; with them the words are gone and a link stands in."""
    text = "before; " + F._JUDGE + F._TRAINED + ": after"
    assert F.md_inline(text) == F.md_plain(text)
    folded = F.md_inline(text, F.STATEMENT_RULES)
    assert (
        folded
        == "before; [rule J (symmetric t-test, Holm)](#rule-judge); [rule T (it trained; fixed in advance)](#rule-trained): after"
    )
    assert "".join(s if isinstance(s, str) else s.text for s in F.segments(text, F.STATEMENT_RULES)) == text
    assert F.segments("", F.STATEMENT_RULES) == [] and F.segments("no rule here", F.STATEMENT_RULES) == ["no rule here"]


def test_backtick_spans_become_code_and_stay_escaped():
    assert F.html_inline("run `tiltlab check --slow` now") == "run <code>tiltlab check --slow</code> now"
    evil = "x `<script>alert(1)</script>` <b>y</b> & `a|b`"
    out = F.html_inline(evil)
    assert "<script" not in out and "<b>" not in out
    assert out == "x <code>&lt;script&gt;alert(1)&lt;/script&gt;</code> &lt;b&gt;y&lt;/b&gt; &amp; <code>a|b</code>"
    assert F.html_inline("one ` alone") == "one ` alone"  # an unpaired backtick is text
    md = F.md_inline("run `tiltlab check` | *not* <b>")
    assert md == "run `tiltlab check` \\| \\*not\\* &lt;b>"


def test_the_html_report_shows_no_literal_backticks(shipped):
    _, _, page = shipped
    text = re.sub(r"<code>.*?</code>", "", page, flags=re.S)
    assert not re.findall(r"`[^`<>\n]{1,120}`", text)
    assert "<code>tiltlab check --layer llm --slow</code>" in page  # the provenance notes' command


def test_claims_per_backbone_are_one_group(shipped):
    inp, md, page = shipped
    title = "disa.table1.math_{qwen2.5_7b, qwen3_4b}"
    assert md.count(f"### `{title}`") == 1 and page.count(f"<code>{title}</code>") == 1
    for cid in ("disa.table1.math_qwen2.5_7b", "disa.table1.math_qwen3_4b"):
        assert f'<a id="claim-{cid}"></a>' in md and f'id="claim-{cid}"' in page
        assert f"### `{cid}`" not in md  # no section of its own
    # the one run that decides both is shown once in the claims' sections
    (o,) = [o for o in inp.outcomes if o.check.claim_id == "disa.table1.math_qwen2.5_7b" and o.check.layer == "llm"]
    summary_md = F.md_inline(o.result.summary, F.all_rules())
    assert _body(md).count(summary_md) == 1
    assert "every backbone: one run, shown once" in md
    # the backbones' table names each verdict
    assert "| [`disa.table1.math_qwen3_4b`](#claim-disa.table1.math_qwen3_4b) | Qwen3-4B-Base |" in md
    assert "### `fpa.table6.lambda_{llama3.2_3b, qwen2.5_math_7b, qwen3_4b}`" in md


def test_claim_groups_need_a_backbone_and_a_twin():
    def row(cid, paper="P"):
        return {"id": cid, "paper": paper}

    rows = [
        row("a.t1_qwen3_4b"),
        row("a.t1_qwen2.5_7b"),
        row("a.t2_qwen3_4b"),
        row("a.plain"),
        row("b.t1_qwen3_4b", "Q"),
    ]
    rows.append(row("a.t1_llama3.2_3b", "Q"))  # the same stem in another paper: not grouped with P's
    groups = F.claim_groups(rows)
    assert [[r["id"] for r in g] for g in groups] == [
        ["a.t1_qwen3_4b", "a.t1_qwen2.5_7b"],
        ["a.t2_qwen3_4b"],
        ["a.plain"],
        ["b.t1_qwen3_4b"],
        ["a.t1_llama3.2_3b"],
    ]
    assert F.backbone_suffix("fpa.table1.math_qwen2.5_math_7b") == ("fpa.table1.math", "qwen2.5_math_7b")
    assert F.backbone_suffix("disa.prop1.unbiased") is None


def test_shared_statement():
    names = ["Qwen2.5-7B", "Qwen3-4B-Base"]
    same = F.shared_statement(["Gains on Qwen2.5-7B are big.", "Gains on Qwen3-4B-Base are big."], names)
    assert same == ("Gains on ⟨backbone⟩ are big.", ["", ""])
    part = F.shared_statement(
        ["On Qwen2.5-7B: FPA (lambda=1) is best of six.", "On Qwen3-4B-Base: FPA (lambda=2) is best of six."], names
    )
    assert part == ("On ⟨backbone⟩: FPA ⟨…⟩ is best of six.", ["(lambda=1)", "(lambda=2)"])
    assert F.shared_statement(["one two three four", "five six seven eight"], ["", ""]) is None


def test_sidebar_shows_full_ids(shipped):
    inp, _, page = shipped
    nav = page[page.index('<nav id="toc">') : page.index("</nav>")]
    shown = re.findall(
        r'<li title="([^"]+)"><span class="dot[^>]*></span><a href="#claim-([^"]+)">([^<]+)</a></li>', nav
    )
    assert len(shown) == len(inp.claims)
    assert all(t == h == x for t, h, x in shown) and {x for _, _, x in shown} == set(inp.claims)
    css = page[page.index("<style>") : page.index("</style>")]
    assert "ellipsis" not in css and "nowrap;overflow:hidden" not in css


def test_a_rule_at_the_start_of_the_text_is_found():
    judge = F.STATEMENT_RULES[1]
    assert F.segments(F._JUDGE + ": after", F.STATEMENT_RULES) == [judge, ": after"]
    assert F.md_inline(F._JUDGE, F.STATEMENT_RULES) == "[rule J (symmetric t-test, Holm)](#rule-judge)"


def test_rules_tied_in_place_and_length_the_first_listed_stands_in():
    a, b = F.Rule("a", "rule A", "the same words"), F.Rule("b", "rule B", "the same words")
    longer = F.Rule("c", "rule C", "the same words again")
    assert F.segments("x the same words y", [a, b]) == ["x ", a, " y"]
    assert F.segments("x the same words y", [b, a]) == ["x ", b, " y"]
    assert F.segments("the same words again", [a, longer]) == [longer]


def test_group_title_folds_two_or_more_backbones_only():
    def row(cid):
        return {"id": cid, "paper": "P"}

    two = [row("a.t1_qwen3_4b"), row("a.t1_qwen2.5_7b")]
    assert F.group_title(two) == "a.t1_{qwen3_4b, qwen2.5_7b}"
    three = [*two, row("a.t1_llama3.2_3b")]
    assert F.group_title(three) == "a.t1_{qwen3_4b, qwen2.5_7b, llama3.2_3b}"
    assert F.group_title([row("a.t1_qwen3_4b")]) == "a.t1_qwen3_4b"
    assert F.group_title([row("a.t1_qwen3_4b"), row("a.plain")]) == "a.t1_qwen3_4b, a.plain"


def test_backbone_names_come_from_the_claims_paper_numbers():
    from types import SimpleNamespace

    def claim(bb=None):
        return SimpleNamespace(paper_numbers={"backbone": bb} if bb else {})

    claims = {
        "b.t2_qwen3_4b": claim("Qwen3-4B (second)"),
        "a.t1_qwen3_4b": claim("Qwen3-4B-Base"),
        "a.t1_qwen2.5_7b": claim("Qwen2.5-7B"),
        "a.t1_llama3.2_3b": claim(),  # no backbone number: no name
        "a.plain": claim("not a backbone claim"),
    }
    # one name per suffix, the first claim's in id order
    assert F.backbone_names(claims) == {"qwen3_4b": "Qwen3-4B-Base", "qwen2.5_7b": "Qwen2.5-7B"}


def _filled(text: str, part: str) -> str:
    return " ".join(text.replace("⟨…⟩", part).split())


def test_shared_statement_of_statements_of_different_lengths_reads_back_each():
    """Each statement is the shared text with its own part in place of ``⟨…⟩``, also when the statements differ
    in length and a shared word recurs at the end of the longer one."""
    cases = [
        ["FPA wins by a wide margin", "FPA and GRPO tie by a wide margin"],
        ["FPA beats GRPO", "FPA beats GRPO and the other baselines beat GRPO"],
        ["On Qwen3: FPA (lambda=1) is best of six.", "On Qwen3: FPA (lambda=2, tuned) is best of six."],
    ]
    for statements in cases:
        text, parts = F.shared_statement(statements, ["", ""])
        assert [_filled(text, p) for p in parts] == statements, (text, parts)
    assert F.shared_statement(cases[0], ["", ""]) == ("FPA ⟨…⟩ by a wide margin", ["wins", "and GRPO tie"])
    assert F.shared_statement(cases[1], ["", ""]) == ("FPA beats GRPO ⟨…⟩", ["", "and the other baselines beat GRPO"])


def test_shared_statement_folds_at_exactly_half_shared():
    """``None`` only when less than half of the shortest statement is shared: exactly half still folds."""
    assert F.shared_statement(["Gains are big here", "Gains are small there"], ["", ""]) == (
        "Gains are ⟨…⟩",
        ["big here", "small there"],
    )
    assert F.shared_statement(["Gains are big here now", "Gains were small there then"], ["", ""]) is None
