"""tiltlab: distribution-matching RL for LLMs (console entry point lives in :mod:`tiltlab.cli`)."""

__version__ = "0.1.0"
