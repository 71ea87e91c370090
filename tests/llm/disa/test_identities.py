"""Resume identities and cache keys of llm/, field by field.

The class of bug: an identity or a cache key that misses a field (Stage 1 resumed with another
``reward_shift`` and mixing labels of two targets; an embedding cache keyed on the *set* of prompts
that hands back rows in another order). Each test changes ONE field at a time and asserts the
resume is refused (or the cached value recomputed), and that an unchanged identity is accepted. The
field lists are written out here, not read from the code, and every configuration field must be
classified (identity or not), so a new field cannot be left out silently.

Covered: Stage 1's resume identity (``llm.disa.stage1``), the Stage 1 -> Stage 3 label compatibility
(``trainers.disa_labels``), Stage 2's embedding cache (``llm.disa.stage2.run.cached_embeddings`` and
``llm.base.models.model_fingerprint``), PACED's pi_ref embedding cache (``trainers.paced``), the warm-up weight
cache of the tiny-model checks (``checks.task``) and the per-process memo of their multi-arm runs
(``checks.tiny_runs._memo``). The online trainer's frozen log Z cache (keyed by the prompt) is tested
in ``test_log_z_column.py``."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("pyarrow")
pytest.importorskip("safetensors")

from tiltlab.llm.disa import stage1
from tiltlab.llm.disa.stage1 import MANIFEST, Stage1Config, run_stage1

pytestmark = [
    pytest.mark.llm,
    # the 3-prompt run has reward 0 everywhere: Stage 1's vacuous-run guard says so on each resume
    pytest.mark.filterwarnings("ignore::tiltlab.llm.base.learning_signal.VacuousRunWarning"),
]


# ------------------------------------------------------------------ Stage 1: resume identity
def other_reward(prompts, completions, completion_ids=None, **kw):
    return [0.0 for _ in completion_ids]


def _rows(math_rows):
    return [dict(r) for r in math_rows[:3]]


def _base(tiny_dir, out) -> dict:
    return dict(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(out),
        M=2,
        tilt_beta=1.5,
        reward="math",
        reward_scale=1.5,
        reward_shift=0.25,
        max_new_tokens=2,
        prompts_per_shard=3,
        gen_batch_size=6,
        score_batch_size=6,
        device="cpu",
    )


@pytest.fixture(scope="module")
def stage1_run(tiny_dir, math_rows, tmp_path_factory):
    """One finished Stage 1 run (3 prompts, one shard) on the tiny model."""
    out = tmp_path_factory.mktemp("s1") / "run"
    run_stage1(Stage1Config(**_base(tiny_dir, out)), rows=_rows(math_rows), progress=False)
    return out


@pytest.fixture
def run_copy(stage1_run, tmp_path, monkeypatch):
    """A copy of the finished run to resume; building a model there is an error (a finished run with
    an accepted identity has nothing to sample, a refused one stops before any model)."""
    out = tmp_path / "run"
    shutil.copytree(stage1_run, out)

    def no_models(*a, **k):
        raise AssertionError("the resume built models")

    monkeypatch.setattr(stage1.pipeline, "_Models", no_models)  # where run_stage1 looks it up
    return out


TRUNCATING = {"allow_truncated": True}
# each field of the identity, one at a time: (field, changed value, other config it needs)
IDENTITY_CASES = [
    ("proposal", "some/other-proposal", {}),
    ("reference", "some/other-reference", {}),
    ("dataset", "other.jsonl", {}),
    ("M", 3, {}),
    ("tilt_beta", 2.0, {}),
    ("reward", "auto", {}),
    ("reward_scale", 1.0, {}),
    ("reward_shift", 0.0, {}),
    ("temperature", 1.1, {}),
    ("top_p", 0.9, TRUNCATING),
    ("top_k", 5, TRUNCATING),
    ("max_new_tokens", 3, {}),
    ("seed", 1, {}),
    ("prompts_per_shard", 2, {}),
    ("max_prompts", 5, {}),  # 5 > 3 rows: the prompts are the same, only the setting differs
    ("chat_template", False, {}),
    ("chat_template_kwargs", {"enable_thinking": False}, {}),
    ("tokenizer", "proposal", {}),
    ("engine", "vllm", {}),
    ("dtype", "fp32", {}),
    ("gen_batch_size", 7, {}),  # the hf engine's batches draw the sampler's random stream
    ("device", "cuda", {}),  # samplers draw different streams on cpu and cuda
]
# fields a resume may change (they do not change the samples or the labels): (field, changed value)
NOT_IDENTITY_CASES = [
    ("score_batch_size", 4),
    ("allow_truncated", True),
    ("gpu_memory_utilization", 0.5),
    ("max_model_len", 64),
    ("reference_scoring", "hf"),
    ("device", "cpu:0"),  # the device type is the identity, not its index
]
VLLM_ONLY = [("quantization", "fp8"), ("tensor_parallel_size", 2)]
NOT_A_RESUME = {"out_dir"}  # another out_dir is another run


def test_every_stage1_config_field_is_classified():
    fields = {f.name for f in dataclasses.fields(Stage1Config)}
    named = {f for f, *_ in IDENTITY_CASES} | {f for f, _ in NOT_IDENTITY_CASES} | {f for f, _ in VLLM_ONLY}
    assert fields == named | NOT_A_RESUME, (
        "classify every Stage1Config field as part of the resume identity or not (and test it here): "
        f"unclassified {sorted(fields - named - NOT_A_RESUME)}, unknown {sorted(named | NOT_A_RESUME - fields)}"
    )


@pytest.mark.parametrize(("field", "value", "needs"), IDENTITY_CASES, ids=[c[0] for c in IDENTITY_CASES])
def test_stage1_resume_with_one_identity_field_changed_is_refused(field, value, needs, tiny_dir, math_rows, run_copy):
    before = (run_copy / MANIFEST).read_text()
    cfg = Stage1Config(**{**_base(tiny_dir, run_copy), **needs, field: value})
    with warnings.catch_warnings(), pytest.raises(ValueError, match="different configuration") as e:
        warnings.simplefilter("ignore", RuntimeWarning)  # the loud warning of a truncated sampler
        run_stage1(cfg, rows=_rows(math_rows), progress=False)
    assert f"'{field}'" in str(e.value)
    assert (run_copy / MANIFEST).read_text() == before  # nothing written


@pytest.mark.parametrize(
    "change",
    ["reordered", "an id", "a prompt", "another reward function"],
)
def test_stage1_resume_with_other_prompts_or_reward_function_is_refused(change, tiny_dir, math_rows, run_copy):
    rows, reward_fn = _rows(math_rows), None
    if change == "reordered":
        rows = rows[::-1]
    elif change == "an id":
        rows[1]["id"] = "renamed"
    elif change == "a prompt":
        rows[2]["prompt"] += " "
    else:
        reward_fn = other_reward
    key = "reward" if reward_fn else "prompts_sha256"
    with pytest.raises(ValueError, match="different configuration") as e:
        run_stage1(Stage1Config(**_base(tiny_dir, run_copy)), rows=rows, reward_fn=reward_fn, progress=False)
    assert f"'{key}'" in str(e.value)


@pytest.mark.parametrize(
    ("field", "value"), [(None, None), *NOT_IDENTITY_CASES], ids=["unchanged", *[f for f, _ in NOT_IDENTITY_CASES]]
)
def test_stage1_resume_with_the_same_identity_is_accepted(field, value, tiny_dir, math_rows, run_copy):
    man0 = json.loads((run_copy / MANIFEST).read_text())
    kw = _base(tiny_dir, run_copy) if field is None else {**_base(tiny_dir, run_copy), field: value}
    summary = run_stage1(Stage1Config(**kw), rows=_rows(math_rows), progress=False)
    man = json.loads((run_copy / MANIFEST).read_text())
    assert man["complete"] and man["shards"] == man0["shards"] and summary["n_prompts"] == 3
    assert man["identity"] == man0["identity"]
    changed = {k: v for k, v in man["resumes"][-1].items() if k != "out_dir"}  # (the copy is elsewhere)
    assert changed == ({} if field is None else {field: value})  # the change is recorded


def _as_vllm_run(out: Path) -> None:
    """Make the recorded run a vLLM one (engine-specific fields as a vLLM run records them)."""
    man = json.loads((out / MANIFEST).read_text())
    man["identity"].update(engine="vllm", gen_batch_size=None, quantization=None, tensor_parallel_size=1)
    man["config"]["engine"] = "vllm"
    (out / MANIFEST).write_text(json.dumps(man))


@pytest.mark.parametrize(("field", "value"), [(None, None), *VLLM_ONLY, ("gen_batch_size", 7)])
def test_stage1_vllm_identity_has_its_engine_fields(field, value, tiny_dir, math_rows, run_copy):
    """A vLLM run's identity holds quantization and tensor_parallel_size (refused when changed); the
    hf engine's batch size is not a vLLM run's identity (accepted)."""
    _as_vllm_run(run_copy)
    kw = {**_base(tiny_dir, run_copy), "engine": "vllm"}
    if field is not None:
        kw[field] = value
    cfg = Stage1Config(**kw)
    if field in ("quantization", "tensor_parallel_size"):
        with pytest.raises(ValueError, match="different configuration") as e:
            run_stage1(cfg, rows=_rows(math_rows), progress=False)
        assert f"'{field}'" in str(e.value)
    else:
        assert run_stage1(cfg, rows=_rows(math_rows), progress=False)["n_prompts"] == 3


# ------------------------------------------------------------------ Stage 1 -> Stage 3: label compatibility
LABEL_FIELDS = [
    ("tilt_beta", {"tilt_beta": 2.0}),
    ("reward scale a", {"reward_transform": ("affine", 1.0, 0.25)}),
    ("reward shift c", {"reward_transform": ("affine", 1.5, 0.0)}),
    ("reward transform", {"reward_transform": ("group_norm",)}),
    ("logprob scale", {"logprob_scale": "mean"}),
    ("chat template", {"chat_template": False}),
]


def _stage3_settings(**kw):
    return {
        "tilt_beta": 1.5,
        "reward_transform": ("affine", 1.5, 0.25),
        "logprob_scale": "sum",
        "chat_template": True,
        **kw,
    }


def test_stage3_with_the_stage1_settings_is_accepted(stage1_run):
    from tiltlab.llm.disa.labels import check_label_compat

    man = json.loads((stage1_run / MANIFEST).read_text())
    assert check_label_compat(man, **_stage3_settings()) == []


@pytest.mark.parametrize(("what", "change"), LABEL_FIELDS, ids=[w for w, _ in LABEL_FIELDS])
def test_stage3_with_one_label_setting_changed_is_refused(what, change, stage1_run):
    from tiltlab.llm.disa.labels import LabelMismatchError, check_label_compat

    man = json.loads((stage1_run / MANIFEST).read_text())
    with pytest.raises(LabelMismatchError):
        check_label_compat(man, **_stage3_settings(**change))


# ------------------------------------------------------------------ Stage 2: embedding cache
TEXTS = ["What is 2 + 3?", "Name a prime above 10.", "Compute 7 * 6 and explain.", "Say hi."]


@pytest.fixture
def embed(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    """``(cached(texts, model=..., name=..., batch_size=...) -> (emb, hit), direct(texts, model))``:
    the cached embeddings in one cache folder, and the uncached computation."""
    from tiltlab.llm.disa.stage2 import run as stage2

    calls = []
    real = stage2.embed_prompts

    def counting(model, tok, texts, *a, **k):
        calls.append(list(texts))
        return real(model, tok, texts, *a, **k)

    monkeypatch.setattr(stage2, "embed_prompts", counting)

    def cached(texts, model=tiny_model, name="tiny", batch_size=2):
        n = len(calls)
        emb, hit = stage2.cached_embeddings(model, tiny_tokenizer, texts, tmp_path / "cache", name, batch_size)
        assert hit == (len(calls) == n)  # a hit never runs the model
        return emb, hit

    def direct(texts, model=tiny_model):
        return real(model, tiny_tokenizer, texts, batch_size=len(texts))

    return cached, direct


def test_stage2_cache_hit_only_for_the_same_texts_model_and_pooling(embed):
    cached, direct = embed
    emb, hit = cached(TEXTS)
    assert not hit
    torch.testing.assert_close(emb, direct(TEXTS), rtol=1e-5, atol=1e-6)
    again, hit = cached(TEXTS, batch_size=3)  # the batch size is not part of the key (pooling ignores padding)
    assert hit and torch.equal(again, emb)


def test_stage2_cache_reordered_prompts_read_rows_in_the_new_order(embed):
    cached, direct = embed
    cached(TEXTS)
    order = [2, 0, 3, 1]
    texts = [TEXTS[i] for i in order]
    emb, hit = cached(texts)
    assert not hit
    torch.testing.assert_close(emb, direct(texts), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(emb, direct(TEXTS))  # the rows really differ


@pytest.mark.parametrize("change", ["one text", "a text appended", "model name", "pooling"])
def test_stage2_cache_recomputes_when_one_key_field_changes(change, embed, monkeypatch):
    from tiltlab.llm.disa.stage2 import run as stage2

    cached, direct = embed
    cached(TEXTS)
    texts, name = list(TEXTS), "tiny"
    if change == "one text":
        texts[1] = texts[1] + "!"
    elif change == "a text appended":
        texts.append("One more.")
    elif change == "model name":
        name = "another-model"
    else:
        monkeypatch.setattr(stage2, "POOLING", stage2.POOLING + "-v2")
    emb, hit = cached(texts, name=name)
    assert not hit
    torch.testing.assert_close(emb, direct(texts), rtol=1e-5, atol=1e-6)


def _perturbed(model, where: str):
    m = copy.deepcopy(model)
    params = list(m.parameters())
    if where == "config":
        m.config.tiltlab_probe = 1  # a config field that no weight shows
        return m
    p = {"first": params[0], "middle": params[len(params) // 2], "last": params[-1]}[where]
    with torch.no_grad():
        p.view(-1)[0] += 0.5
    return m


@pytest.mark.parametrize("where", ["first", "middle", "last", "config"])
def test_stage2_model_fingerprint_and_cache_follow_the_model(where, embed, tiny_model):
    from tiltlab.llm.base.models import model_fingerprint

    cached, direct = embed
    cached(TEXTS)
    other = _perturbed(tiny_model, where)
    assert model_fingerprint(other, "tiny") != model_fingerprint(tiny_model, "tiny")
    assert model_fingerprint(copy.deepcopy(tiny_model), "tiny") == model_fingerprint(tiny_model, "tiny")
    emb, hit = cached(TEXTS, model=other)
    assert not hit
    torch.testing.assert_close(emb, direct(TEXTS, other), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ PACED: pi_ref embedding cache
PROMPTS = [[{"role": "user", "content": t}] for t in TEXTS]


class _PacedStub:
    def __init__(self, model, tok, out_dir):
        self.model, self.tok = model, tok
        self.args = SimpleNamespace(output_dir=str(out_dir), per_device_train_batch_size=2)
        self.accelerator = SimpleNamespace(
            unwrap_model=lambda m: m, num_processes=1, process_index=0, is_main_process=True, device="cpu"
        )
        self.embedded: list = []

    def _prompt_tensors(self, prompts):
        self.embedded.extend(prompts)
        texts = [self.tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return enc["input_ids"], enc["attention_mask"]


@pytest.fixture
def paced_emb(tiny_model, tiny_tokenizer, tmp_path):
    """``emb(prompts, model=..., out=...) -> (rows, recomputed)``: PACED's cached pi_ref embeddings."""
    from tiltlab.llm.train.paced import PacedMixin

    def emb(prompts, model=tiny_model, out=tmp_path / "run"):
        st = _PacedStub(model, tiny_tokenizer, out)
        rows = PacedMixin._paced_ref_embeddings(st, prompts)
        return rows, bool(st.embedded)

    return emb


