"""Print one of the README's two quick-start commands, verbatim: `main` (the first ```bash block after
"Run the main job") or `tests` (the first after "Run the tests"). CI runs what this prints, so the
README cannot drift from what CI proves."""

import sys
from pathlib import Path

MARKERS = {"main": "Run the main job", "tests": "Run the tests"}


def command(which: str, readme: Path) -> str:
    text = readme.read_text(encoding="utf-8")
    at = text.index(MARKERS[which])
    start = text.index("```bash\n", at) + len("```bash\n")
    block = text[start : text.index("```", start)].strip()
    if not block or "\n" in block:
        raise SystemExit(f"README {which} command must be one line, got {block!r}")
    return block


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "main"
    if which not in MARKERS:
        raise SystemExit(f"usage: readme_command.py [{'|'.join(MARKERS)}]")
    print(command(which, Path(__file__).resolve().parents[1] / "README.md"))
