"""The budget of ``tiltlab llm demo`` (:class:`DemoConfig`) and the overrides for a pretrained model."""

from __future__ import annotations

from dataclasses import dataclass

from tiltlab.objectives.catalog import refuse_old_names


@dataclass
class DemoConfig:
    """Budget of ``tiltlab llm demo`` (``--quick`` uses :meth:`quick`)."""

    out_dir: str = "runs/demo"
    """Output directory (model checkpoints, Stage 1/2 files, results.json, curves.png)."""
    model: str = "tiny"
    """Starting model: "tiny" (random tiny Qwen3 + SFT warm-up) or a pretrained model / alias used as pi_ref."""
    seed: int = 0
    """Seed of the tiny model, the data split, SFT, the trainers and the evaluation sampler."""
    n_train: int = 60
    """Training prompts (distinct values of a in "Compute a + 0.")."""
    n_eval: int = 30
    """Held-out prompts (values of a disjoint from training)."""
    sft_steps: int = 300
    """SFT warm-up optimizer steps."""
    sft_lr: float = 1e-2
    """SFT learning rate (AdamW)."""
    sft_noise: float = 0.5
    """Fraction of warm-up answers replaced by a wrong (off-by-one) answer."""
    rl_steps: int = 40
    """Optimizer steps of each RL method."""
    rl_lr: float = 2e-3
    """Learning rate of GRPO."""
    tb_lr: float = 5e-4
    """Learning rate of DISA and FlowRL: their squared trajectory-balance residual on summed
    log-probs has larger gradients than GRPO's ratio surrogate; at 2e-3 the quick run's DISA policy
    got worse (0.29 -> 0.19 held-out Mean@8, seed 0) while 5e-4 improved it (0.29 -> 0.46)."""
    prompts_per_step: int = 8
    """Prompts per RL step (x num_generations completions)."""
    num_generations: int = 8
    """Group size G of the RL methods (and M of Stage 1)."""
    tilt_beta: float = 2.0
    """Tilt beta of DISA and FlowRL (multiplies r~ = r; target pi* ~ pi_ref exp(beta r))."""
    eval_k: int = 8
    """Samples per held-out prompt for Mean@k / pass@k."""
    max_new_tokens: int = 8
    """Completion length cap (an answer is \\boxed{n} + end of turn: 5-6 tokens)."""
    methods: tuple = ("grpo", "flowrl", "disa")
    """RL methods trained from the warm-up model."""
    curve_every: int = 5
    """Held-out Mean@k is evaluated every this many RL steps (and after the last) for the curves."""
    threads: int = 1
    """torch intra-op threads for the run. Fixed (not the machine's core count) because a parallel
    reduction sums in an order that depends on the thread count, and these short training runs
    amplify such last-bit differences: seed 0 gives warm-up -> DISA held-out Mean@8 0.050 -> 0.071
    with 1 thread and 0.125 -> 0.154 with 2. The 64-wide model gains little from more threads (seed 1
    on a loaded 2-core machine: 13 s with 1 thread, 20 s with 2)."""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.curve_every < 1:
            raise ValueError(f"curve_every must be >= 1, got {self.curve_every}")
        unknown = set(self.methods) - {"grpo", "flowrl", "disa"}
        if unknown:
            raise ValueError(f"unknown demo methods {sorted(unknown)}; use grpo, flowrl, disa")

    @property
    def is_tiny(self) -> bool:
        return self.model == "tiny" or self.model.startswith("tiny:")

    @classmethod
    def quick(cls, **kw) -> DemoConfig:
        base = dict(n_train=60, n_eval=30, sft_steps=150, rl_steps=15, prompts_per_step=4, num_generations=8, eval_k=8)
        base.update(kw)
        return cls(**base)


refuse_old_names(DemoConfig, "DemoConfig", {"beta": "tilt_beta"}, common=False)

#: budget changes applied by ``tiltlab llm demo --model NAME`` for a pretrained model: no SFT
#: warm-up, learning rates for pretrained weights, completions long enough for an instruct answer.
REAL_MODEL_OVERRIDES = dict(
    sft_steps=0, rl_lr=1e-6, tb_lr=1e-6, max_new_tokens=48, n_train=16, n_eval=16, prompts_per_step=2, eval_k=4
)
