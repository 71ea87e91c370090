"""``import tiltlab.objectives`` keeps torch its only heavy import (no LLM library is loaded)."""

import subprocess
import sys


def test_import_objectives_loads_no_llm_library():
    code = (
        "import sys, tiltlab.objectives, tiltlab.objectives.fused;"
        "heavy = [m for m in ('transformers', 'trl', 'vllm', 'accelerate', 'datasets', 'peft', 'sympy', 'matplotlib')"
        " if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"objectives imported: {out.stdout.strip()}"
