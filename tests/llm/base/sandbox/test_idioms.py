"""Dataset idioms the code reward refused before issue 54, each next to its plain one-process reference.

Each case is a correct program in a common dataset idiom and its tests. The reference runs them the way a
plain harness does (the program and the tests in one ``python`` process, or ``python solution.py < input``
for stdio); the case is meaningful only if the reference passes. The reward (``resolve_reward("code")``, the
sandbox) must then pay it 1.0, and its wrong twin (one changed answer) 0.0.
"""

import json
import subprocess
import sys
import warnings

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux", allow_module_level=True)

from tiltlab.llm.base.rewards import resolve_reward

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")

_reward = resolve_reward("code")

_DEEP = (
    "import resource, sys\n"
    "resource.setrlimit(resource.RLIMIT_STACK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
    "sys.setrecursionlimit(10 ** 6)\n"
    "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
)
_PEP563 = (
    "from __future__ import annotations\n"
    "from dataclasses import dataclass, field, fields\n"
    "from typing import ClassVar\n"
    "@dataclass(order=True)\nclass Item:\n    weight: int\n    name: str = field(compare=False)\n"
    "    made: ClassVar[int] = 0\n"
)
_EXC = (
    "class InvalidInput(ValueError):\n    pass\n"
    "class TooLarge(InvalidInput):\n    pass\n"
    "def check_age(x):\n"
    "    if x < 0:\n        raise InvalidInput('negative')\n"
    "    if x > 150:\n        raise TooLarge('too large')\n"
    "    return x\n"
)
_EXC_TESTS = (
    "for bad, kind in ((-1, InvalidInput), (200, TooLarge)):\n"
    "    try:\n        check_age(bad)\n    except kind as e:\n        assert str(e) and isinstance(e, ValueError)\n"
    "    else:\n        raise AssertionError('no raise')\n"
    "try:\n    check_age(-5)\nexcept TooLarge:\n    raise AssertionError('the base class is not the subclass')\n"
    "except ValueError:\n    pass\n"
    "assert check_age(30) == 30\n"
)
_PLANET = (
    "import enum\nclass Planet(enum.Enum):\n    MERCURY = (3.303e23, 2.4397e6)\n    EARTH = (5.976e24, 6.37814e6)\n"
    "    def __init__(self, mass, radius):\n        self.mass = mass\n        self.radius = radius\n"
)
_MONEY = "class Money(float):\n    def cents(self):\n        return int(round(self * 100))\n"

#: name -> (the program, its tests, the wrong twin's program, code_prefix or None); the tests are Python
#: (assert mode, entry point f) unless they are a dict (stdio cases)
ASSERT_CASES = {
    "resource.setrlimit(RLIMIT_STACK) before deep recursion": (
        _DEEP + "def f(n):\n    return depth(n)\n",
        "assert f(50000) == 50000\n",
        _DEEP + "def f(n):\n    return depth(n) + 1\n",
    ),
    "@dataclass under from __future__ import annotations": (
        _PEP563 + "def f(pairs):\n    return sorted(Item(w, n) for n, w in pairs)\n",
        "r = f([('b', 2), ('a', 1)])\nassert [i.name for i in r] == ['a', 'b'] and r[0] < r[1]\n"
        "assert [x.name for x in __import__('dataclasses').fields(r[0])] == ['weight', 'name']\n",
        _PEP563 + "def f(pairs):\n    return sorted((Item(w, n) for n, w in pairs), reverse=True)\n",
    ),
    "except TheirError (the candidate's exception classes)": (
        _EXC + "def f(x):\n    return check_age(x)\n",
        _EXC_TESTS,
        _EXC.replace("raise TooLarge", "raise InvalidInput") + "def f(x):\n    return check_age(x)\n",
    ),
    "repr, unary operators, float/int/round and sorted on a float subclass": (
        _MONEY + "def f(x):\n    return Money(x)\n",
        "assert repr(f(2.5)) == '2.5' and -f(2.5) == -2.5 and abs(f(-2.5)) == 2.5 and float(f(2.5)) == 2.5\n"
        "assert int(f(2.5)) == 2 and round(f(2.5)) == 2 and sorted([f(3.0), f(1.0)]) == [1.0, 3.0]\n"
        "assert f(2.5) < f(3.0) and abs(f(2.5) - 2.5) < 1e-9\n",
        _MONEY + "def f(x):\n    return Money(x + 1)\n",
    ),
    "a prompt Enum with tuple values passed in": (
        _PLANET + "def f(p):\n    return p.mass / p.radius ** 2\n",
        "assert abs(f(Planet.EARTH) - 5.976e24 / 6.37814e6 ** 2) < 1e-3 and f(Planet.MERCURY) < f(Planet.EARTH)\n",
        _PLANET + "def f(p):\n    return p.mass / p.radius\n",
        _PLANET,
    ),
}

