# The judge started as its own interpreter, run by path: python -I -B -S <this file> <fd>. Its configuration
# comes from <fd>; then the judge's program (judge.py, beside this file) runs in this module's globals with the
# codec (codec.py) compiled for it. A judge forked by the judge server (judge_server.py) gets both from it.
import json
import os
import sys


def _compiled(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    with open(path, encoding="utf-8") as f:
        return compile(f.read(), path, "exec")


_f = os.fdopen(int(sys.argv[1]), "rb")
cfg = json.loads(_f.read())
_f.close()
del _f
_CODEC = _compiled("codec.py")
_JUDGE = _compiled("judge.py")
del _compiled
exec(_JUDGE, globals())  # ends in os._exit
