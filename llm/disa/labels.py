"""DISA Stage 3 must train on the target Stage 1 labelled: the compatibility check between the
Stage-1 manifest (:mod:`tiltlab.llm.disa.stage1`) and the Stage-3 residual's settings.

DISA eq. (10) subtracts ``beta * r~`` and uses ``log pi_theta - log pi_ref`` on the scale the
labels ``log Z_hat = LSE(log pi_ref + beta r~ - log q) - log M`` were computed on (eqs. 7-8), for
the prompt string the labels were computed on. Any difference makes ``sg(log Z_psi)`` the
log-partition of a different target.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["RENAMED_MANIFEST_KEYS", "LabelMismatchError", "check_label_compat", "upgrade_manifest"]


class LabelMismatchError(ValueError):
    """Stage-1 labels and the Stage-3 residual disagree (reward transform, tilt_beta, or log-prob scale)."""


#: a manifest's keys before the tilt was named ``tilt_beta`` everywhere (old -> new); :func:`upgrade_manifest`
#: renames them, so a Stage 1 written before resumes and is read as one written now
RENAMED_MANIFEST_KEYS = {"beta": "tilt_beta"}


def upgrade_manifest(manifest: dict) -> dict:
    """``manifest`` with the old key names renamed (:data:`RENAMED_MANIFEST_KEYS`) at its top level and in its
    ``identity``, ``config`` and ``summary``; a manifest with the new names is returned as it is."""
    out = dict(manifest)
    for part in (None, "identity", "config", "summary"):
        node = out if part is None else out.get(part)
        if not isinstance(node, dict):
            continue
        node = dict(node)
        for old, new in RENAMED_MANIFEST_KEYS.items():
            if old in node and new not in node:
                node[new] = node.pop(old)
        if part is None:
            out = node
        else:
            out[part] = node
    return out


def _recorded_settings(recorded: dict[str, Any]) -> dict[str, Any]:
    """Normalize a Stage-1 manifest (``llm.disa.stage1``'s ``manifest.json``, format ``tiltlab.stage1/1``,
    or a flat dict) to ``{tilt_beta, reward_transform, logprob_scale}``.

    ``tiltlab.stage1/1`` labels are trajectory-level by construction (``log w = log pi_ref(y|x)
    + beta r~ - log q(y|x)`` with masked-SUM sequence log-probs), so ``logprob_scale = "sum"`` is
    implied by that format when the manifest does not state it.
    """
    out: dict[str, Any] = {}
    recorded = upgrade_manifest(recorded)
    if "tilt_beta" in recorded:
        out["tilt_beta"] = float(recorded["tilt_beta"])
    rt = recorded.get("reward_transform")
    if isinstance(rt, dict):
        name = rt.get("name", "affine")
        out["reward_transform"] = (
            (name, float(rt.get("a", 1.0)), float(rt.get("c", 0.0))) if name == "affine" else (name,)
        )
    elif rt is not None:
        out["reward_transform"] = ("affine", 1.0, 0.0) if rt == "identity" else (str(rt),)
    if "logprob_scale" in recorded:
        out["logprob_scale"] = str(recorded["logprob_scale"])
    elif str(recorded.get("format", "")).startswith("tiltlab.stage1/"):
        out["logprob_scale"] = "sum"
    config = recorded.get("config")
    if "chat_template" in recorded:
        out["chat_template"] = bool(recorded["chat_template"])
    elif isinstance(config, dict) and "chat_template" in config:
        out["chat_template"] = bool(config["chat_template"])
    return out


def check_label_compat(
    recorded: dict[str, Any] | None,
    *,
    tilt_beta: float,
    reward_transform: tuple,
    logprob_scale: str,
    chat_template: bool | None = None,
    allow_mismatch: bool = False,
    reason: str | None = None,
) -> list[str]:
    """Check that the Stage-3 residual uses what Stage 1 used for its labels.

    DISA eq. (10) subtracts ``beta * r~`` and uses ``log pi_theta - log pi_ref`` on the scale the
    labels ``log Z_hat = LSE(log pi_ref + beta r~ - log q) - log M`` were computed on (eqs. 7-8):
    trajectory-level (``"sum"``) labels with a length-normalized (``"mean"``) residual, another
    ``beta`` or another reward transform make ``sg(log Z_psi)`` the log-partition of a different
    target. ``recorded`` is Stage 1's manifest (see :func:`_recorded_settings`);
    ``reward_transform`` is ``("affine", a, c)`` or ``("group_norm",)``; ``chat_template`` (when
    given and recorded) is whether the trained prompts are chat-templated
    (:func:`tiltlab.llm.base.prompts.training_prompt`).

    Returns the list of mismatches (empty when consistent). Raises :class:`LabelMismatchError`
    unless ``allow_mismatch`` is set together with a ``reason``.
    """
    if recorded is None:
        problems = ["Stage-1 manifest not given: cannot check tilt_beta / reward transform / log-prob scale"]
    else:
        got = _recorded_settings(recorded)
        want = {
            "tilt_beta": float(tilt_beta),
            "reward_transform": tuple(reward_transform),
            "logprob_scale": logprob_scale,
        }
        problems = []
        for key, val in want.items():
            if key not in got:
                problems.append(f"Stage 1 did not record {key!r}")
            elif key == "tilt_beta" and not math.isclose(got[key], val, rel_tol=1e-9):
                problems.append(f"tilt_beta: Stage 1 used {got[key]!r}, Stage 3 uses {val!r}")
            elif key != "tilt_beta" and got[key] != val:
                problems.append(f"{key}: Stage 1 used {got[key]!r}, Stage 3 uses {val!r}")
        if chat_template is not None and "chat_template" in got and got["chat_template"] != bool(chat_template):
            problems.append(
                f"chat_template: Stage 1 labelled {'chat-templated' if got['chat_template'] else 'raw'} prompts, "
                f"Stage 3 trains on {'chat-templated' if chat_template else 'raw'} ones"
            )
        if want["reward_transform"][0] == "group_norm":
            problems.append("a group-normalized reward is a per-batch plug-in, not the fixed transform the labels used")
    if problems and not allow_mismatch:
        raise LabelMismatchError(
            "DISA Stage 3 must use the reward transform, tilt_beta, log-prob scale and prompt format of the Stage-1 labels "
            "(e.g. trajectory-level labels with a length-normalized residual, or another beta, make log Z_psi the "
            "log-partition of a different target): "
            + "; ".join(problems)
            + ". Set disa_allow_label_mismatch=True with disa_mismatch_reason='...' to override."
        )
    if problems and not reason:
        raise LabelMismatchError(
            "disa_allow_label_mismatch=True needs disa_mismatch_reason explaining why: " + "; ".join(problems)
        )
    return problems
