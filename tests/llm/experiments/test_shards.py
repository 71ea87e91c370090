"""The run store of experiments longer than one sitting (tiltlab.llm.experiments.shards)."""

from __future__ import annotations

import json

import pytest

from tiltlab.llm.experiments import shards
from tiltlab.llm.experiments.shards import RunStore, shard_keys

PROV = {"check": "c", "commit": "abc", "commit_sha": "a" * 40, "rule_hashes": {"f.py": "0" * 64},
        "run_at": "2026-12-04T19:00:00+00:00", "machine": {"cpus": 2}}  # fmt: skip


@pytest.mark.parametrize("n, of", [(1, 1), (7, 1), (7, 3), (42, 4), (3, 5)])
def test_shards_are_disjoint_and_together_the_plan(n, of):
    plan = [f"k{i}" for i in range(n)]
    parts = [shard_keys(plan, i, of) for i in range(of)]
    flat = [k for p in parts for k in p]
    assert sorted(flat) == sorted(plan) and len(flat) == len(set(flat))
    assert parts[0][:2] == plan[0 : 2 * of : of][:2]  # every of-th key from the index
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("index, of, match", [(2, 2, "index"), (-1, 2, "index"), (0, 0, "count"), (True, 2, "index")])
def test_a_bad_shard_is_refused(index, of, match):
    with pytest.raises(ValueError, match=match):
        shard_keys(["a", "b"], index, of)
    with pytest.raises(ValueError, match="repeats"):
        shard_keys(["a", "a"], 0, 1)


def test_a_stored_run_round_trips_with_its_provenance_and_is_never_replaced(tmp_path):
    st = RunStore(tmp_path / "s")
    assert st.keys() == [] and st.missing(["a", "b"]) == ["a", "b"]
    run = st.put("tune-disa-lr1e-05-s9000", {"arm": "disa", "eval": {"correct": [1, 2]}}, PROV)
    assert st.get("tune-disa-lr1e-05-s9000") == run == {"key": "tune-disa-lr1e-05-s9000", "arm": "disa",
                                                         "eval": {"correct": [1, 2]}, **PROV}  # fmt: skip
    assert st.keys() == ["tune-disa-lr1e-05-s9000"] and st.missing(["tune-disa-lr1e-05-s9000", "b"]) == ["b"]
    with pytest.raises(FileExistsError, match="never replaced"):
        st.put("tune-disa-lr1e-05-s9000", {"arm": "flowrl"}, PROV)
    assert st.get("tune-disa-lr1e-05-s9000")["arm"] == "disa"
    assert not list((tmp_path / "s" / "runs").glob(".*"))  # no temporary left


@pytest.mark.parametrize("key", ["", "../x", "a/b", "-a", "a b", None])
def test_a_bad_key_is_refused(tmp_path, key):
    with pytest.raises(ValueError, match="run key"):
        RunStore(tmp_path).path(key)


def test_put_refuses_a_result_using_a_provenance_key_or_a_partial_provenance(tmp_path):
    st = RunStore(tmp_path)
    with pytest.raises(ValueError, match=r"provenance key\(s\) \['commit'\]"):
        st.put("a", {"commit": "x"}, PROV)
    with pytest.raises(ValueError, match=r"provenance lacks \['machine'\]"):
        st.put("a", {}, {k: v for k, v in PROV.items() if k != "machine"})
    assert not st.has("a")


def test_get_refuses_a_file_that_is_not_its_run(tmp_path):
    st = RunStore(tmp_path)
    st.path("a").parent.mkdir(parents=True)
    st.path("a").write_text("{not json")
    with pytest.raises(ValueError, match="not a stored run"):
        st.get("a")
    st.path("a").write_text(json.dumps({"key": "b"}))
    with pytest.raises(ValueError, match="its key is 'b'"):
        st.get("a")
    with pytest.raises(KeyError, match="not in the store"):
        st.get("zz")


def test_provenance_names_the_commit_its_rule_hashes_and_the_machine():
    prov = shards.provenance("smollm2_135m_comparison")
    assert set(prov) == set(shards.PROVENANCE_KEYS)
    assert "llm/checks/real_comparison.py" in prov["rule_hashes"] and prov["machine"]["cpus"] >= 1


def test_verify_run_refuses_a_run_of_a_modified_checkout_naming_it():
    with pytest.raises(ValueError, match=r"stored run 'k'.*modified checkout"):
        shards.verify_run({**PROV, "commit": "abc-dirty", "key": "k"}, "disa.llm.real_model_training")
    with pytest.raises(ValueError, match=r"stored run 'k'.*commit is unknown"):
        shards.verify_run({**PROV, "commit": None, "key": "k"}, "disa.llm.real_model_training")
