"""The programs the sandbox runs, as the source text each interpreter is started with (``python -c``).

Each is a file beside this one, read at import: ``boot.py`` (the candidate's bootstrap), ``judge_head.py`` +
``judge.py`` (the judge started as its own interpreter), ``judge.py`` alone (the judge the judge server
forks, which gets ``cfg`` from the server) and ``judge_server.py``; ``codec.py``, the wire format of both
sides, is not run alone: its text takes the place of the block between ``# >>> codec`` and ``# <<< codec``
in ``boot.py`` and ``judge.py``, so its functions share each program's globals, as one program's would.
A block between ``# >>> static`` and ``# <<< static`` is there for static checkers only and is dropped,
and in ``boot.py`` the names ``RC_MEMORY``, ``RC_BLOCKED`` and ``SCRIPT`` become the values of
:mod:`..config`. The text is passed with ``-c``, not run by path: the sandboxed file system holds only
``/usr`` and the interpreter's prefixes, and the judge server's command line is how the hostile corpus
tells it apart (``# tiltlab judge server``).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..config import RC_BLOCKED, RC_MEMORY, SCRIPT

DIR = Path(__file__).resolve().parent
"""The folder of the program files."""

_BLOCK = re.compile(r"^# >>> (static|codec)\b[^\n]*\n.*?^# <<< \1\n", re.M | re.S)
_CONSTANTS = {"RC_MEMORY": str(RC_MEMORY), "RC_BLOCKED": str(RC_BLOCKED), "SCRIPT": repr(SCRIPT)}


def _text(name: str, codec: str = "", constants: dict[str, str] | None = None) -> str:
    """The file ``name`` as it runs: static blocks dropped, each name of ``constants`` (whole words) replaced
    by its value, then ``codec`` in place of the codec block."""
    text = (DIR / name).read_text(encoding="utf-8")
    text = _BLOCK.sub(lambda m: "" if m.group(1) == "static" else m.group(0), text)
    for word, value in (constants or {}).items():
        text, n = re.subn(rf"\b{word}\b", value, text)
        if n == 0:
            raise RuntimeError(f"sandbox: {name} does not use {word}")
    text = _BLOCK.sub(lambda m: codec, text)
    if "# >>> " in text or "# <<< " in text:
        raise RuntimeError(f"sandbox: {name}: a '# >>>' block without its '# <<<' end")
    return text


_CODEC = _text("codec.py")
"""The wire format shared by the candidate's server and the judge (stdlib only, exact types)."""

_BOOT = _text("boot.py", _CODEC, _CONSTANTS)
"""The candidate's bootstrap: ``python -I -B -c _BOOT <fd>`` reads its config and the program from ``<fd>``."""

_JUDGE_HEAD = _text("judge_head.py")
"""The judge started as its own interpreter (``python -c _JUDGE <fd>``): its configuration from a pipe."""

_JUDGE_BODY = _text("judge.py", _CODEC)
"""The judge's program, given ``cfg`` (its limits, the tests, the pipes to the candidate)."""

_JUDGE = _JUDGE_HEAD + _JUDGE_BODY

_ZYGOTE = _text("judge_server.py")
"""The judge server's program (``python -c _ZYGOTE <socket> <boot fd>``): imports, path set-up and the
compiled judge once; per request (six descriptors over a Unix socket: the run's reply socket, the pipe its
``cfg`` comes through, the pipes to and from the candidate, the verdict pipe, stderr) a ``fork`` whose child
is the judge; the reply socket gets the judge's pid and a pidfd, then its exit status."""
