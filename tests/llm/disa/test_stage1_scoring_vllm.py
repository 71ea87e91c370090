"""Stage 1's pi_ref scoring on the real SmolLM2-135M-Instruct served by vLLM on CPU (fp32).

(a) proposal == reference at T = 1, untruncated: the one-pass path ("sampler", no scoring requests)
    gives the labels of the two-pass path (the engine's prompt log-probs of ``x + y``);
(b) the same model at T = 0.7 with top-p 0.9: the one scoring pass that reads each prompt's KV from
    the prefix cache gives the log-probs of the uncached prompt log-probs Stage 1 used before (every
    request re-prefilling its prompt), and it did read the cache.

One engine for the module (~30-60 s to start on a 2-core CPU), few prompts and tokens.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")
pytest.importorskip("vllm")

from tiltlab.llm.base.models import MODEL_ALIASES  # noqa: E402
from tiltlab.llm.disa.stage1 import MANIFEST, Stage1Config, load_stage1, run_stage1, vllm_proposal_engine  # noqa: E402

pytestmark = [pytest.mark.llm, pytest.mark.vllm]
ALIAS = "smollm2-135m"


def digit_reward(prompts, completions, completion_ids=None, **kwargs):
    """1 when the completion contains a digit: about half of SmolLM2's short answers."""
    return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


@pytest.fixture(scope="module")
def smollm2():
    try:
        md.distribution(MODEL_ALIASES[ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[ALIAS].install}`")
    from tiltlab.llm.base.models import resolve_model

    return resolve_model(ALIAS)


def _cfg(model, out, **kw):
    base = dict(
        proposal=model, reference=model, dataset="inline", out_dir=str(out), engine="vllm", dtype="fp32",
        device="cpu", seed=11, M=4, max_new_tokens=12, tilt_beta=2.0,
    )  # fmt: skip
    return Stage1Config(**{**base, **kw})


@pytest.fixture(scope="module")
def engine(smollm2, tmp_path_factory):
    # T = 0.7: the engine that also scores pi_ref (CPU KV blocks of 32 tokens, see vllm_proposal_engine)
    eng = vllm_proposal_engine(_cfg(smollm2, tmp_path_factory.mktemp("unused"), temperature=0.7))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def rows(math_rows):
    return [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:4]]


def _run(cfg, rows, engine):
    run_stage1(cfg, rows=rows, reward_fn=digit_reward, progress=False, engine=engine)
    s, lab = (t.to_pydict() for t in load_stage1(cfg.out_dir))
    return s, lab, json.loads((Path(cfg.out_dir) / MANIFEST).read_text())


def test_one_pass_labels_equal_two_pass_at_temperature_1(smollm2, engine, rows, tmp_path):
    """(a) "auto" resolves to the sampler (no scoring request); "vllm" forces the old second pass.
    Same engine and seeds, so the same samples. vLLM computes the processed log-probs at T = 1 as
    log_softmax(logits / 1.0) in fp32 with no top-k/top-p (exactly the raw log-probs), and the prompt
    log-probs as log_softmax(logits) of a prefill of x + y instead of one decode step per token: in
    fp32 the two differ only by batch-shape rounding of the logits, ~1e-6 per token at most (measured
    here: bit-identical). 1e-5 per token bounds that and is far below the beta r term (2)."""
    one = _run(_cfg(smollm2, tmp_path / "one"), rows, engine)
    two = _run(_cfg(smollm2, tmp_path / "two", reference_scoring="vllm"), rows, engine)
    (s1, l1, m1), (s2, l2, m2) = one, two
    assert m1["reference_scoring"] == "sampler" and m2["reference_scoring"] == "vllm:proposal-engine"
    assert {sh["reference_scoring"]["path"] for sh in m1["shards"].values()} == {"sampler"}
    assert s1["completion_ids"] == s2["completion_ids"]
    assert s1["logp_ref"] == s1["logp_proposal"]
    assert 0 < sum(s1["reward_raw"]) < len(s1["reward_raw"])
    for c, a, b in zip(s1["completion_ids"], s1["logp_ref"], s2["logp_ref"]):
        assert abs(a - b) <= 1e-5 * len(c)
    for c, a, b in zip(s1["completion_ids"], s1["log_w"], s2["log_w"]):
        assert abs(a - b) <= 1e-5 * len(c)
    worst = 1e-5 * max(len(c) for c in s1["completion_ids"])  # LSE and mean move at most by max |d log w|
    for col in ("log_z", "log_z_bias_corrected", "log_z_geomean"):
        assert max(abs(a - b) for a, b in zip(l1[col], l2[col])) <= worst, col
    assert max(abs(math.log(a) - math.log(b)) for a, b in zip(l1["ess"], l2["ess"])) <= 4 * worst


def test_prefix_cached_scoring_equals_uncached_prompt_logprobs(smollm2, engine, rows, tmp_path):
    """(b) T = 0.7, top-p 0.9 (allowed): pi_ref is scored in one pass of prompt log-probs that reads each
    prompt's KV from the cache. The "current" path -- the same requests with the cache unread (vLLM's
    default for prompt log-probs) -- gives the same logp_ref: the cached KV is the same fp32 K/V of the
    same tokens, computed in another batch, so only batch-shape rounding can differ (bit-identical
    when measured); 1e-5 per token as above. The run did read cached prompt tokens."""
    from vllm import SamplingParams

    with pytest.warns(RuntimeWarning, match="truncates support"):
        s, lab, man = _run(
            _cfg(smollm2, tmp_path / "b", temperature=0.7, top_p=0.9, allow_truncated=True, prompts_per_shard=2),
            rows,
            engine,
        )
    assert man["reference_scoring"] == "vllm:proposal-engine"
    facts = [sh["reference_scoring"] for sh in man["shards"].values()]
    assert sum(f["tokens_read_from_prefix_cache"] for f in facts) > 0
    from tiltlab.llm.base.prompts import format_prompt

    tok = engine.tokenizer
    pids = {r["id"]: tok(format_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows}
    flat_p = [pids[i] for i in s["prompt_id"]]
    outs = engine.llm.generate(
        [{"prompt_token_ids": p + c} for p, c in zip(flat_p, s["completion_ids"])],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0, seed=0),
        use_tqdm=False,
    )
    for p, c, o, got in zip(flat_p, s["completion_ids"], outs, s["logp_ref"]):
        assert o.num_cached_tokens == 0
        want = math.fsum(o.prompt_logprobs[len(p) + t][x].logprob for t, x in enumerate(c))
        assert abs(got - want) <= 1e-5 * len(c)
    # the proposal's processed (T = 0.7, top-p 0.9) log-probs are not pi_ref's
    assert max(abs(a - b) for a, b in zip(s["logp_ref"], s["logp_proposal"])) > 0.1
    assert all(math.isfinite(x) for x in lab["log_z"])
