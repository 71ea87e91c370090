"""llm/base/sandbox/programs/: the program files, each run by path (the codec compiled by the program that
runs it, in that program's globals), and their functions exercised here directly (the codec imported from
its file, the bootstrap's and the judge's helpers compiled from theirs); the other files of
tests/llm/base/sandbox/ (test_runner.py, programs/test_judge.py, programs/test_boot.py, ...) run the same
programs end to end."""

import ast
import collections
import datetime
import decimal
import enum
import fractions
import importlib.util
import json
import os
import resource
import sys
import warnings
from pathlib import Path

import pytest

from tiltlab.llm.base.sandbox import SandboxConfig, SandboxWarning, config, programs, run_judged, run_python, runner
from tiltlab.llm.base.sandbox.server import _JudgeServer

FILES = ("boot.py", "codec.py", "judge.py", "judge_main.py", "judge_server.py")
FAST = SandboxConfig(timeout_s=5.0, memory_mb=256)
pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


def _pieces(name: str, *names: str, **ns) -> dict:
    """The top-level definitions and assignments of ``names`` in the program file ``name``, run in a
    namespace holding ``ns`` (what the rest of the program would have defined)."""
    tree = ast.parse((programs.DIR / name).read_text(encoding="utf-8"))
    keep, found = [], set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound = {node.name}
        elif isinstance(node, ast.Assign):
            bound = {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        else:
            continue
        if bound & set(names):
            keep.append(node)
            found |= bound
    assert set(names) <= found, f"{name} defines none of {set(names) - found}"
    exec(compile(ast.Module(keep, []), str(programs.DIR / name), "exec"), ns)
    return ns


# ---------------------------------------------------------------------------------------------
# each program run by path
# ---------------------------------------------------------------------------------------------


def test_the_program_paths_are_the_files_of_the_package():
    assert Path(programs.__file__).resolve().parent == programs.DIR
    assert [str(programs.DIR / n) for n in ("boot.py", "judge_main.py", "judge_server.py")] == [
        programs.BOOT,
        programs.JUDGE,
        programs.JUDGE_SERVER,
    ]
    for name in FILES:  # every file is a whole Python module that static tools read
        ast.parse((programs.DIR / name).read_text(encoding="utf-8"), name)


def test_the_candidate_runs_the_bootstrap_by_path():
    # the candidate's own process: its command line is the interpreter and boot.py (bound at the same path
    # under bwrap), and what the program sees of it is sys.argv == [SCRIPT] (no /proc in the sandbox: the
    # interpreter's own record of its command line, sys.orig_argv)
    r = run_python("import sys\nprint(sys.orig_argv)\nprint(sys.argv)", FAST)
    assert r.status == "ok", r.stderr
    cmd, argv = (ast.literal_eval(line) for line in r.stdout.splitlines())
    assert cmd[-2] == programs.BOOT and "-c" not in cmd and cmd[1:3] == ["-I", "-B"]
    assert argv == [config.SCRIPT]


def _judge_sees(served: bool) -> dict:
    """What the judge's own process holds, read by its tests: its argv and its globals' names."""
    tests = (
        "import sys\n_g = vars(sys.modules['__main__'])\n"
        "print(repr({'argv': sys.argv, 'codec': sorted(n for n in ('_dec', '_enc', '_whole') if n in _g),"
        " 'left': sorted(n for n in ('_CODEC', 'TYPE_CHECKING', 'cfg') if n in _g)}), file=sys.stderr)\n"
        "assert f(1) == 2\n"
    )
    r = run_judged("def f(x):\n    return x + 1\n", tests, FAST, judge_server=served)
    assert r.passed, (r.status, r.judge_stderr)
    return ast.literal_eval(r.judge_stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("served", [False, True], ids=["own-interpreter", "judge-server"])
def test_each_judge_runs_its_program_by_path_with_the_codec_in_its_globals(served):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SandboxWarning)  # a served judge that fell back would warn
        seen = _judge_sees(served)
    assert seen["argv"][0] == (programs.JUDGE_SERVER if served else programs.JUDGE)
    assert len(seen["argv"]) == (3 if served else 2)
    assert seen["codec"] == ["_dec", "_enc", "_whole"]  # the codec's functions, in the judge's globals
    assert seen["left"] == ["cfg"]  # the compiled codec and the static checkers' flag are gone


def test_the_candidates_server_has_the_codec_in_its_globals_and_not_the_code_object():
    code = (
        "import sys\n_g = vars(sys.modules['__main__'])\n"
        "_SEEN = ([n for n in ('_dec', '_enc', '_whole') if n in _g], [n for n in ('_CODEC', 'TYPE_CHECKING') if n in _g])\n"
        "def f():\n    return _SEEN\n"
    )
    r = run_judged(code, "assert f() == (['_dec', '_enc', '_whole'], []), f()", FAST)
    assert r.passed, (r.status, r.judge_stderr, r.stderr)
    # a program run alone sees none of the bootstrap's state either
    r = run_python(
        "import sys\n_g = vars(sys.modules['__main__'])\nprint([n for n in ('_CODEC', 'cfg', '_dec') if n in _g])", FAST
    )
    assert r.status == "ok" and r.stdout.strip() == "[]", r


def test_the_judge_server_is_started_by_path():
    srv = _JudgeServer.get()
    with open(f"/proc/{srv.proc.pid}/cmdline", "rb") as fh:
        cmd = fh.read().split(b"\0")[:-1]
    assert cmd[0] == sys.executable.encode() and cmd[1:4] == [b"-I", b"-B", b"-S"]
    assert cmd[4] == programs.JUDGE_SERVER.encode() and len(cmd) == 7


def test_the_bootstrap_gets_the_hosts_constants_from_its_config(monkeypatch):
    # the bootstrap has no constants of its own: other values in the config give another exit status and argv
    monkeypatch.setattr(runner, "RC_MEMORY", 77)
    monkeypatch.setattr(runner, "RC_BLOCKED", 78)
    monkeypatch.setattr(runner, "SCRIPT", "other.py")
    r = run_python("raise MemoryError", FAST)
    assert (r.status, r.returncode) == ("memory", 77), r
    r = run_python("import os\nos.system('true')", FAST)
    assert (r.status, r.returncode) == ("blocked", 78), r
    r = run_python("import sys\nprint(sys.argv)", FAST)
    assert r.status == "ok" and r.stdout.strip() == "['other.py']", r
    tree = ast.parse((programs.DIR / "boot.py").read_text(encoding="utf-8"))
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert config.SCRIPT not in consts and config.RC_MEMORY not in consts and config.RC_BLOCKED not in consts


def test_the_program_folder_is_bound_into_bwrap_unless_a_bound_prefix_holds_it(monkeypatch, tmp_path):
    from tiltlab.llm.base.sandbox import probe

    roots = probe._bind_roots(sys.executable)
    assert any(str(programs.DIR) == r or str(programs.DIR).startswith(r + "/") for r in roots)
    inner = tmp_path / "prefix" / "lib" / "tiltlab" / "programs"
    inner.mkdir(parents=True)
    monkeypatch.setattr(programs, "DIR", inner)
    monkeypatch.setattr(probe.sys, "prefix", str(tmp_path / "prefix"))
    roots = probe._bind_roots(sys.executable)
    assert str(tmp_path / "prefix") in roots and str(inner) not in roots  # inside a bound prefix: no second bind
    outer = tmp_path / "checkout" / "programs"
    outer.mkdir(parents=True)
    monkeypatch.setattr(programs, "DIR", outer)
    assert str(outer) in probe._bind_roots(sys.executable)


# ---------------------------------------------------------------------------------------------
# the codec, imported from its file as a module
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def codec():
    spec = importlib.util.spec_from_file_location("sandbox_codec_under_test", programs.DIR / "codec.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # what the program that includes the codec defines (here: the judge's side)
    mod._OWN, mod._dcref, mod._objref, mod._DC_BY_REF = {"__name__": "__main__"}, lambda v: None, lambda v: None, False
    return mod


def _no_handle(v):
    raise TypeError(f"no handle for a {type(v).__name__}")


def _across(codec, v):
    return codec._whole(codec._dec, json.loads(json.dumps(codec._whole(codec._enc, v, _no_handle))), None)


class Color(enum.IntEnum):
    RED = 1
    BLUE = 2


def test_codec_module_round_trips_values_with_their_types(codec):
    point = collections.namedtuple("Point", "x y")
    values = [
        None, True, 3, -(1 << 5000), 2.5, "é", b"\x00\xff", bytearray(b"ab"), 1 + 2j, range(1, 9, 2),
        [1, [2, (3, {4})]], (1,), {"a": [1], 2: (3, 4)}, frozenset({1, 2}),
        collections.Counter("abca"), collections.OrderedDict([("b", 1), ("a", 2)]),
        collections.deque([1, 2], maxlen=5), point(1, 2), fractions.Fraction(3, 7), decimal.Decimal("1.10"),
        datetime.date(2024, 2, 29), datetime.timedelta(days=1, seconds=3), Color.BLUE,
    ]  # fmt: skip
    for v in values:
        got = _across(codec, v)
        assert got == v and type(got).__name__ == type(v).__name__, v
    d = _across(codec, collections.defaultdict(list, {"k": [1]}))
    assert d == {"k": [1]} and d.default_factory is list
    big = _across(codec, 1 << 5000)
    assert big == 1 << 5000 and codec._enc(1 << 5000, _no_handle) == {"i": hex(1 << 5000)}  # past _BIG: as hex
    shared = [1]
    a, b = _across(codec, [shared, shared])
    assert a == b == [1]  # equal values (lists cross by value, shared or not)


def test_codec_module_hands_other_objects_to_the_handle_and_refuses_malformed_values(codec):
    class Opaque:
        pass

    assert codec._enc([Opaque()], lambda v: {"h": 7}) == [{"h": 7}]
    assert codec._enc(True, _no_handle) is True and codec._enc(1, _no_handle) == 1
    assert codec._dec({"h": 5}, lambda k, v: (k, v)) == ("h", 5)
    for bad in ({"zz": 1}, {"i": 5}, {"t": [1], "d": []}, {"q": [[1], "x"]}, {"or": 3}, {"ok": 0}, {"dt": ["x", ""]}):
        with pytest.raises(ValueError, match="malformed"):
            codec._whole(codec._dec, bad, None)
    assert not codec._ident("__class__") and not codec._ident("class") and codec._ident("val")


# ---------------------------------------------------------------------------------------------
# the bootstrap's and the judge's helpers, compiled from their files
# ---------------------------------------------------------------------------------------------


def test_boot_inside_keeps_writes_in_the_working_directory(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    (root / "out").symlink_to("/etc")
    ns = _pieces(
        "boot.py",
        "_inside",
        _ROOT=os.path.realpath(root),
        _fspath=os.fspath,
        _realpath=os.path.realpath,
        _join=os.path.join,
        _sep=os.sep,
    )
    inside = ns["_inside"]
    assert inside("a.txt") and inside(b"sub/b") and inside(str(root)) and inside(3)  # an fd: its own check
    assert not inside("/etc/passwd") and not inside("../x") and not inside(str(root) + "x/y")  # a sibling prefix
    assert not inside("out/passwd")  # through a link that leaves
    assert not inside(object())  # not a path


def test_boot_audit_hook_denies_what_it_names(tmp_path):
    ns = _pieces(
        "boot.py",
        "_inside",
        "_deny",
        "_hook",
        "_PROC",
        "_NET",
        "_FFI",
        "_MUT",
        "_WFLAGS",
        os=os,
        _ROOT=str(tmp_path),
        _fspath=os.fspath,
        _realpath=os.path.realpath,
        _join=os.path.join,
        _sep=os.sep,
        _BLOCK_PROC=True,
        _BLOCK_FFI=False,
        _BLOCKED=[False],
        _FORKING=[False],
        _RLIMIT_STACK=resource.RLIMIT_STACK,
    )
    hook = ns["_hook"]
    hook("open", ("/etc/passwd", "r", os.O_RDONLY))  # reading anywhere: the OS decides
    hook("open", ("x.txt", "w", os.O_WRONLY | os.O_CREAT))  # writing inside
    hook("ctypes.dlopen", ("libc.so.6",))  # ctypes allowed when _BLOCK_FFI is off (bwrap)
    hook("resource.setrlimit", (resource.RLIMIT_STACK, (-1, -1)))  # the deep-recursion idiom: the stack only
    assert ns["_BLOCKED"] == [False]
    for event, args in [
        ("open", ("/tmp/../etc/x", "a", None)),
        ("open", ("/etc/x", None, os.O_RDWR)),
        ("os.remove", ("/etc/x",)),
        ("socket.connect", (None, ("1.2.3.4", 80))),
        ("os.system", ("ls",)),
        ("os.fork", ()),
        ("resource.setrlimit", (resource.RLIMIT_CPU, (1, 1))),
        ("resource.setrlimit", (resource.RLIMIT_AS, (-1, -1))),
        ("resource.setrlimit", (resource.RLIMIT_NPROC, (-1, -1))),
    ]:
        with pytest.raises(PermissionError, match="^sandbox: "):
            hook(event, args)
    assert ns["_BLOCKED"] == [True]
    ns["_FORKING"][0] = True
    hook("os.fork", ())  # the server's own fork of a stdio case
    with pytest.raises(PermissionError):
        hook("os.system", ("ls",))


def test_boot_exit_status_is_the_interpreters(capsys):
    status = _pieces("boot.py", "_exit_status", sys=sys)["_exit_status"]
    assert [status(SystemExit(c)) for c in (None, 0, False)] == [0, 0, 0]
    assert [status(SystemExit(c)) for c in (3, True, 0.0, "0", "bye")] == [1, 1, 1, 1, 1]
    assert capsys.readouterr().err.split() == ["0.0", "0", "bye"]  # a non-int code is printed, as at exit


def test_judge_exceptions_cross_as_builtins_except_those_that_steer_control_flow():
    import builtins

    ns = _pieces(
        "judge.py",
        "_exc",
        "_builtin_exc",
        "_decides",
        "_EXC",
        "_exc_classes",
        builtins=builtins,
        _NO_CROSS=frozenset(config.NO_CROSS),
    )
    exc = ns["_exc"]
    e = exc("ValueError", "bad")
    assert type(e) is ValueError and str(e) == "bad"
    assert type(exc("KeyError", "k")) is KeyError and type(exc("OSError", "o")) is OSError
    for name in (*config.NO_CROSS, "BaseException", "Nope", "print", 5, ["ValueError"], None):
        e = exc(name, "m")
        assert type(e) is RuntimeError and str(e) == f"{name}: m", name
    # a candidate's own exception class: the first builtin name of its MRO decides, and a forbidden one stops there
    assert type(exc("Mine", "m", ["Mine", "ValueError", "Exception", "BaseException", "object"])) is ValueError
    assert type(exc("Mine", "m", ["Mine", "Base", "KeyError", "LookupError"])) is KeyError
    for mro in (
        ["S", "StopIteration", "Exception"],
        ["K", "KeyboardInterrupt", "BaseException"],
        ["B", "BaseException"],
    ):
        assert type(exc(mro[0], "m", mro)) is RuntimeError, mro
    for bad in ("ValueError", {"ValueError": 1}, ("ValueError",)):  # a malformed MRO is ignored
        assert type(exc("Mine", "m", bad)) is RuntimeError, bad
    # the candidate's top-level exception classes get a judge class each, in the builtin hierarchy they claim
    own = ns["_exc_classes"](
        {
            "Bad": ["Bad", "ValueError", "Exception", "BaseException", "object"],
            "Worse": ["Worse", "Bad", "ValueError", "Exception", "BaseException", "object"],
            "Stop": ["Stop", "StopIteration", "Exception", "BaseException", "object"],
            "Loop": ["Loop", "Loop2"],
            "Loop2": ["Loop2", "Loop"],
        }
    )
    assert issubclass(own["Worse"], own["Bad"]) and issubclass(own["Bad"], ValueError)
    assert own["Stop"].__mro__[1] is RuntimeError and not issubclass(own["Stop"], StopIteration)
    assert issubclass(own["Loop"], RuntimeError) and issubclass(own["Loop2"], RuntimeError)
    assert type(exc("Worse", "w", ["Worse", "ValueError"])) is own["Worse"]  # raised: the judge's class of that name
    # a class that is not top-level, derived from one that is: the judge's class of that one (``except Bad``)
    assert type(exc("Inner", "i", ["Inner", "Bad", "ValueError", "Exception"])) is own["Bad"]
    assert type(exc("Inner", "i", ["Inner", "Local", "KeyError", "Bad"])) is KeyError  # the first decisive name


def test_judge_module_names_are_the_names_whose_attributes_the_tests_read(codec):
    import _ast

    names = _pieces("judge.py", "_module_names", _ast=_ast, _walk=codec._walk)["_module_names"]
    tree = ast.parse("import math\nassert math.isclose(f(2), 4.0)\nx = collections.Counter(a.b.c)\ny = f(z)\n")
    assert names(tree) == {"math", "collections", "a"}


# the codec's guards against a malformed or foreign value (mutation survivors: each guard once compared a
# value with itself); every case is a value the other side could send, refused or kept apart exactly


def test_an_identifier_is_a_str_that_is_a_plain_name(codec):
    for bad in (5, b"ab", None, ["a"], "for", "__x", "_tl_ref", "a b", ""):
        assert codec._ident(bad) is False, bad
    assert codec._ident("abc") is True and codec._ident("_a") is True


@pytest.mark.parametrize("bad", [0.0, True, "0", None, -1, 3])
def test_a_reference_to_the_judges_own_object_is_an_int_index(codec, bad):
    codec._DORIG = ["first", "second", "third"]
    try:
        assert codec._dec({"ok": 1}, None) == "second"
        with pytest.raises(ValueError, match="^sandbox: malformed value$"):
            codec._dec({"ok": bad}, None)
    finally:
        codec._DORIG = None


@pytest.mark.parametrize(
    "bad", [["Pt", 1, None, "attrs"], ["Pt", 1, None, {"a": 1}], ["Pt", "1", None, []], ["Pt", 1, None], "Pt"]
)
def test_an_object_that_crossed_has_the_four_fields_of_their_types(codec, bad):
    with pytest.raises(ValueError, match="^sandbox: malformed value$"):
        codec._dec({"o": bad}, lambda k, v: None)


def test_an_enum_of_more_than_4096_members_does_not_cross_by_value(codec):
    import enum as _enum

    big = _enum.IntEnum("Big", [(f"m{i}", i) for i in range(4097)])
    small = _enum.IntEnum("Small", [(f"m{i}", i) for i in range(4096)])
    assert codec._enc_enum(big.m3, big, _enum, _no_handle) is None
    enc = codec._enc_enum(small.m3, small, _enum, _no_handle)
    assert enc is not None and enc["en"][:2] == ["IntEnum", "Small"] and len(enc["en"][2]) == 4096


def test_an_enum_or_dataclass_of_another_module_is_never_taken_for_this_sides_own(codec):
    import dataclasses as _dc

    codec._OWN = {"__name__": "__main__", "Color": Color}  # Color is this test module's, not __main__'s
    got = codec._dec({"en": ["IntEnum", "Color", [["RED", 1], ["BLUE", 2]], 2]}, None)
    assert got == 2 and got.name == "BLUE" and type(got) is not Color  # rebuilt from what crossed

    @_dc.dataclass
    class Pt:
        x: int
        y: int

    codec._OWN = {"__name__": "__main__", "Pt": Pt}
    assert codec._dataclass("Pt", (("x", True), ("y", True)), (True, False, False)) is Pt  # same fields: its own
    other = codec._dataclass("Pt", (("x", True), ("z", True)), (True, False, False))
    assert other is not Pt and [f.name for f in _dc.fields(other)] == ["x", "z"]


def test_enum_values_that_cross_are_ints_strs_floats_and_tuples_of_them(codec):
    ok = codec._enum_value
    for kind in ("IntEnum", "IntFlag", "Flag"):
        assert ok(kind, 3) and not ok(kind, "a") and not ok(kind, 1.5) and not ok(kind, (1,)), kind
    assert ok("StrEnum", "a") and not ok("StrEnum", 1) and not ok("StrEnum", ("a",))
    for good in (1, "a", 2.5, (3.3e23, 2.4e6), ("a", (1, (2.0,))), ()):
        assert ok("Enum", good), good
    for bad in ([1, 2], None, True, {"a": 1}, (1, [2]), (1, None), b"x", ((((((1,),),),),),), tuple(range(65))):
        assert not ok("Enum", bad), bad
