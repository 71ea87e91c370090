"""``python -m tiltlab.paper_checks.report --papers-md > docs/papers.md``."""

import sys

from tiltlab.paper_checks.report.papers import render_papers_markdown

if sys.argv[1:] != ["--papers-md"]:
    sys.exit("usage: python -m tiltlab.paper_checks.report --papers-md > docs/papers.md")
sys.stdout.write(render_papers_markdown())
