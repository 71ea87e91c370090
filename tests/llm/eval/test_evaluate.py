"""Evaluation: Mean@k / pass@k / distinct-n against naive references, the tiny model end to end, the judge."""

import hashlib
import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tiltlab.llm.eval.config import EvalConfig
from tiltlab.llm.eval.judge import (
    DISA_D5_JUDGE_TEXT,
    JUDGE_SYSTEM_PROMPT,
    JUDGE_USER_TEMPLATE,
    JudgeConfig,
    format_judge_messages,
    judge_diversity,
    parse_judge_score,
)
from tiltlab.llm.eval.run import evaluate, results_table, save_results


class ListEngine:
    """Simple protocol: generate(prompts, n) -> list[list[str]] from a fixed table keyed by prompt."""

    def __init__(self, table):
        self.table = table
        self.tokenizer = None

    def generate(self, prompts, n):
        return [self.table[p][:n] for p in prompts]


def _naive_pass_at(correct, k):
    """Fraction of k-subsets of the samples that contain a correct one (definition of unbiased pass@k)."""
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def _naive_distinct(texts, n):
    grams = [tuple(t.split()[i : i + n]) for t in texts for i in range(len(t.split()) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def test_metrics_match_naive_references():
    rows = [
        {"id": "p0", "prompt": "q0", "answer": "1"},
        {"id": "p1", "prompt": "q1", "answer": "2"},
        {"id": "p2", "prompt": "q2", "answer": "3"},
    ]
    table = {
        "q0": ["\\boxed{1}", "\\boxed{0}", "a b \\boxed{1}", "x", "a b c", "\\boxed{1}"],  # 3 correct of 6
        "q1": ["\\boxed{5}"] * 6,  # 0 correct
        "q2": ["\\boxed{3}"] * 5 + ["nope"],  # 5 correct
    }
    res = evaluate(
        ListEngine(table),
        {"toy": rows},
        k=6,
        pass_ks=[1, 2, 4, 6, 9],
        distinct_ns=[1, 2],
        chat_template=False,
        progress=False,
    )["toy"]
    correct = {q: [t.endswith(f"\\boxed{{{a}}}") for t in table[q]] for q, a in (("q0", "1"), ("q1", "2"), ("q2", "3"))}
    assert [p["c"] for p in res.per_prompt] == [3, 0, 5]
    assert res.mean_at_k == pytest.approx((3 + 0 + 5) / 18, abs=1e-12)
    assert sorted(res.pass_at) == [1, 2, 4, 6]  # 9 > k dropped
    for kk in (1, 2, 4, 6):
        naive = sum(_naive_pass_at(c, kk) for c in correct.values()) / 3
        assert res.pass_at[kk] == pytest.approx(naive, abs=1e-12)
    for n in (1, 2):
        assert res.distinct[n] == pytest.approx(sum(_naive_distinct(table[q], n) for q in table) / 3, abs=1e-12)
    assert res.mean_completion_tokens is None and res.finished_frac is None
    table_md = results_table({"toy": res})
    assert "| toy | 3 | 44.4" in table_md and "pass@4" in table_md


def test_dropped_pass_at_k_is_said_in_one_line(capsys):
    """A pass@k' with k' > k cannot be estimated from k samples: one line on stderr names the dropped ones
    and why (duplicates once, in order); none when every k' fits or when ``progress`` is off."""
    rows = [{"id": "p0", "prompt": "q0", "answer": "1"}]
    engine = ListEngine({"q0": ["\\boxed{1}", "x"]})
    res = evaluate(engine, {"toy": rows}, k=2, pass_ks=[8, 1, 4, 2, 4], chat_template=False, progress=True)["toy"]
    assert sorted(res.pass_at) == [1, 2]
    err = capsys.readouterr().err.splitlines()
    note = [ln for ln in err if "not reported" in ln]
    assert note == [
        "[eval] pass@4, pass@8 not reported: the unbiased pass@k' estimate needs k' <= k samples per prompt, "
        "and k = 2 (set k to 8 or more to report them)"
    ], err
    evaluate(engine, {"toy": rows}, k=2, pass_ks=[1, 3], chat_template=False, progress=True)
    one = [ln for ln in capsys.readouterr().err.splitlines() if "not reported" in ln]
    assert len(one) == 1 and one[0].startswith("[eval] pass@3 not reported: ")
    assert one[0].endswith("and k = 2 (set k to 3 or more to report it)"), one
    evaluate(engine, {"toy": rows}, k=2, pass_ks=[1, 2], chat_template=False, progress=True)
    assert "not reported" not in capsys.readouterr().err
    evaluate(engine, {"toy": rows}, k=2, pass_ks=[1, 4], chat_template=False, progress=False)
    assert capsys.readouterr().err == ""


def test_errors():
    with pytest.raises(ValueError, match="k must be"):
        evaluate(ListEngine({}), {"x": []}, k=0)
    with pytest.raises(ValueError, match="empty"):
        evaluate(ListEngine({}), {"x": []}, k=1, progress=False)
    with pytest.raises(RuntimeError, match="expected 3"):
        evaluate(
            ListEngine({"q": ["a"]}),
            {"x": [{"id": "1", "prompt": "q", "answer": "1"}]},
            k=3,
            chat_template=False,
            progress=False,
        )
    with pytest.raises(ValueError, match="None"):
        evaluate(
            ListEngine({"q": ["a"]}),
            {"x": [{"id": "1", "prompt": "q", "answer": None}]},
            k=1,
            chat_template=False,
            reward_fn="math",
            progress=False,
        )
    with pytest.raises(ValueError, match="no datasets"):
        EvalConfig(datasets=[])


def test_code_dataset_and_save(tmp_path):
    from tiltlab.llm.base.tasks import function_tasks

    rows = function_tasks(2)
    table = {
        rows[0]["prompt"]: [f"```python\n{rows[0]['solution']}```", "def f(x):\n    return 0"],
        rows[1]["prompt"]: ["while True:\n    pass", f"```python\n{rows[1]['solution']}```"],
    }
    from tiltlab.llm.base.rewards import make_code_reward
    from tiltlab.llm.base.sandbox import SandboxConfig

    fn = make_code_reward(SandboxConfig(timeout_s=2.0))
    res = evaluate(
        ListEngine(table), {"code": rows}, k=2, pass_ks=[1, 2], chat_template=False, reward_fn=fn, progress=False
    )
    assert res["code"].mean_at_k == 0.5 and res["code"].pass_at[2] == 1.0
    out = save_results(res, tmp_path / "ev", config={"k": 2})
    payload = json.loads((out / "results.json").read_text())
    assert payload["results"]["code"]["pass_at"]["2"] == 1.0 and payload["config"] == {"k": 2}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["c"] for s in samples] == [1, 1]
    assert (out / "results.md").read_text().startswith("| dataset")


def test_tiny_model_end_to_end(tiny_model, tiny_tokenizer, tmp_path):
    pytest.importorskip("transformers")
    from tiltlab.llm.base.rollout import HFEngine
    from tiltlab.llm.eval.run import run_eval

    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=16)
    cfg = EvalConfig(
        model="tiny",
        datasets=["synthetic:math:3", "synthetic:code:2"],
        k=4,
        pass_ks=[1, 4],
        max_new_tokens=6,
        temperature=1.0,
        top_p=1.0,
        out_dir=str(tmp_path / "out"),
    )
    res = run_eval(cfg, engine=engine)
    for name, r in res.items():
        assert r.n_prompts == (3 if "math" in name else 2) and r.k == 4
        assert 0.0 <= r.mean_at_k <= r.pass_at[4] <= 1.0
        assert 0 < r.mean_completion_tokens <= 6 and 0.0 <= r.finished_frac <= 1.0
        assert all(len(p["completions"]) == 4 for p in r.per_prompt)
    assert json.loads((tmp_path / "out" / "results.json").read_text())["config"]["k"] == 4