_BIG = 12_000_000  # "1\n" lines: a 24 MB output (one-digit lines failed at ~21 MiB before)
STDIO_CASES = {
    "a 24 MB output of one-digit lines": (
        "import sys\nn = int(input())\nsys.stdout.write('1\\n' * n)\n",
        {"cases": [{"input": f"{_BIG}\n", "output": "1\n" * _BIG}]},
        "import sys\nn = int(input())\nsys.stdout.write('1\\n' * (n - 1) + '2\\n')\n",
    ),
    "an 8 MB output of control characters": (
        "import sys\nn = int(input())\nsys.stdout.write('\\x01' * n + '\\n')\n",
        {"cases": [{"input": "8000000\n", "output": "\x01" * 8_000_000 + "\n"}]},
        "import sys\nn = int(input())\nsys.stdout.write('\\x01' * (n - 1) + '\\x02\\n')\n",
    ),
    "__file__ in a stdio program": (
        "import os\nprint(os.path.basename(__file__), input())\n",
        {"cases": [{"input": "7\n", "output": "solution.py 7\n"}]},
        "import os\nprint(os.path.dirname(__file__) or '.', input())\n",
    ),
    "@dataclass under from __future__ import annotations, stdio": (
        _PEP563 + "n = int(input())\nprint(max(Item(i % 7, str(i)) for i in range(n)).weight, len(fields(Item)))\n",
        {"cases": [{"input": "20\n", "output": "6 2\n"}]},
        _PEP563 + "n = int(input())\nprint(min(Item(i % 7, str(i)) for i in range(n)).weight, len(fields(Item)))\n",
    ),
    "resource.setrlimit(RLIMIT_STACK) in a stdio program": (
        _DEEP + "print(depth(int(input())))\n",
        {"cases": [{"input": "30000\n", "output": "30000\n"}]},
        _DEEP + "print(depth(int(input())) - 1)\n",
    ),
}


def _plain_assert(code: str, tests: str, prefix: str | None, tmp_path) -> bool:
    "The plain harness: the prompt, the program and the tests in one file, run by one interpreter."
    path = tmp_path / "plain.py"
    path.write_text((prefix or "") + code + "\n" + tests, encoding="utf-8")
    return subprocess.run([sys.executable, str(path)], capture_output=True, timeout=120).returncode == 0


def _plain_stdio(code: str, spec: dict, tmp_path) -> bool:
    "The plain harness of a stdio row: ``python solution.py < input``, the output compared token by token."
    path = tmp_path / "solution.py"
    path.write_text(code, encoding="utf-8")
    for case in spec["cases"]:
        r = subprocess.run(
            [sys.executable, "solution.py"],
            input=case["input"].encode(),
            capture_output=True,
            cwd=tmp_path,
            timeout=120,
        )
        if r.returncode != 0 or r.stdout.decode().split() != case["output"].split():
            return False
    return True


def _rewards(codes, tests, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _reward(None, [f"```python\n{c}```" for c in codes], tests=[tests] * len(codes), **kw)
    return got, [r.judge_stderr[-400:] for r in _reward.last_results]


@pytest.mark.parametrize("name", list(ASSERT_CASES))
def test_an_assert_idiom_is_paid_as_a_plain_harness_pays_it(name, tmp_path):
    code, tests, wrong, prefix = (*ASSERT_CASES[name], None)[:4]
    assert _plain_assert(code, tests, prefix, tmp_path), "the reference fails: the case is not a correct program"
    assert not _plain_assert(wrong, tests, prefix, tmp_path), "the reference pays the wrong twin"
    kw = {"entry_point": ["f", "f"]}
    if prefix is not None:
        kw["code_prefix"] = [prefix, prefix]
    got, err = _rewards([code, wrong], tests, **kw)
    assert got == [1.0, 0.0], (got, err)


@pytest.mark.parametrize("name", list(STDIO_CASES))
def test_a_stdio_idiom_is_paid_as_a_plain_harness_pays_it(name, tmp_path):
    code, spec, wrong = STDIO_CASES[name]
    assert _plain_stdio(code, spec, tmp_path), "the reference fails: the case is not a correct program"
    assert not _plain_stdio(wrong, spec, tmp_path), "the reference pays the wrong twin"
    got, err = _rewards([code, wrong], json.dumps(spec), test_type=["stdio", "stdio"])
    assert got == [1.0, 0.0], (got, err)
