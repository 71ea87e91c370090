"""The ``llm_scale`` checks: one per claim with an ``llm_command`` (out of reach on a CPU); its table's
averages are checked against their cells, and its command against ``configs/`` and the run-config schema."""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tiltlab.claims.registry import (
    CheckResult,
    Verdict,
    get_claim,
)

from .tables import average_problems

#: ``configs/`` at the repository root (absent in a wheel install: then nothing is checked).
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
_CONFIG_RE = re.compile(r"configs/[A-Za-z0-9_.\-]+\.ya?ml")

#: Verdicts the ``llm_scale`` checks are known to return where it is not ``out_of_reach``. Empty:
#: a table whose printed average disagrees with its own cells is a printing error, registered as its
#: own claim of kind ``typo`` (:data:`TYPO_CLAIMS`), not as a partial verdict on the claim it sits in.
EXPECTED_LLM_SCALE: dict[str, Verdict] = {}

#: LLM-scale claim -> the ``typo`` claim that records its table's inconsistent average(s). The
#: ``llm_scale`` check of such a claim stays ``out_of_reach`` and names the typo claim; an
#: inconsistent average in a table *not* listed here makes the check return ``partly`` (a change).
TYPO_CLAIMS: dict[str, str] = {
    "lad.table3.backbones": "lad.typo.table3_average",
    "lad.table7.pass32_qwen2.5_7b": "lad.typo.table7_average",
}


def config_problems(command: str, config_dir: Path | None = None) -> list[str]:
    """Configs named in ``command`` that are missing, once ``configs/`` holds any config."""
    config_dir = CONFIG_DIR if config_dir is None else config_dir
    if not config_dir.is_dir() or not any(config_dir.glob("*.y*ml")):
        return []  # no configs (e.g. a wheel install): nothing to compare with
    root = config_dir.parent
    return sorted({m for m in _CONFIG_RE.findall(command) if not (root / m).is_file()})


_LLM_SUBCOMMANDS = ("train", "eval", "stage1", "stage2")


def command_problems(command: str, config_dir: Path | None = None) -> tuple[int, list[str]]:
    """Parse ``tiltlab llm <sub> --config FILE [--set k=v ...]`` commands joined by ``&&``; when
    the configs exist and the llm layer's config schema is importable, load each config with
    its ``--set`` overrides (unknown keys and bad objectives are errors there).

    Returns ``(configs validated against the schema, problems)``.
    """
    config_dir = CONFIG_DIR if config_dir is None else config_dir
    problems: list[str] = []
    parsed = []
    for part in command.split("&&"):
        toks = shlex.split(part)
        if toks[:2] != ["tiltlab", "llm"] or len(toks) < 3 or toks[2] not in _LLM_SUBCOMMANDS:
            problems.append(f"not a 'tiltlab llm {{{'|'.join(_LLM_SUBCOMMANDS)}}} ...' command: {part.strip()!r}")
            continue
        if "--config" not in toks or toks.index("--config") + 1 >= len(toks):
            problems.append(f"no --config in {part.strip()!r}")
            continue
        sets = [toks[i + 1] for i, t in enumerate(toks[:-1]) if t == "--set"]
        parsed.append((toks[toks.index("--config") + 1], sets))
    if problems or not config_dir.is_dir() or not any(config_dir.glob("*.y*ml")):
        return 0, problems
    n = 0
    for cfg, sets in parsed:
        path = config_dir.parent / cfg
        if not path.is_file():
            continue  # reported by config_problems
        err = _schema_error(str(path), tuple(sets))
        if err:
            problems.append(f"{cfg} {' '.join('--set ' + x for x in sets)}: {err}")
        else:
            n += 1
    return n, problems


@functools.cache
def _schema_error(path: str, sets: tuple[str, ...]) -> str | None:
    """Load one config with overrides through the llm layer's schema; the error text or None. The
    schema and its YAML reader are part of the base install (``pyyaml``; :mod:`tiltlab.llm.base.run_config`
    imports nothing else): a schema that cannot be imported is an error of the check, never a count of 0."""
    try:
        # imported here, not at the top: only the checks of claims with a `tiltlab llm ...` command need it
        from tiltlab.llm.train.config import load_run_config

        load_run_config(path, list(sets), validate=False)
    except ImportError as exc:
        raise RuntimeError(
            f"the run-config schema (tiltlab.llm.train.config) cannot be imported: {exc}; "
            "`pip install -e .` installs what it needs (pyyaml)"
        ) from exc
    except Exception as exc:  # the schema's own message names the bad key / value
        return f"{type(exc).__name__}: {exc}"
    return None