def test_run_eval_passes_every_sampling_option_to_the_engine(tmp_path):
    # EvalConfig's sampling fields away from their defaults (0.6 / 0.95 / 0 / 1024 / 0) reach the engine's
    # SamplingConfig, k reaches n, limit cuts each dataset, and distinct_ns / pass_ks pick the metrics
    from tiltlab.llm.base.rollout import RolloutGroup, SamplingConfig
    from tiltlab.llm.eval.run import run_eval

    calls = []

    class Spy:
        tokenizer = None

        def generate(self, prompts, n, sampling):
            calls.append((list(prompts), n, sampling))
            texts = ["a b a", "a b c", "\\boxed{0}"][:n]
            return [RolloutGroup(p, [1], [[2, 3]] * n, texts, [[-0.1, -0.2]] * n, [True] * n) for p in prompts]

    cfg = EvalConfig(
        model="unused",
        datasets=["synthetic:math:5"],
        k=3,
        pass_ks=[2],
        distinct_ns=[3],
        temperature=0.3,
        top_p=0.8,
        top_k=7,
        max_new_tokens=5,
        seed=11,
        limit=2,
        chat_template=False,
    )
    res = run_eval(cfg, engine=Spy())["synthetic:math:5"]
    assert len(calls) == 1
    prompts, n, sampling = calls[0]
    assert n == 3 and len(prompts) == 2 and res.n_prompts == 2
    assert sampling == SamplingConfig(temperature=0.3, top_p=0.8, top_k=7, max_new_tokens=5, seed=11)
    assert sorted(res.pass_at) == [2] and sorted(res.distinct) == [3]
    assert res.distinct[3] == pytest.approx(_naive_distinct(["a b a", "a b c", "\\boxed{0}"], 3))
    assert res.distinct[3] != pytest.approx(_naive_distinct(["a b a", "a b c", "\\boxed{0}"], 2))


