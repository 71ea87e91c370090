"""The veRL worker and task runner that install :func:`~tiltlab.llm.verl.tb.tb_loss_fn`, the DISA data
step (:func:`verl_rows`, :func:`prepare`), the math reward (:func:`compute_score`) and the entry
point (:func:`main`, ``python -m tiltlab.llm.verl``)."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import Tensor

from tiltlab.hints import hint
from tiltlab.llm.base.data import load_prompts
from tiltlab.llm.base.rewards import math_reward
from tiltlab.llm.disa.labels import check_label_compat
from tiltlab.llm.train.cli import _disa_predictor
from tiltlab.llm.train.config import load_run_config

from .tb import LOG_Z_KEY, TBSettings, tb_loss_fn, use_log_z_engine


# ------------------------------------------------------------------------ worker and entry point
def worker_class() -> type:
    """veRL's engine ``ActorRolloutRefWorker`` with the actor loss replaced by :func:`tb_loss_fn`
    (settings from ``actor_rollout_ref.tiltlab``); for ``flowrl`` / ``paced`` its engine is
    :func:`log_z_engine_class` (the learned head). Imported inside Ray workers: it needs a GPU
    (veRL has no CPU engine)."""
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class TiltlabActorRolloutRefWorker(ActorRolloutRefWorker):  # type: ignore[misc, valid-type]
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self) -> None:
            settings = TBSettings.from_config(self.config.get("tiltlab"))
            if settings.objective != "disa":
                use_log_z_engine(settings)
            super().init_model()
            if "actor" in self.role:
                actor_config = self.loss_fn.keywords["config"]
                self.loss_fn = partial(tb_loss_fn, config=actor_config, settings=settings)
                self.actor.set_loss_fn(self.loss_fn)

    return TiltlabActorRolloutRefWorker


def _task_runner() -> Any:
    """veRL's (v0) TaskRunner that places :func:`worker_class` as the actor/rollout/ref worker."""
    import ray
    from verl.trainer.main_ppo_v0 import TaskRunner

    base = TaskRunner.__ray_actor_class__  # veRL's TaskRunner is already a Ray actor class: subclass its class

    class TiltlabTaskRunner(base):  # type: ignore[misc, valid-type]
        def add_actor_rollout_worker(self, config: Any) -> Any:
            _, group_cls = super().add_actor_rollout_worker(config)
            cls = worker_class()
            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(cls)
            return cls, group_cls

    return ray.remote(num_cpus=1)(TiltlabTaskRunner)


def verl_rows(
    rows: list[dict[str, Any]], log_z: Tensor | list[float] | None = None, data_source: str = "tiltlab_math"
) -> list[dict[str, Any]]:
    """tiltlab prompt rows (``{id, prompt, answer}``, :func:`tiltlab.llm.base.data.load_prompts`) -> rows of
    veRL's RL dataset: ``data_source`` (a label; the reward is :func:`compute_score`, set as veRL's
    custom reward function), ``prompt`` as one user message, ``reward_model.ground_truth``, and
    ``extra_info`` with the row's index, id and, given ``log_z`` ``[N]``, DISA's frozen label
    (veRL keeps ``extra_info`` with each completion from the dataset to the actor update)."""
    if log_z is not None:
        z = torch.as_tensor(log_z, dtype=torch.float64).reshape(-1)
        if z.shape != (len(rows),):
            raise ValueError(f"log_z must hold one value per row ({len(rows)}), got {tuple(z.shape)}")
        if not bool(torch.isfinite(z).all()):
            raise ValueError("log_z must be finite for every row")
    out = []
    for i, r in enumerate(rows):
        if "prompt" not in r or "answer" not in r:
            raise ValueError(f"rows[{i}] must have 'prompt' and 'answer', got keys {sorted(r)}")
        extra: dict[str, Any] = {"index": i, "id": str(r.get("id", i))}
        if log_z is not None:
            extra[LOG_Z_KEY] = float(z[i])
        out.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": str(r["prompt"])}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(r["answer"])},
                "extra_info": extra,
            }
        )
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """tiltlab's math reward as veRL's custom reward function (``reward.custom_reward_function.path=
    pkg://tiltlab.llm.verl``, ``name=compute_score``): :func:`tiltlab.llm.base.rewards.math_reward`, 1 iff the
    last boxed answer equals ``ground_truth`` (math-verify), else 0 -- the reward Stage 1 labelled with.
    veRL's built-in ``math_dapo`` scorer gives -1 / 1 instead, another reward transform than the labels'."""

    (r,) = math_reward([""], [solution_str], answer=[ground_truth])
    return float(r or 0.0)


def prepare(config: str, out: str, data_source: str = "tiltlab_math") -> int:  # pragma: no cover - loads models
    """The DISA data step: the tiltlab run config's dataset, labelled by its Stage-2 regressor
    (``disa.stage2_dir``; checked against Stage 1's manifest as the TRL trainer checks it), written
    as a veRL parquet with the label in ``extra_info``. Returns the number of rows."""

    cfg = load_run_config(config)
    d = cfg.disa
    log_z_fn, manifest = _disa_predictor(cfg)
    check_label_compat(
        manifest,
        tilt_beta=float(cfg.tilt_beta_value),
        reward_transform=("affine", float(d.get("reward_scale", 1.0)), float(d.get("reward_shift", 0.0))),
        logprob_scale=str(d.get("logprob_scale") or "sum"),
        chat_template=True,
    )
    rows = load_prompts(cfg.dataset)
    log_z = log_z_fn([[{"role": "user", "content": r["prompt"]}] for r in rows])
    table = pa.Table.from_pylist(verl_rows(rows, log_z, data_source))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return len(rows)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - launches a Ray cluster on GPUs
    """``python -m tiltlab.llm.verl prepare --config <tiltlab run config> --out <parquet>`` (the DISA data
    step), or ``python -m tiltlab.llm.verl --config-path <abs dir> --config-name <name> [overrides]``:
    veRL's ``main_ppo`` with the tiltlab worker (``configs/verl/``, ``docs/verl.md``)."""

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["prepare"]:
        ap = argparse.ArgumentParser(prog="python -m tiltlab.llm.verl prepare")
        ap.add_argument("--config", required=True, help="the tiltlab run config (configs/disa_*.yaml)")
        ap.add_argument("--out", required=True, help="the veRL parquet to write")
        ap.add_argument("--data-source", default="tiltlab_math", help="the rows' data_source label")
        a = ap.parse_args(args[1:])
        print(f"wrote {prepare(a.config, a.out, a.data_source)} rows to {a.out}")
        return

    try:  # veRL's GPU stack, not the verl extra: one line naming the package instead of a traceback
        import hydra
        from verl.trainer.main_ppo import run_ppo
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0] or str(exc)
        package = {"hydra": "hydra-core"}.get(missing, missing)
        sys.exit(
            f"python -m tiltlab.llm.verl: error: veRL's trainer needs {missing}, which is not installed; "
            + hint("verl_stack", package=package)
        )

    @hydra.main(config_path=None, config_name=None, version_base=None)
    def _main(config: Any) -> None:
        if config.trainer.get("use_v1", False):
            raise ValueError("trainer.use_v1: the tiltlab worker runs on veRL's v0 trainer; set trainer.use_v1=false")
        TBSettings.from_config(config.actor_rollout_ref.get("tiltlab"))  # fail before Ray starts
        run_ppo(config, task_runner_class=_task_runner())

    sys.argv = [sys.argv[0], *args]
    _main()
