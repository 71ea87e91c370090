"""benchmarks/gpu (issue 38): the CPU dry run of the GPU kit and its record, a deliberately corrupted run
that must fail, the wheel manifest check, and benchmarks/README.md's GPU section generated from the
committed record. No network, no wall-clock assertions."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiltlab.paper_checks import gpu_record

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "benchmarks" / "gpu"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_kit_{name}", KIT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


run = _load("run")
prepare = _load("prepare")
report = _load("report")


def _kit(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    cmd = [sys.executable, str(KIT / "run.py"), "--device", "cpu", "--tiny", "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)


def _finite(*xs) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    out = tmp_path_factory.mktemp("gpu-kit")
    res = _kit(out)
    rec_path = out / run.RECORD_NAME
    assert rec_path.is_file(), res.stderr[-4000:]
    return res, json.loads(rec_path.read_text())


def test_dry_run_writes_a_complete_passing_record(dry_run):
    res, rec = dry_run
    assert res.returncode == 0, rec.get("failures") or res.stderr[-4000:]
    assert rec["ok"] is True and rec["complete"] is True and rec["failures"] == []
    assert rec["schema"] == run.SCHEMA and rec["status"] == "ran" and rec["mode"] == "cpu-tiny"
    assert rec["perturbed"] is None and rec["sections"] == ["pytest", "fused", "grpo"]
    assert {"torch", "transformers", "trl", "liger-kernel", "datasets", "tiltlab"} <= set(rec["versions"])
    assert rec["device"]["device"] == "cpu" and rec["device"]["cpu_count"] >= 1
    if (ROOT / ".git").exists() and shutil.which("git"):
        assert rec["git"]["source"] == "git" and re.fullmatch(r"[0-9a-f]{40}", rec["git"]["commit"])
    assert rec["commands"]["device"] == run.DEVICE_COMMAND and rec["commands"]["carry"] == [".whl"]


def test_dry_run_pytest_section_ran_the_gpu_tests(dry_run):
    _, rec = dry_run
    pt = rec["pytest"]
    files = {p.relative_to(ROOT).as_posix() for p in run.gpu_test_files()}
    assert {
        "tests/objectives/test_fused.py",
        "tests/llm/disa/test_stage1.py",
        "tests/llm/base/test_rollout.py",
    } <= files
    assert pt["ok"] and pt["returncode"] == 0 and pt["failed"] == 0 and pt["error"] == 0
    assert len(pt["tests"]) >= 4 and pt["skipped"] == len(pt["tests"])  # no CUDA here: each skips, none fails
    assert all("needs CUDA" in t["message"] for t in pt["tests"])


def test_dry_run_fused_section_compares_every_variant(dry_run):
    _, rec = dry_run
    fu = rec["fused"]
    assert fu["ok"] and fu["failures"] == []
    ns = run.FUSED_SIZES["tiny"]["ns"]
    assert len(fu["results"]) == len(run.FUSED_DTYPES) * len(ns) * len(run.FUSED_VARIANTS)
    for r in fu["results"]:
        if r["variant"] == "liger":  # Triton GPU kernels: recorded, never run on a CPU
            assert r["status"] == "unavailable"
            continue
        assert r["status"] == "ok", r
        assert _finite(r["tokens_per_s"], r["time_s"], r["peak_bytes"], *r["checksum"].values())
        assert r["tokens_per_s"] > 0 and r["peak_bytes"] >= 0
    # per (dtype, N): chunked and trl against naive, within the stated tolerance, on finite values
    got = {(c["dtype"], c["n"], c["variant"]) for c in fu["comparisons"]}
    assert got == {(d, n, v) for d in run.FUSED_DTYPES for n in ns for v in ("chunked", "trl")}
    for c in fu["comparisons"]:
        assert c["reference"] == "naive" and c["ok"] and c["finite"]
        assert c["tolerance"] == run.FUSED_TOL[c["dtype"]]
        assert 0 <= c["logp_max_abs_diff"] <= c["tolerance"]["logp_max_abs"]
        assert 0 <= c["checksum_max_rel_diff"] <= c["tolerance"]["checksum_rel"]
        assert c["checksum_max_rel_diff"] == max(c["checksum_rel_diff"].values())
        if c["dtype"] == "float32":  # float32 on one CPU: the same numbers to rounding, far inside the tolerance
            assert c["logp_max_abs_diff"] < 1e-4
    assert fu["goal"]["met"] is None and fu["goal"]["per_n"] == {}  # no Liger here: the goal is not judged


def test_dry_run_grpo_section_times_steps_and_compares_the_fixed_batch(dry_run):
    _, rec = dry_run
    gr = rec["grpo"]
    assert gr["ok"] and gr["failures"] == []
    assert list(gr["runs"]) == list(run.GRPO_RUNS)
    steps = run.GRPO_SIZES["tiny"]["max_steps"]
    for name, r in gr["runs"].items():
        assert len(r["steps"]) == steps and len(r["logged_losses"]) == steps and _finite(*r["logged_losses"])
        for s in r["steps"]:  # the wrappers saw the real generation, loss and backward calls
            assert s["generation_s"] > 0 and s["loss_s"] > 0 and s["backward_s"] > 0
            assert s["step_s"] >= s["generation_s"] + s["loss_s"] + s["backward_s"] - 1e-6
        fb = r["fixed_batch"]
        assert fb["ok"] and _finite(fb["loss_device"], fb["loss_cpu_fp32"], fb["logp_mean_cpu_fp32"])
        assert fb["loss_abs_diff"] == pytest.approx(abs(fb["loss_device"] - fb["loss_cpu_fp32"]))
        assert fb["loss_abs_diff"] <= fb["loss_tolerance"]
        assert fb["loss_tolerance"] == pytest.approx(
            run.LOSS_TOL["atol"] + run.LOSS_TOL["rtol"] * abs(fb["loss_cpu_fp32"])
        )
        # two precisions were really compared: bf16 autocast and float32 log-probs differ, within the tolerance
        assert 0 < fb["logp_max_abs_diff"] <= run.LOGP_TOL["max_abs"], name
        assert 0 < fb["logp_mean_abs_diff"] <= run.LOGP_TOL["mean_abs"], name
    for name in ("disa", "flowrl"):  # the trained policy and head: the loss itself depends on the precision
        assert gr["runs"][name]["fixed_batch"]["loss_abs_diff"] > 0
    goal = rec["goals"]["objective_step_vs_trl_grpo"]
    assert set(goal["per_objective"]) == {"disa", "flowrl", "grpo"}
    for g in goal["per_objective"].values():
        assert _finite(g["ratio"]) and g["met"] == (g["ratio"] <= run.STEP_GOAL)
    assert goal["met"] == all(g["met"] for g in goal["per_objective"].values())


def test_a_perturbed_fused_output_fails_the_run(tmp_path):
    """--perturb fused shifts tiltlab's chunked log-probs by 0.5: the comparison must catch it (exit 1)."""
    res = _kit(
        tmp_path, "--sections", "fused", "--variants", "naive,chunked", "--dtypes", "float32", "--perturb", "fused"
    )
    rec = json.loads((tmp_path / run.RECORD_NAME).read_text())
    assert res.returncode == 1, res.stderr[-4000:]
    assert rec["ok"] is False and rec["perturbed"] == "fused" and rec["fused"]["ok"] is False
    (c,) = rec["fused"]["comparisons"]
    assert c["variant"] == "chunked" and c["reference"] == "naive" and not c["ok"]
    assert c["logp_max_abs_diff"] == pytest.approx(0.5, abs=1e-3)
    assert any("chunked vs naive" in f for f in rec["failures"])