# ------------------------------------------------------------------ the judge


def _words(s):
    return re.findall(r"[a-z/]+", re.sub(r"\{[a-z_]+\}", " ", s.lower()))


# sha256 of DISA_D5_JUDGE_TEXT when it was checked to be an exact substring of the text extraction
# of DISA App. D.5: an edit of the record constant fails here.
D5_RECORD_SHA256 = "906823c721624cfafe0b8e767cb1f0447edd9b50228640a7d156be337518e961"


def test_judge_prompt_is_d5_verbatim_with_numbers_restored():
    assert hashlib.sha256(DISA_D5_JUDGE_TEXT.encode()).hexdigest() == D5_RECORD_SHA256
    d5 = _words(DISA_D5_JUDGE_TEXT)
    d5.remove("system")
    d5.remove("user")
    # the usable prompt has D.5's exact word sequence; it differs only in numbers, bullets and punctuation
    assert _words(JUDGE_SYSTEM_PROMPT + " " + JUDGE_USER_TEMPLATE) == d5
    nums = re.findall(r"\d+\+?(?:-\d+)?", JUDGE_USER_TEMPLATE)
    assert nums == [
        "1",
        "5",
        "1",
        "14+",
        "2",
        "11-13",
        "1-2",
        "3",
        "7-10",
        "2-3",
        "4",
        "4-6",
        "3-4",
        "5",
        "3",
        "4+",
        "1",
        "5",
    ]  # LAD Box C.0's numbers, in order


def test_parse_judge_score():
    assert parse_judge_score("4") == 4
    assert parse_judge_score("Score: 2.") == 2
    assert parse_judge_score("I'd say 3 out of 5") == 3
    assert parse_judge_score("7") is None and parse_judge_score("2.5") is None and parse_judge_score("") is None


