"""``python -m tiltlab.llm.verl``: :func:`tiltlab.llm.verl.runner.main`."""

from tiltlab.llm.verl.runner import main

main()
