# The judge started as its own interpreter (python -I -B -S -c <judge_head.py + judge.py> <fd>): its
# configuration from a pipe. A judge forked by the judge server (judge_server.py) gets ``cfg`` from it instead.
import json
import os
import sys

_f = os.fdopen(int(sys.argv[1]), "rb")
cfg = json.loads(_f.read())
_f.close()
del _f
