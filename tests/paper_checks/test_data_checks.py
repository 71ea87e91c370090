"""The data layer: the papers' own numbers, checked for consistency."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tiltlab.claims.registry import CheckResult, Verdict, run_one
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks import data_checks as dc
from tiltlab.paper_checks.data_checks import disa as disa_dc
from tiltlab.paper_checks.data_checks import fpa as fpa_dc
from tiltlab.paper_checks.data_checks import llm_scale as llm_scale_dc


def test_halfwidth_reads_printed_precision():
    assert dc.halfwidth(12.3) == pytest.approx(0.05)
    assert dc.halfwidth(4.58) == pytest.approx(0.005)
    assert dc.halfwidth(30) == pytest.approx(0.5)
    assert dc.halfwidth(0.2306) == pytest.approx(0.00005)


def _pn(avg: float) -> dict:
    return {"columns": ["Avg", "A", "B"], "averages": {"Avg": ["A", "B"]}, "rows": {"m": [avg, 10.0, 20.1]}}


def test_average_check_accepts_rounding_and_flags_real_errors():
    n, worst, problems = dc.average_problems(_pn(15.1))  # mean 15.05 prints as 15.1: within rounding
    assert n == 1 and problems == [] and worst == pytest.approx(0.05)
    n, worst, problems = dc.average_problems(_pn(15.3))  # 0.25 off: more than any rounding allows
    assert len(problems) == 1 and "mean of cells=15.050" in problems[0]


def test_malformed_tables_raise():
    bad = {"columns": ["Avg", "A"], "averages": {"Avg": ["A"]}, "rows": {"m": [1.0, 2.0, 3.0]}}
    with pytest.raises(ValueError, match="3 cells"):
        dc.average_problems(bad)
    with pytest.raises(ValueError, match="not in"):
        dc.average_problems({"columns": ["Avg"], "averages": {"Avg": ["Z"]}, "rows": {}})


def test_config_problems_only_once_configs_exist(tmp_path: Path):
    cfg = tmp_path / "configs"
    cmd = "tiltlab llm train --config configs/a.yaml && tiltlab llm eval --config configs/b.yaml"
    assert dc.config_problems(cmd, cfg) == []  # no configs/ directory: nothing to compare with
    cfg.mkdir()
    assert dc.config_problems(cmd, cfg) == []  # an empty configs/: nothing to compare with either
    (cfg / "a.yaml").write_text("x: 1\n")
    assert dc.config_problems(cmd, cfg) == ["configs/b.yaml"]


def test_llm_scale_check_verdicts(isolated_registry, monkeypatch, tmp_path):
    reg = isolated_registry
    monkeypatch.setattr(llm_scale_dc, "CONFIG_DIR", tmp_path / "configs")  # configs/ not written: no config lookups
    ok = _pn(15.1) | {"table": "T"}
    reg.declare_claim(
        "zz_fake.ok",
        "DISA",
        "T",
        "s",
        kind="empirical",
        paper_numbers=ok,
        llm_command="tiltlab llm train --config configs/zz.yaml",
    )
    reg.declare_claim(
        "zz_fake.bad",
        "DISA",
        "T",
        "s",
        kind="empirical",
        paper_numbers=_pn(15.3),
        llm_command="tiltlab llm train --config configs/zz.yaml",
    )
    reg.declare_claim(
        "zz_fake.nonum",
        "DISA",
        "T",
        "s",
        kind="empirical",
        llm_command="tiltlab llm train --config configs/zz.yaml",
    )
    res = dc.llm_scale_check("zz_fake.ok")(0)
    assert res.verdict is Verdict.OUT_OF_REACH
    assert "tiltlab llm train --config configs/zz.yaml" in res.summary and res.numbers["rows|m|Avg"] == 15.1
    assert dc.llm_scale_check("zz_fake.bad")(0).verdict is Verdict.PARTLY
    with pytest.raises(ValueError, match="paper_numbers"):
        dc.llm_scale_check("zz_fake.nonum")(0)
    # once configs/ holds configs, a command naming a missing one is an error (loud), not a verdict
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "other.yaml").write_text("model: tiny\n")
    with pytest.raises(ValueError, match="configs/zz.yaml"):
        dc.llm_scale_check("zz_fake.ok")(0)


def test_every_data_check_returns_its_expected_verdict(isolated_registry):
    chks = isolated_registry.select(layer="data")
    assert len(chks) >= 60
    bad = []
    for c in chks:
        out = run_one(c, 0)
        assert isinstance(out.result, CheckResult), out.error
        if not out.ok:
            bad.append((c.key, out.verdict, c.expected.value, out.result.summary))
    assert not bad, bad


def test_every_llm_scale_claim_has_a_data_check(isolated_registry):
    have = {(c.claim_id, c.name) for c in isolated_registry.checks() if c.layer == "data"}
    need = {(cid, "llm_scale") for cid, c in isolated_registry.claims().items() if c.llm_command}
    assert need <= have


def test_paper_internal_checks_can_fail(isolated_registry, monkeypatch):
    """The paper-internal checks compute from the registered numbers: perturb one number and
    the verdict moves (the 13.8 gap of the DISA abstract no longer matches)."""
    from dataclasses import replace

    c = isolated_registry.get_claim("disa.abstract.sft_gap")
    isolated_registry._CLAIMS[c.id] = replace(c, paper_numbers=dict(c.paper_numbers, stated_gap=12.0))
    assert disa_dc.disa_sft_gap(0).verdict is Verdict.REFUTED


def test_command_problems_parses_and_validates(tmp_path: Path):
    n, bad = dc.command_problems(
        "tiltlab llm train --config configs/a.yaml --set x=1 && python train.py", tmp_path / "none"
    )
    assert n == 0 and len(bad) == 1 and "python train.py" in bad[0]
    n, bad = dc.command_problems("tiltlab llm eval --set x=1", tmp_path / "none")
    assert bad == ["no --config in 'tiltlab llm eval --set x=1'"]
    n, bad = dc.command_problems("tiltlab llm train --config configs/a.yaml --set paced.tau=0.3", tmp_path / "none")
    assert (n, bad) == (0, [])  # an empty configs/: only the command form is checked


def test_command_problems_uses_the_llm_config_schema(tmp_path: Path):
    # the schema and pyyaml are part of the base install: no skip (their absence is an error of the check)
    cfg = tmp_path / "configs"
    cfg.mkdir()
    (cfg / "a.yaml").write_text("model: tiny\nkind: online\nobjective: paced\n")
    ok = "tiltlab llm train --config configs/a.yaml --set paced.tau=0.3"
    assert dc.command_problems(ok, cfg) == (1, [])
    n, bad = dc.command_problems("tiltlab llm train --config configs/a.yaml --set no_such_key=1", cfg)
    assert n == 0 and "no_such_key" in bad[0]


def test_partly_paper_internal_checks_record_which_statements_hold():
    """A 'partly' over several statements is compared statement by statement: a check whose failing
    statement moves (same count, same verdict) fails."""
    from tiltlab.claims import registry
    from tiltlab.claims.registry import CheckResult, Outcome

    catalog.discover()
    partly = [c for c in registry.checks() if c.name == "paper_internal" and c.expected.value == "partly"]
    assert partly and all(c.expected_items for c in partly)
    chk = partly[0]
    res = registry.run_one(chk).result
    assert registry.Outcome(chk, res, 0.0).ok
    moved = dict(zip(res.items, [not v for v in res.items.values()]))
    assert not Outcome(chk, CheckResult(res.verdict, res.summary, items=moved), 0.0).ok


def test_the_config_schema_needs_no_extra_and_its_absence_is_an_error_not_a_zero(monkeypatch):
    """The llm_scale checks validate the papers' run configs in the base install (the schema reads YAML with
    pyyaml, a base dependency, and imports nothing of the [llm] extra); a schema that cannot be imported
    crashes the check, where it used to count 0 configs silently."""
    import subprocess
    import sys

    probe = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'transformers', 'trl', 'accelerate', 'datasets', 'peft', 'vllm'}:\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tiltlab.paper_checks import data_checks as dc\n"
        "n, bad = dc.command_problems('tiltlab llm train --config configs/disa_qwen2.5_7b.yaml')\n"
        "print(n, bad)\n"
    )
    cfgs = sorted(p.name for p in dc.CONFIG_DIR.glob("*.yaml"))
    assert "disa_qwen2.5_7b.yaml" in cfgs, cfgs[:5]
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "1 []", p.stdout + p.stderr[-2000:]
    llm_scale_dc._schema_error.cache_clear()
    import tiltlab.llm.train

    monkeypatch.setitem(sys.modules, "tiltlab.llm.train.config", None)  # its import raises ImportError
    monkeypatch.delattr(tiltlab.llm.train, "config", raising=False)
    try:
        with pytest.raises(RuntimeError, match="run-config schema .* cannot be imported"):
            dc.command_problems("tiltlab llm train --config configs/disa_qwen2.5_7b.yaml")
    finally:
        llm_scale_dc._schema_error.cache_clear()


# ---- the paper-internal offline-RL claims: FlowRL's offline split and FPA's competitiveness table
def test_offline_split_recovers_flowrl_numbers():
    r = disa_dc.disa_offline_split_recovers(0)
    assert r.verdict is Verdict.VERIFIED
    # (33.5 - 23.4) / (33.2 - 23.4) and (65.5 - 29.7) / (64.8 - 29.7), naive
    assert r.numbers["qwen2.5_7b.share"] == pytest.approx(round(10.1 / 9.8, 4))
    assert r.numbers["qwen3_4b.share"] == pytest.approx(round(35.8 / 35.1, 4))
    # largest share the rounding allows: (33.55 - 23.35) / (33.15 - 23.45)
    assert r.numbers["qwen2.5_7b.share_hi"] == pytest.approx(round(10.2 / 9.7, 4))


def test_offline_split_noop_and_nan(monkeypatch):
    real = disa_dc._cell
    # nothing trained: DISA at the Vanilla row -> recovers nothing
    monkeypatch.setattr(
        disa_dc, "_cell", lambda cid, row, col, key="rows": real(cid, "Vanilla" if row == "DISA" else row, col, key)
    )
    assert disa_dc.disa_offline_split_recovers(0).verdict is Verdict.REFUTED
    # FlowRL at the Vanilla row too: no gain to recover is an error, not a verdict
    monkeypatch.setattr(disa_dc, "_cell", lambda cid, row, col, key="rows": real(cid, "Vanilla", col, key))
    with pytest.raises(ValueError, match="not positive"):
        disa_dc.disa_offline_split_recovers(0)
    monkeypatch.setattr(
        disa_dc, "_cell", lambda cid, row, col, key="rows": math.nan if row == "DISA" else real(cid, row, col, key)
    )
    with pytest.raises(ValueError, match="non-finite"):
        disa_dc.disa_offline_split_recovers(0)


def test_offrl_competitive_numbers():
    r = fpa_dc.fpa_offrl_competitive(0)
    assert r.verdict is Verdict.PARTLY and r.items == {"s1": False, "s2": True, "s3": True}
    assert r.numbers["qwen3_4b.offrl_minus_best"] == pytest.approx(46.3 - 47.9)
    # 1.96 * hypot(0.2, 0.2) + 0.05 + 0.05 (two one-decimal cells)
    assert r.numbers["qwen3_4b.allowed"] == pytest.approx(round(1.96 * math.hypot(0.2, 0.2) + 0.1, 3))
    assert "DPO 47.9" in r.summary


def test_offrl_competitive_noop_and_nan(monkeypatch):
    real = fpa_dc._table

    def flat(cid, key="rows"):  # every method at the Base row: no method differs from another
        cols, rows = real(cid, key)
        return cols, {k: list(rows["Base"]) for k in rows}

    monkeypatch.setattr(fpa_dc, "_table", flat)
    assert fpa_dc.fpa_offrl_competitive(0).verdict is Verdict.VERIFIED

    def nan_kto(cid, key="rows"):
        cols, rows = real(cid, key)
        rows = {k: list(v) for k, v in rows.items()}
        rows["KTO"][cols.index("Avg")] = math.nan
        return cols, rows

    monkeypatch.setattr(fpa_dc, "_table", nan_kto)
    with pytest.raises(ValueError, match="non-finite"):
        fpa_dc.fpa_offrl_competitive(0)


def test_offline_split_needs_a_gain_beyond_rounding(monkeypatch):
    real = disa_dc._cell

    def with_flowrl_gain(gain):
        def cell(cid, row, col, key="rows"):
            v = real(cid, "Vanilla", col, key)
            return round(v + gain, 2) if row in ("FlowRL", "DISA") else real(cid, row, col, key)

        return cell

    # a FlowRL gain of 0.05 (printed with two decimals: half-width 0.005) is inside the rounding of the two
    # cells (0.005 + 0.05): an error, not a verdict
    monkeypatch.setattr(disa_dc, "_cell", with_flowrl_gain(0.05))
    with pytest.raises(ValueError, match="not positive"):
        disa_dc.disa_offline_split_recovers(0)
    # 0.6 is beyond it: DISA at the same gain recovers all of it
    monkeypatch.setattr(disa_dc, "_cell", with_flowrl_gain(0.6))
    r = disa_dc.disa_offline_split_recovers(0)
    assert r.verdict is Verdict.VERIFIED and r.numbers["qwen3_4b.share"] == pytest.approx(1.0)
