"""DISA's stages: Stage 1 (:mod:`~tiltlab.llm.disa.stage1`, importance-sampled log-Z labels), Stage 2
(:mod:`~tiltlab.llm.disa.stage2`, the prompt regressor that amortises them), and what Stage 3's training
reads from them: the label checks (:mod:`~tiltlab.llm.disa.labels`) and the log-Z head
(:mod:`~tiltlab.llm.disa.logz_head`, also FlowRL's learned log Z). Stage 3 itself is the trainer
(:mod:`tiltlab.llm.train`) with ``objective="disa"``.

Import-light: ``import tiltlab.llm.disa`` imports no submodule.
"""
