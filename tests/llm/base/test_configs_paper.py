"""Every run config against the project's record of the paper tables (``configs/paper_values.toml``),
and every value of every config carries a source comment (on its line or its block)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml  # a base dependency (the data checks validate these configs in every install)

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RECORD = tomllib.loads((CONFIGS / "paper_values.toml").read_text())
CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))
NOT_PAPER = {c: entry["why"] for entry in RECORD.get("not_paper", []) for c in entry["configs"]}
"""Configs that reproduce no paper run (``[[not_paper]]`` of paper_values.toml, each with its reason)."""

_MISSING = object()


def _get(data: dict, dotted: str):
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _expected(name: str) -> list[tuple[str, str, object, str]]:
    out = []
    for g in RECORD["group"]:
        if name in g["configs"]:
            for key, value in g["values"].items():
                out.append((g["paper"], key, value, g["quotes"][key]))
    return out


def test_record_is_well_formed():
    names = {p.name for p in CONFIG_FILES}
    for g in RECORD["group"]:
        assert set(g["values"]) == set(g["quotes"]), g["configs"]
        missing = sorted(set(g["configs"]) - names)
        assert not missing, f"paper_values.toml names configs that do not exist: {missing}"
        assert g["paper"] in ("DISA", "PACED", "FPA", "LAD")
    for entry in RECORD.get("not_paper", []):
        assert entry["why"].strip() and not sorted(set(entry["configs"]) - names), entry


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_config_matches_the_paper_values(path):
    data = yaml.safe_load(path.read_text())
    expected = _expected(path.name)
    if path.name in NOT_PAPER:  # a small CPU recipe: no paper value to match, and its header says so
        assert not expected, f"{path.name} is both a paper config and listed in not_paper"
        assert "Not a paper config" in path.read_text(), path.name
        return
    assert expected, f"{path.name} is not named by any group of configs/paper_values.toml"
    wrong = []
    for paper, key, value, quote in expected:
        got = _get(data, key)
        if got is _MISSING or got != value or isinstance(got, bool) != isinstance(value, bool):
            wrong.append(f"{key} = {got if got is not _MISSING else '<missing>'} but {paper} says {value!r} ({quote})")
    assert not wrong, "\n".join(wrong)


# keys whose value is bookkeeping (paths, logging), not a hyperparameter needing a source
_BOOKKEEPING = {
    "kind",
    "objective",
    "output_dir",
    "out_dir",
    "labels",
    "stage1_dir",
    "stage2_dir",
    "logging_steps",
    "report_to",
    "split",
    "engine",
    "ref_model",
    "reward",
    "dataset",
    "model",
    "accelerate",
    "tilt_beta_levels",
    "default",
    "low",
    "high",
}

_KEY = re.compile(r"^(?P<indent> *)(?:- )?(?P<key>[A-Za-z_][\w.]*):(?P<rest>.*)$")


def _uncommented_values(text: str) -> list[str]:
    """Keys with a scalar value and no source comment. A value is covered by a comment on its line,
    by a comment earlier in its own block (a comment above a run of keys covers the run: "per
    block"), or by its section being covered; a section (``trl:``, ``stage1:`` ...) is covered only
    by a comment on its line or directly above it -- the file header covers top-level scalars, not
    the sections. Bookkeeping keys (paths, logging) are exempt."""
    commented: dict[int, bool] = {}  # indent of an open block -> a comment appeared in it
    section: dict[int, bool] = {}  # indent of an open section key -> it is covered
    bad = []
    prev_comment = False
    for line in text.splitlines():
        s = line.strip()
        if not s:
            prev_comment = False
            continue
        indent = len(line) - len(line.lstrip(" "))
        if s.startswith("#"):
            for k in [k for k in commented if k > indent]:
                del commented[k]
            commented[indent] = True
            prev_comment = True
            continue
        m = _KEY.match(line)
        if not m:
            prev_comment = False
            continue
        key, rest = m.group("key"), m.group("rest")
        for k in [k for k in commented if k > indent]:
            del commented[k]
        for k in [k for k in section if k >= indent]:
            del section[k]
        inline = "#" in rest
        parent = any(section.values())
        if rest.split("#")[0].strip() == "":  # a section: its children inherit its coverage
            section[indent] = inline or prev_comment or parent
        elif not (inline or parent or commented.get(indent, False)) and key not in _BOOKKEEPING:
            bad.append(key)
        prev_comment = False
    return bad


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_every_value_has_a_source_comment(path):
    bad = _uncommented_values(path.read_text())
    assert not bad, f"{path.name}: values without a source comment (on the line or above the block): {bad}"


def test_comment_check_catches_an_uncommented_value():
    assert _uncommented_values("trl:\n  learning_rate: 1.0e-06\n") == ["learning_rate"]
    assert _uncommented_values("trl:\n  learning_rate: 1.0e-06  # FPA App. B.4\n") == []
    assert _uncommented_values("kind: online\n# App. D.1\ntrl:\n  learning_rate: 1.0e-06\n") == []
    # a comment in one section does not cover the next one
    text = "trl:\n  # App. D.1\n  learning_rate: 1.0e-06\nlad:\n  eta: 1.0\n"
    assert _uncommented_values(text) == ["eta"]
    # the file header does not cover a section further down
    assert _uncommented_values("# header\nkind: online\ntrl:\n  learning_rate: 1.0e-06\n") == ["learning_rate"]


@pytest.mark.parametrize("path", [p for p in CONFIG_FILES if p.name.startswith("disa")], ids=lambda p: p.stem)
def test_disa_headers_explain_the_proposal_sampling_deviation(path):
    text = path.read_text()
    assert "App. D.2" in text and "the same generation hyperparameters" in text
    assert "more correct IS weight" in text
    data = yaml.safe_load(text)
    assert data["stage1"]["temperature"] == 1.0 and data["stage1"].get("top_p", 1.0) == 1.0


def test_disa_235b_proposal_is_sharded_and_bounded():
    """470 GB of bf16 weights do not fit 0.6 x 8 x 80 GB: the 235B Stage 1 runs FP8 on 8-way tensor
    parallel with a bounded context; a Qwen2.5 reference re-tokenizes (its vocabulary differs from Qwen3's)."""
    for path in CONFIG_FILES:
        data = yaml.safe_load(path.read_text())
        s1 = data.get("stage1") or {}
        if "235B" not in str(s1.get("proposal")):
            continue
        bf16_gb = 235e9 * 2 / 1e9
        budget_gb = s1["gpu_memory_utilization"] * s1["tensor_parallel_size"] * 80
        assert s1["tensor_parallel_size"] == 8 and s1["max_model_len"] >= s1["max_new_tokens"]
        assert bf16_gb > budget_gb and s1["quantization"] == "fp8" and bf16_gb / 2 < budget_gb
        if "Qwen2.5" in s1["reference"]:
            assert s1["tokenizer"] == "retokenize", path.name  # Qwen3 and Qwen2.5 vocabularies differ
        else:
            assert s1["chat_template_kwargs"] == {"enable_thinking": False}
            assert data["trl"]["chat_template_kwargs"] == s1["chat_template_kwargs"], path.name
