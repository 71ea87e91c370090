"""`tiltlab llm demo --quick`: the whole CPU pipeline; DISA must improve held-out reward over the warm-up.

One seed cannot carry this assertion: the quick demo's warm-up pass rate alone ranges from 0.02 to
0.41 across seeds, and a change of torch thread count changes a seed's numbers (seed 0: warm-up ->
DISA 0.050 -> 0.071 with 1 thread, 0.125 -> 0.154 with 2). The demo therefore runs with a fixed
thread count (``DemoConfig.threads = 1``), and the criterion is over five seeds, fixed before the
run: the mean over seeds 0-4 of (DISA - warm-up) held-out Mean@8 exceeds 0.05, and no seed loses
more than 0.05.

Measured (held-out Mean@8, 30 prompts x 8 samples, warm-up -> DISA), 1 thread:
seed 0 0.050 -> 0.071, 1 0.204 -> 0.271, 2 0.021 -> 0.008, 3 0.408 -> 0.763, 4 0.263 -> 0.767;
mean gain +0.187, worst seed -0.013. With 2 threads seeds 0-3 gave +0.029, +0.142, +0.000, +0.350.
The margins: one Mean@8 has a binomial standard error of at most sqrt(0.25 / 240) = 0.032, so the
mean of five paired differences has an evaluation-noise error of about 0.032 * sqrt(2 / 5) = 0.020;
0.05 is 2.5 of those, and the per-seed floor of -0.05 is about 1.1 per-seed difference errors.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

SEEDS = (0, 1, 2, 3, 4)
MEAN_GAIN = 0.05
WORST_SEED_LOSS = 0.05


def test_demo_quick(tmp_path):
    from tiltlab.llm.demo import DemoConfig, run_demo

    gains = []
    for seed in SEEDS:
        out = tmp_path / f"demo{seed}"
        res = run_demo(DemoConfig.quick(out_dir=str(out), seed=seed), progress=False)
        tab = res["table"]
        assert set(tab) == {"warmup", "grpo", "flowrl", "disa"}
        assert 0.0 < tab["warmup"]["mean_at_k"] < 1.0, seed  # a nonzero, imperfect warm-up pass rate
        gains.append(tab["disa"]["mean_at_k"] - tab["warmup"]["mean_at_k"])
        if seed == SEEDS[0]:
            assert (out / "curves.png").stat().st_size > 10_000
            assert (out / "results.json").is_file()
    summary = ", ".join(f"seed {s}: {g:+.3f}" for s, g in zip(SEEDS, gains))
    assert sum(gains) / len(gains) > MEAN_GAIN, summary
    assert min(gains) > -WORST_SEED_LOSS, summary


def test_demo_restores_thread_count(tmp_path):
    import torch

    from tiltlab.llm.demo import DemoConfig, run_demo

    with pytest.raises(ValueError, match="threads must be >= 1"):
        run_demo(DemoConfig.quick(out_dir=str(tmp_path), threads=0), progress=False)
    before = torch.get_num_threads()
    cfg = DemoConfig.quick(out_dir=str(tmp_path / "d"), threads=1, methods=(), sft_steps=1, n_train=4, n_eval=2)
    run_demo(cfg, progress=False)
    assert torch.get_num_threads() == before
