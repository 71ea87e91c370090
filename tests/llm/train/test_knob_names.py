"""One name per knob above the loss functions: the TB family's knobs (``catalog.TB_OPTIONS``) are
``TiltGRPOConfig``'s fields under the same names, defaults and help; a run config's objective sections take
the same names; the old spellings are refused in one line naming the new, from Python and from YAML."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tiltlab.llm.base.run_config import SECTION_KEYS, RunConfig
from tiltlab.objectives.catalog import RENAMED, TB_OPTIONS


def test_run_config_sections_take_the_declared_tb_names():
    for section in ("flowrl", "disa", "vargrad"):
        assert {o.name for o in TB_OPTIONS if o.name != "tilt_beta"} <= set(SECTION_KEYS[section])
        assert not set(SECTION_KEYS[section]) & set(RENAMED)
    assert RunConfig(model="tiny", objective="disa", disa={"logprob_scale": "mean"}).disa == {"logprob_scale": "mean"}


@pytest.mark.parametrize("old", ["length_normalize", "eps"])
def test_run_config_refuses_an_old_knob_name_naming_the_new(old):
    with pytest.raises(ValueError, match=re.escape(f"`{old}` is now `{RENAMED[old]}`")) as e:
        RunConfig(model="tiny", objective="disa", disa={old: False})
    assert "\n" not in str(e.value)


def test_trl_config_fields_are_the_declared_knobs(tmp_path):
    pytest.importorskip("trl")
    from tiltlab.llm.train.online import TiltGRPOConfig

    fields = {f.name: f for f in dataclasses.fields(TiltGRPOConfig)}
    for o in TB_OPTIONS:
        assert fields[o.name].default == o.default and fields[o.name].metadata["help"] == o.doc
    kw = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert TiltGRPOConfig(objective="flowrl", **kw).logprob_scale == "mean"
    assert TiltGRPOConfig(objective="disa", **kw).logprob_scale == "sum"
    assert TiltGRPOConfig(objective="flowrl", logprob_scale="sum", **kw).logprob_scale == "sum"
    with pytest.raises(TypeError, match="'length_normalize' is now logprob_scale"):
        TiltGRPOConfig(objective="disa", length_normalize=True, **kw)
    with pytest.raises(ValueError, match="weight_clip must be one of"):
        TiltGRPOConfig(objective="disa", weight_clip="none", **kw)
    with pytest.raises(ValueError, match="logprob_scale must be one of"):
        TiltGRPOConfig(objective="disa", logprob_scale="token", **kw)