@pytest.fixture
def fake_openai():
    """A local OpenAI-compatible /v1/chat/completions server on 127.0.0.1 (records requests)."""
    state = {"requests": [], "replies": []}

    class H(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            code, content = state["replies"].pop(0) if state["replies"] else (200, "4")
            payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    state["base_url"] = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield state
    srv.shutdown()
    srv.server_close()


def test_judge_against_local_server(fake_openai, monkeypatch):
    monkeypatch.setenv("TILTLAB_TEST_KEY", "sk-local")
    cfg = JudgeConfig(base_url=fake_openai["base_url"], model="judge-x", api_key_env="TILTLAB_TEST_KEY", max_retries=1)
    fake_openai["replies"] += [(200, "Score: 2"), (503, ""), (200, "5"), (200, "no idea")]
    scores = judge_diversity(["P1", "P2", "P3"], [["a", "b"], ["c", "d"], ["e", "f"]], cfg)
    assert scores == [2, 5, None]  # the 503 was retried
    req = fake_openai["requests"][0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-local"
    assert req["body"]["model"] == "judge-x" and req["body"]["temperature"] == 0.0
    sys_msg, user_msg = req["body"]["messages"]
    assert sys_msg == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert user_msg == {"role": "user", "content": format_judge_messages("P1", ["a", "b"])[1]["content"]}
    assert "PROBLEM: P1" in user_msg["content"] and "Solution 2:\nb" in user_msg["content"]


def test_judge_in_evaluate_uses_env_endpoint(fake_openai, monkeypatch):
    monkeypatch.setenv("TILTLAB_JUDGE_BASE_URL", fake_openai["base_url"])
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rows = [
        {"id": "a", "prompt": "q1", "answer": "1", "problem_text": "raw q1"},
        {"id": "b", "prompt": "q2", "answer": "2"},
    ]
    fake_openai["replies"] += [(200, "3"), (200, "5")]
    res = evaluate(
        ListEngine({"q1": ["x", "y"], "q2": ["z", "w"]}),
        {"aime": rows},
        k=2,
        chat_template=False,
        judge=JudgeConfig(),
        progress=False,
    )["aime"]
    assert (res.judge_mean, res.judge_std, res.judge_n) == (4.0, 1.0, 2)
    assert fake_openai["requests"][0]["auth"] is None
    assert fake_openai["requests"][0]["body"]["model"] == "gpt-4o-mini"
    assert "PROBLEM: raw q1" in fake_openai["requests"][0]["body"]["messages"][1]["content"]
    assert "judge (1-5)" in results_table({"aime": res})


def test_judge_http_error_is_clear(fake_openai):
    fake_openai["replies"] += [(401, "")]
    with pytest.raises(RuntimeError, match="HTTP 401"):
        judge_diversity(["P"], [["a"]], JudgeConfig(base_url=fake_openai["base_url"], max_retries=0))


def test_run_eval_sends_the_configured_judge_model_and_endpoint(fake_openai, tmp_path):
    """EvalConfig's judge_base_url and judge_model (away from their defaults) are what the judge is asked
    with, and judge_datasets limits which datasets are judged."""
    from tiltlab.llm.eval.run import run_eval

    for name, q in (("a.jsonl", "qa"), ("b.jsonl", "qb")):
        (tmp_path / name).write_text(json.dumps({"id": name, "prompt": q, "answer": "1"}) + "\n")
    cfg = EvalConfig(
        model="unused",
        datasets=[str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
        k=2,
        chat_template=False,
        judge=True,
        judge_base_url=fake_openai["base_url"],
        judge_model="judge-y",
        judge_datasets=[str(tmp_path / "b.jsonl")],
    )
    fake_openai["replies"] += [(200, "3")]
    run_eval(cfg, engine=ListEngine({"qa": ["x", "y"], "qb": ["z", "w"]}))
    assert [r["body"]["model"] for r in fake_openai["requests"]] == ["judge-y"]
    assert "qb" in fake_openai["requests"][0]["body"]["messages"][1]["content"]
