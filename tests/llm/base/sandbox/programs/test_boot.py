"""llm/base/sandbox/programs/boot.py: a stdio program is judged as ``python solution.py < input`` runs it (its
exit status, exit hooks, flushed output, argv)."""

import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tests.llm.base.sandbox._helpers import FAST
from tiltlab.llm.base.sandbox import SandboxConfig, run_judged, run_python

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


def test_judged_stdio():
    code = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"
    tests = "assert __stdio__('1 2\\n3').split() == ['6']\nassert __stdio__('5').strip() == '5'\n"
    assert run_judged(code, tests, FAST, stdio=True).passed
    assert not run_judged("print(7)", tests, FAST, stdio=True).passed


_STDIO_SUM = "import os, sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.stdout.flush()\n"


@pytest.mark.parametrize(
    "ending,ok",
    [
        ("", True),
        ("sys.exit()", True),
        ("sys.exit(0)", True),
        ("sys.exit(False)", True),  # SystemExit(False): status 0, as the interpreter exits
        ("sys.exit(0.0)", False),  # the interpreter prints a non-int code and exits 1
        ("sys.exit('')", False),
        ("import decimal; sys.exit(decimal.Decimal(0))", False),
        ("sys.exit(type('Z', (int,), {'__eq__': lambda s, o: True})(3))", False),  # status 3, whatever __eq__ says
        ("sys.exit(3)", False),
        ("sys.exit(True)", False),
        ("raise SystemExit('bye')", False),  # a message: status 1
        ("os._exit(2)", False),
        ("raise ValueError('late')", False),
    ],
)
def test_judged_stdio_program_that_prints_the_answer_then_exits_nonzero_fails(ending, ok):
    # the right output on stdout is not enough: a stdio program is judged, like a script, with its
    # exit status, so printing the answer and then failing (or exiting non-zero) is a failure
    tests = "assert __stdio__('1 2\\n3').split() == ['6']\n"
    r = run_judged(_STDIO_SUM + ending + "\n", tests, FAST, stdio=True)
    assert r.passed is ok, (ending, r.status, r.judge_stderr)
    if not ok:  # the failure reaches the tests as an exception naming the exit status
        caught = "try:\n    __stdio__('1')\nexcept RuntimeError as e:\n    assert 'exit status' in str(e), e\nelse:\n    raise AssertionError('no error')\n"
        assert run_judged(_STDIO_SUM + ending + "\n", caught, FAST, stdio=True).passed


# a stdio program is judged as ``python solution.py < input`` would run it: each test below fails
# when the case's child ends without the interpreter's exit steps, or sees the bootstrap's argv
def test_stdio_output_of_atexit_hooks_is_kept():
    code = "import atexit\natexit.register(print, 'late')\nprint('early')\n"
    assert run_judged(code, "assert __stdio__('').split() == ['early', 'late']", FAST, stdio=True).passed


def test_stdio_threads_finish_before_the_atexit_hooks_run():
    code = (
        "import atexit, threading\nseen = []\natexit.register(lambda: print(seen))\n"
        "threading.Thread(target=lambda: seen.append(1)).start()\n"
    )
    assert run_judged(code, "assert __stdio__('').split() == ['[1]']", FAST, stdio=True).passed


def test_stdio_buffered_output_of_the_original_stdout_is_flushed_at_exit():
    # the program swaps sys.stdout out and writes to sys.__stdout__: the interpreter flushes it at exit
    code = "import io, sys\nsys.stdout = io.StringIO()\nsys.__stdout__.write('6\\n')\n"
    assert run_judged(code, "assert __stdio__('').split() == ['6']", FAST, stdio=True).passed


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nprint(sys.argv)\n",
        "import fileinput\nprint(sum(int(x) for x in fileinput.input()))\n",
        "import sys\nf = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin\nprint(sum(int(x) for x in f))\n",
    ],
)
def test_stdio_argv_is_a_script_run_with_no_arguments(code):
    tests = "assert __stdio__('2\\n4\\n').split() in (['6'], [repr(['solution.py'])])"
    r = run_judged(code, tests, FAST, stdio=True)
    assert r.passed, r.judge_stderr[-500:]


def test_run_python_argv_is_a_script_run_with_no_arguments():
    assert run_python("import sys\nprint(sys.argv)", FAST).stdout.strip() == "['solution.py']"


def test_stdio_output_above_the_file_size_limit_is_kept_up_to_the_reply_cap():
    # the case's output is the reply (max_reply_mb), not a file: RLIMIT_FSIZE (max_file_mb) does not bound it
    code = "import sys\nsys.stdout.write('x' * (2 << 20))\n"
    tests = "assert len(__stdio__('')) == 2 << 20"
    cfg = SandboxConfig(timeout_s=2.0, memory_mb=256, max_file_mb=1.0, max_reply_mb=4.0)
    r = run_judged(code, tests, cfg, stdio=True)
    assert r.passed, r.judge_stderr[-500:]
    over = "try:\n    __stdio__('')\nexcept OverflowError:\n    pass\nelse:\n    raise AssertionError('no error')\n"
    r = run_judged(code, over, SandboxConfig(timeout_s=2.0, memory_mb=256, max_reply_mb=1.0), stdio=True)
    assert r.passed, r.judge_stderr[-500:]