def _flatten(pn: Mapping[str, Any], prefix: str = "") -> dict[str, float | int | str | bool]:
    out: dict[str, float | int | str | bool] = {}
    cols = pn.get("columns")
    for k, v in pn.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            if cols and all(isinstance(r, list) and len(r) == len(cols) for r in v.values()):
                for rn, r in v.items():
                    for c, x in zip(cols, r):
                        out[f"{key}|{rn}|{c}"] = x
            else:
                out.update(_flatten(v, key + "."))
        elif isinstance(v, list):
            if all(isinstance(x, (int, float, str, bool)) for x in v) and k != "source_claims":
                out[key] = ", ".join(str(x) for x in v)
        elif isinstance(v, (int, float, str, bool)):
            out[key] = v
    return out


def _short_cmd(cmd: str) -> str:
    parts = [p.strip() for p in cmd.split("&&")]
    return parts[-1] + (f" (+{len(parts) - 1} more commands)" if len(parts) > 1 else "")


# --------------------------------------------------------------------------- llm_scale


def llm_scale_check(claim_id: str) -> Callable[[int], CheckResult]:
    """The ``llm_scale`` check of one claim (see the module docstring)."""

    def check(seed: int) -> CheckResult:
        c = get_claim(claim_id)
        if not c.llm_command or not c.llm_command.startswith("tiltlab llm "):
            raise ValueError(f"{claim_id}: llm_command must be a 'tiltlab llm ...' command, got {c.llm_command!r}")
        if not c.paper_numbers:
            raise ValueError(f"{claim_id}: an LLM-scale claim must record the paper's numbers (paper_numbers)")
        missing = config_problems(c.llm_command)
        if missing:
            raise ValueError(f"{claim_id}: llm_command names configs that do not exist: {missing}")
        n_cfg, bad = command_problems(c.llm_command)
        if bad:
            raise ValueError(f"{claim_id}: llm_command does not match the llm layer: {bad[:3]}")
        numbers: dict[str, Any] = dict(_flatten(c.paper_numbers))
        numbers["configs_validated"] = n_cfg
        n_rows, worst, problems = average_problems(c.paper_numbers)
        numbers.update(
            avg_rows_checked=n_rows, avg_max_abs_dev=round(worst, 4), n_commands=c.llm_command.count("&&") + 1
        )
        n_meta = 4  # configs_validated, avg_rows_checked, avg_max_abs_dev, n_commands
        if problems and claim_id not in TYPO_CLAIMS:
            return CheckResult(
                Verdict.PARTLY,
                f"paper table internally inconsistent ({len(problems)} of {n_rows} averages): "
                + "; ".join(problems[:3]),
                numbers,
            )
        avg_note = (
            f"{len(problems)} of {n_rows} printed averages inconsistent (a printing error: {TYPO_CLAIMS[claim_id]})"
            if problems
            else (
                f"averages consistent ({n_rows} rows, max dev {worst:.3f})"
                if n_rows
                else "no average column to cross-check"
            )
        )
        return CheckResult(
            Verdict.OUT_OF_REACH,
            f"LLM-scale, not run on CPU; {len(numbers) - n_meta} paper numbers recorded, {avg_note}, "
            f"{n_cfg} config(s) validated; run: {_short_cmd(c.llm_command)}",
            numbers,
        )

    check.__name__ = f"llm_scale_{claim_id.replace('.', '_')}"
    return check


#: Claims the papers state without numbers that llm/ can re-measure (method not implemented, no table):
#: their ``llm_scale`` check says why and returns ``out_of_reach``.
NOT_REPRODUCIBLE: dict[str, str] = {
    "paced.s52.ds_lilo_code": "DS and LILO are not implemented in llm/ and the paper prints no code numbers for them",
}


def _not_reproducible(claim_id: str) -> Callable[[int], CheckResult]:
    def check(seed: int) -> CheckResult:
        get_claim(claim_id)
        return CheckResult(Verdict.OUT_OF_REACH, f"LLM-scale, nothing to re-measure: {NOT_REPRODUCIBLE[claim_id]}")

    check.__name__ = f"not_reproducible_{claim_id.replace('.', '_')}"
    return check