def test_fixed_batch_comparison_fails_outside_its_tolerance():
    torch = pytest.importorskip("torch")
    logp = torch.full((2, 3), -5.0)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert run.compare_fixed_batch(1.0, 1.0, logp, logp + 1e-3, mask)["ok"]
    assert not run.compare_fixed_batch(1.5, 1.0, logp, logp, mask)["ok"]  # loss off by 50%
    assert not run.compare_fixed_batch(0.02, 0.0, logp, logp, mask)["ok"]  # beyond atol at a zero loss
    far = logp.clone()
    far[1, 2] += 0.5  # one token far off
    assert not run.compare_fixed_batch(1.0, 1.0, far, logp, mask)["ok"]
    far = logp.clone()
    far[0, 2] += 0.5  # ... but a masked-out position does not count
    assert run.compare_fixed_batch(1.0, 1.0, far, logp, mask)["ok"]
    assert not run.compare_fixed_batch(float("nan"), 1.0, logp, logp, mask)["ok"]


def _fake_wheel_dir(tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "whl"
    d.mkdir()
    wheel = d / "fake-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    manifest = tmp_path / "manifest.json"
    entry = {
        "name": "fake",
        "version": "1.0",
        "filename": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "bytes": wheel.stat().st_size,
    }
    manifest.write_text(json.dumps({"max_total_bytes": 1000, "wheels": [entry]}))
    return d, manifest


def _verify(d: Path, manifest: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(KIT / "prepare.py"), "--verify", "--dir", str(d), "--manifest", str(manifest)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_prepare_verify_passes_a_matching_folder_and_fails_a_wrong_hash(tmp_path):
    d, manifest = _fake_wheel_dir(tmp_path)
    ok = _verify(d, manifest)
    assert ok.returncode == 0, ok.stderr
    (d / "fake-1.0-py3-none-any.whl").write_bytes(b"tampered")
    bad = _verify(d, manifest)
    assert bad.returncode == 1 and "sha256 mismatch" in bad.stderr


def test_prepare_verify_fails_on_an_extra_or_missing_wheel_and_on_size(tmp_path):
    d, manifest = _fake_wheel_dir(tmp_path)
    (d / "fake-0.9-py3-none-any.whl").write_bytes(b"x")  # a second version would stop the device's pip install
    assert any("not in the manifest" in p for p in prepare.verify(d, manifest))
    (d / "fake-0.9-py3-none-any.whl").unlink()
    m = json.loads(manifest.read_text())
    m["max_total_bytes"] = 5
    manifest.write_text(json.dumps(m))
    assert any("exceeds" in p for p in prepare.verify(d, manifest))
    (d / "fake-1.0-py3-none-any.whl").unlink()
    assert any("missing" in p for p in prepare.verify(d, manifest))
    assert prepare.verify(d, tmp_path / "absent.json") == [f"no manifest at {tmp_path / 'absent.json'}"]


def test_committed_manifest_lists_one_pinned_wheel_per_package():
    m = json.loads(prepare.MANIFEST.read_text())
    pins = {prepare._norm(k): v for k, v in prepare.PINS.items()}
    assert {w["name"]: w["version"] for w in m["wheels"]} == pins and len(m["wheels"]) == len(pins)
    for w in m["wheels"]:
        assert prepare._wheel_name_version(Path(w["filename"])) == (w["name"], w["version"])
        assert re.fullmatch(r"[0-9a-f]{64}", w["sha256"]) and w["bytes"] > 0
        assert w["filename"].endswith(("-py3-none-any.whl", "-py312-none-any.whl"))  # pure Python: any platform
    assert m["total_bytes"] == sum(w["bytes"] for w in m["wheels"]) <= m["max_total_bytes"] == prepare.MAX_TOTAL_BYTES
    assert not set(pins) & {prepare._norm(k) for k in prepare.DEVICE_HAS}  # one source per package


def test_device_command_fits_and_is_documented_verbatim():
    cmd = run.DEVICE_COMMAND
    assert len(cmd) < 2000
    assert "prepare.py --verify" in cmd and "--target /tmp/site .whl/*.whl" in cmd and '--out "$OUT"' in cmd
    assert cmd in (KIT / "README.md").read_text() and 'carry: [".whl"]' in (KIT / "README.md").read_text()
    rec = json.loads(gpu_record.record_path(ROOT).read_text())
    assert rec["commands"]["device"] == cmd and rec["commands"]["carry"] == run.CARRY


def test_benchmarks_readme_gpu_section_is_generated_from_the_record():
    """benchmarks/README.md's section equals gpu_record.render(benchmarks/records/gpu.json), the text
    `tiltlab report --docs` and benchmarks/gpu/report.py write."""
    assert report.update_readme(check=True), "run: python benchmarks/gpu/report.py"
    rec = json.loads(gpu_record.record_path(ROOT).read_text())
    text = gpu_record.readme_path(ROOT).read_text()
    assert gpu_record.render(rec) in text
    if rec["status"] != "ran":
        assert rec["status"] == "not run yet" and "Not run yet." in text
    assert gpu_record.rendered_readme(ROOT) == (gpu_record.readme_path(ROOT), text)


def test_report_rewrites_a_stale_section_and_check_mode_leaves_it(tmp_path):
    (tmp_path / "benchmarks" / "records").mkdir(parents=True)
    (tmp_path / "benchmarks" / "records" / "gpu.json").write_text(gpu_record.record_path(ROOT).read_text())
    stale = "# B\n\n<!-- generated by `tiltlab report --docs`: gpu -->\nold\n<!-- end of generated section: gpu -->\n"
    readme = tmp_path / "benchmarks" / "README.md"
    readme.write_text(stale)
    assert report.main(["--root", str(tmp_path), "--check"]) == 1 and readme.read_text() == stale
    assert report.main(["--root", str(tmp_path)]) == 0 and "Not run yet." in readme.read_text()
    assert report.main(["--root", str(tmp_path), "--check"]) == 0
    readme.write_text("# B, with no generated section\n")
    with pytest.raises(ValueError, match="no generated section 'gpu'"):
        report.main(["--root", str(tmp_path)])


def test_render_of_a_real_record(dry_run):
    _, rec = dry_run
    md = gpu_record.render(rec)
    assert "| bfloat16 | 64 |" in md and "| disa |" in md and "| trl-grpo |" in md and "Verdict: **ok**" in md
