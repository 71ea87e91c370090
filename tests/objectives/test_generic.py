"""Generic checks (``tests/objectives/_generic.py``) over every objective entry (``tests/objectives/opinfo.py``)."""

import pytest

from tests.objectives._generic import CHECKS, applicable
from tests.objectives.opinfo import OPS

CASES = [(op, check) for op in OPS for check in sorted(CHECKS) if applicable(op, check)]


@pytest.mark.parametrize(("op", "check"), CASES, ids=[f"{op.name}-{check}" for op, check in CASES])
def test_generic(op, check):
    CHECKS[check](op)


def test_every_public_objective_has_an_entry():
    """Adding a public objective to ``tiltlab.objectives`` without an entry fails here."""
    import tiltlab.objectives as O

    covered = {op.fn.__name__ for op in OPS} | {op.name.split("[")[0].split(".")[1] for op in OPS}
    not_objectives = {
        # non-differentiable helpers, classes and data: tested in their own modules
        "Divergence",
        "F_DIVERGENCES",
        "get_divergence",
        "lad_target_logprobs",
        "aggregate",
        "normalized_weights",
        "select_prompts",
        "top_priority",
        "ReplayBuffer",
        "SequenceOptions",  # the GRPO family's shared keyword options (TypedDicts)
        "KlOptions",
        "AggOptions",
        "PolicyOptions",
        "PartitionRegressor",
        "FitResult",
        "fit_regressor",
        "r2_score",
        "pass_at_k",
        "mean_at_k",
        "distinct_n",
        # distances between distributions (no gradient taken through them): tests/objectives/test_tv_distance.py
        "tv_distance",
        "total_variation",
        "group_normalized_reward",
        # logged diagnostics (no gradient is taken through them): tested in test_trainer_math.py
        "weight_clip_fraction",
        "sequence_kl_old",
        "pearson",
        "spearman",
        # the TB residuals' logged statistics: tests/llm/train/test_health.py (against plain computations)
        "residual_stats",
        "flip_stats",
        # the return type of every loss: tests/objectives/test_loss_output.py
        "LossOutput",
        # the registry of objective adapters (each entry calls a loss with an entry): test_registry.py
        "OBJECTIVES",
        "Objective",
        "ObjectiveBatch",
        "get_objective",
        "names",
        "registered",
        # the declaration of every objective (objectives/catalog.py): test_declared_objective.py, test_registry.py
        "FAMILIES",
        "RENAMED",
        "SPECS",
        "TAGS",
        "TB_OPTIONS",
        "TRAINERS",
        "Option",
        "Spec",
        "options_dataclass",
        "renamed",
        # the objectives' own knobs (Spec.knobs) and their fields: test_catalog_knobs.py
        "LAD_DIVERGENCES",
        "check_knobs",
        "knob_fields",
        "section_keys",
    }
    import importlib
    import pkgutil

    # every public module of the package (``fused`` has its own naive-reference suite: test_fused.py)
    modules = [
        importlib.import_module(f"tiltlab.objectives.{m.name}")
        for m in pkgutil.iter_modules(O.__path__)
        if not m.name.startswith("_") and m.name != "fused"
    ]
    public = {n for mod in modules for n in mod.__all__}
    missing = public - covered - not_objectives
    assert not missing, f"objectives without an OpInfo entry: {sorted(missing)}"


def test_lad_generators_match_theory():
    """The torch generators of ``objectives.lad`` equal the sympy ones of ``theory.lad`` (LAD Table 5)."""
    from tests.objectives._generic import check_generators_match
    from tiltlab.objectives import lad
    from tiltlab.theory import lad as theory_lad

    check_generators_match(theory_lad.F_DIVERGENCES, lad.F_DIVERGENCES)