def test_paced_cache_hit_for_the_same_prompts_and_model(paced_emb, tmp_path):
    first, recomputed = paced_emb(PROMPTS)
    assert recomputed and (tmp_path / "run" / "paced_ref_embeddings.pt").is_file()
    again, recomputed = paced_emb(PROMPTS)
    assert not recomputed and torch.equal(again, first)


@pytest.mark.parametrize("change", ["reordered", "one prompt", "model name", "model weights"])
def test_paced_cache_recomputes_when_one_key_field_changes(change, paced_emb, tiny_model, tmp_path):
    paced_emb(PROMPTS)
    prompts, model = list(PROMPTS), tiny_model
    if change == "reordered":
        prompts = [PROMPTS[i] for i in (2, 0, 3, 1)]
    elif change == "one prompt":
        prompts[1] = [{"role": "user", "content": TEXTS[1] + "!"}]
    elif change == "model name":
        model = copy.deepcopy(tiny_model)
        model.config._name_or_path = "another/model"
    else:
        model = _perturbed(tiny_model, "middle")
    got, recomputed = paced_emb(prompts, model=model)
    assert recomputed
    fresh, _ = paced_emb(prompts, model=model, out=tmp_path / "fresh")  # no cache there
    torch.testing.assert_close(got, fresh, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ tiny-model checks: warm cache and memo
WARM_KEY_FIELDS = {
    "CACHE_VERSION": "v-test",
    "K": 17,
    "N_CORRECT": 3,
    "LEVEL_PASS": (0.1, 0.2),
    "HINT_PASS": 0.33,
    "N_T": 5,
    "HELD_OUT_T": (1,),
    "CHECK_THREADS": 3,
}


@pytest.mark.parametrize("name", sorted(WARM_KEY_FIELDS))
def test_warm_cache_key_changes_with_each_constant(name, monkeypatch):
    """Every module constant that enters the warmed weights (the task, the SFT, the thread count) is in
    ``_task_key``."""
    from tiltlab.llm.experiments import pool, warmup
    from tiltlab.llm.experiments import task as T

    home = {"CACHE_VERSION": warmup, "CHECK_THREADS": pool}.get(name, T)  # the module the key reads it from
    assert hasattr(home, name)

    k0 = warmup._task_key()
    monkeypatch.setattr(home, name, WARM_KEY_FIELDS[name])
    assert warmup._task_key() != k0


def test_warm_cache_files_are_per_seed_and_steps(tmp_path, monkeypatch):
    from tiltlab.llm.experiments import warmup

    monkeypatch.setenv("TILTLAB_CACHE", str(tmp_path))
    trained = []
    monkeypatch.setattr(warmup, "_sft", lambda model, task, steps, seed, progress: trained.append((seed, steps)))
    warm = warmup._warm_cached.__wrapped__  # past the in-process lru_cache: the disk cache alone
    for seed, steps in ((0, 1), (1, 1), (0, 2), (0, 1)):
        warm(seed, steps)
    assert trained == [(0, 1), (1, 1), (0, 2)]  # the repeated (0, 1) loaded its file
    assert len(list((Path(tmp_path) / "llm_checks").glob("warm_*.pt"))) == 3


MEMOIZED = [
    ("methods_raw", "_methods_raw", {"seed": 0, "n_seeds": 2, "steps": 3, "beta": 4.0}),
    ("context_raw", "_context_raw", {"seed": 0, "n_seeds": 2, "steps": 3, "beta": 4.0}),
    ("lad_raw", "_lad_raw", {"seed": 0, "n_seeds": 2, "steps": 3, "eta": 1.0, "old_every": 4}),
    ("fpa_raw", "_fpa_raw", {"seed": 0, "n_seeds": 2, "steps": 3, "lams": (0.0, 1.0)}),
    ("paced", "_paced_raw", {"seed": 0, "n_seeds": 2, "steps": 3, "taus": (0.3, 0.5), "beta": 4.0}),
]
CHANGED = {"seed": 1, "n_seeds": 3, "steps": 4, "beta": 2.0, "eta": 0.5, "old_every": 2, "lams": (0.5,), "taus": (0.7,)}


def _memo_target(public: str):
    from tiltlab.llm.checks import paced
    from tiltlab.llm.experiments import tiny as tiny_runs

    return (paced, "paced_raw") if public == "paced" else (tiny_runs, public)


@pytest.mark.parametrize(("public", "inner", "base"), MEMOIZED, ids=[m[0] for m in MEMOIZED])
def test_check_memo_is_keyed_by_every_argument_and_the_warm_up(public, inner, base, monkeypatch):
    """A memoized multi-arm run (several claims read one run) is recomputed when any one argument, or
    the warm-up length, changes, and read back when none does."""
    from tiltlab.llm.experiments import tiny as tiny_runs
    from tiltlab.llm.experiments import warmup

    mod, fn_name = _memo_target(public)
    calls = []

    def fake(*args):
        calls.append(args)
        return ("result", args, warmup.WARM_STEPS)

    monkeypatch.setattr(mod, inner, fake)
    monkeypatch.setattr(tiny_runs, "_MEMO", {})
    fn = getattr(mod, fn_name)
    first = fn(**base)
    assert fn(**base) is first and len(calls) == 1  # unchanged: read back
    for k in base:
        res = fn(**{**base, k: CHANGED[k]})
        assert res[1] == tuple({**base, k: CHANGED[k]}.values()), k  # computed with the changed argument
    monkeypatch.setattr(warmup, "WARM_STEPS", warmup.WARM_STEPS + 1)
    assert fn(**base)[2] == warmup.WARM_STEPS
    assert len(calls) == len(base) + 2
