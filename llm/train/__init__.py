"""Training on TRL + accelerate: the online trainer (every objective of ``objectives/`` on
``GRPOTrainer``), the offline FPA-setting trainer (``transformers.Trainer``), the learned log Z
head, the run configuration and callbacks.

Import-light: submodules import torch / TRL; import them where needed
(``llm.train.online``, ``llm.train.offline``, ``llm.train.config``).
"""
