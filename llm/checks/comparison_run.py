"""The real-model comparison's sittings: ``python -m tiltlab.llm.checks.comparison_run run --phase tune
--shard 0/3`` runs one shard and stores each finished run with its commit, date and machine; ``status``
says what the store holds (:func:`tiltlab.llm.checks.real_comparison.main`). A module of its own: run as
``__main__``, ``real_comparison`` would register its checks a second time beside the package's import of it."""

from __future__ import annotations

import sys

from tiltlab.llm.checks.real_comparison import main

if __name__ == "__main__":
    sys.exit(main())
