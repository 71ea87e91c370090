"""Stage 1's output folder: the manifest (written atomically and fsynced), the run's identity, and reading a
finished run back."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiltlab.files import write_json
from tiltlab.llm.base import learning_signal as ls
from tiltlab.llm.disa.labels import upgrade_manifest
from tiltlab.llm.disa.stage1.config import _HF_IDENTITY, _IDENTITY_FIELDS, _VLLM_IDENTITY, MANIFEST, Stage1Config

# ---------------------------------------------------------------------------------------------
# atomic files
# ---------------------------------------------------------------------------------------------


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Stage 1's JSON files (manifest, config): sorted keys, indent 2, written atomically and fsynced
    (:func:`tiltlab.files.write_json`)."""
    write_json(path, obj, indent=2, sort_keys=True, fsync=True)


def _prompts_hash(ids: Sequence[str], prompts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for i, p in zip(ids, prompts):
        h.update(str(i).encode() + b"\x1f" + p.encode() + b"\x1e")
    return h.hexdigest()


def _identity(cfg: Stage1Config, reward_name: str, ids, rows, device: str) -> dict[str, Any]:
    identity = {k: getattr(cfg, k) for k in _IDENTITY_FIELDS}
    identity["reward"] = reward_name
    identity["prompts_sha256"] = _prompts_hash(ids, [r["prompt"] for r in rows])
    identity["device"] = device.split(":")[0]  # samplers draw different streams on cpu and cuda
    for k in _HF_IDENTITY:
        identity[k] = getattr(cfg, k) if cfg.engine == "hf" else None
    for k in _VLLM_IDENTITY:
        identity[k] = getattr(cfg, k) if cfg.engine == "vllm" else None
    return identity


def load_stage1(out_dir: str | Path):
    """``(samples, labels)`` pyarrow Tables of the shards recorded in the manifest (files of an
    unrecorded, interrupted shard are ignored). Raises on duplicate (prompt_id, sample_idx)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    man_path = out / MANIFEST
    if not man_path.exists():
        raise FileNotFoundError(f"no Stage 1 manifest at {man_path}")
    manifest = json.loads(man_path.read_text())
    shards = [manifest["shards"][k] for k in sorted(manifest["shards"], key=int)]
    if not shards:
        raise ValueError(f"{out} has no finished shard")
    samples = pa.concat_tables([pq.read_table(out / s["samples"]) for s in shards])
    labels = pa.concat_tables([pq.read_table(out / s["labels"]) for s in shards])
    keys = list(zip(samples.column("prompt_id").to_pylist(), samples.column("sample_idx").to_pylist()))
    if len(set(keys)) != len(keys):
        raise ValueError(f"{out}: duplicate (prompt_id, sample_idx) rows")
    pids = labels.column("prompt_id").to_pylist()
    if len(set(pids)) != len(pids):
        raise ValueError(f"{out}: duplicate prompt_id labels")
    return samples, labels


def read_manifest(out_dir: str | Path) -> dict:
    return upgrade_manifest(json.loads((Path(out_dir) / MANIFEST).read_text()))


def _summary(labels, cfg: Stage1Config) -> dict:

    def mean(col):
        v = [x for x in labels.column(col).to_pylist() if x is not None and math.isfinite(x)]
        return sum(v) / len(v) if v else float("nan")

    lz = labels.column("log_z").to_pylist()
    return {
        "n_prompts": labels.num_rows,
        "M": cfg.M,
        "tilt_beta": cfg.tilt_beta,
        "mean_log_z": mean("log_z"),
        "mean_log_z_bias_corrected": mean("log_z_bias_corrected"),
        "mean_delta_bias": mean("delta_bias"),
        "mean_ess": mean("ess"),
        "mean_max_weight": mean("max_weight"),
        "frac_prompts_with_reward": sum(1 for n in labels.column("n_reward_bearing").to_pylist() if n > 0)
        / max(1, labels.num_rows),
        "n_nonfinite_labels": sum(1 for x in lz if not math.isfinite(x)),
    }


def _signal_record(samples, labels, cfg: Stage1Config) -> list[dict]:
    """The vacuous-run conditions of :mod:`tiltlab.llm.base.learning_signal` on all recorded shards: all
    rewards of the dataset equal, and a degenerate ESS (equal weights or one sample on every prompt)."""

    rewards = samples.column("reward_raw").to_pylist()
    scope = f"dataset ({labels.num_rows} prompts x {cfg.M} samples)"
    return ls.report(
        [
            ls.equal_rewards(rewards, stage="stage1", scope=scope),
            ls.degenerate_ess(labels.column("ess").to_pylist(), cfg.M, stage="stage1"),
        ],
        stacklevel=3,
    )
