"""llm/sandbox/programs/: the program files, composed into the text each interpreter runs, and their
functions exercised here directly (the codec imported from its file, the bootstrap's and the judge's helpers
compiled from theirs); tests/llm/test_sandbox.py runs the same programs end to end."""

import ast
import collections
import datetime
import decimal
import enum
import fractions
import importlib.util
import json
import os
import sys

import pytest

from tiltlab.llm.sandbox import config, programs

FILES = ("boot.py", "codec.py", "judge.py", "judge_head.py", "judge_server.py")
RUN = {  # the texts the host starts interpreters with
    "_BOOT": programs._BOOT,
    "_JUDGE": programs._JUDGE,
    "_JUDGE_BODY": programs._JUDGE_BODY,
    "_ZYGOTE": programs._ZYGOTE,
}


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
# composition
# ---------------------------------------------------------------------------------------------


def test_each_program_is_its_files_with_the_codec_in_place():
    codec = programs._CODEC
    assert programs._JUDGE == programs._JUDGE_HEAD + programs._JUDGE_BODY
    for key in ("_BOOT", "_JUDGE_BODY"):
        assert RUN[key].count(codec) == 1, key  # the codec's text, once, where the codec block was
    for key, text in {**RUN, "_CODEC": codec}.items():
        compile(text, key, "exec")
        # the blocks for static checkers are gone (they would bind TYPE_CHECKING in the program's globals)
        assert "TYPE_CHECKING" not in text and "# >>> " not in text and "# <<< " not in text, key
    assert programs._ZYGOTE.startswith("# tiltlab judge server\n")  # how the hostile corpus finds the server
    # every file is a whole Python module that static tools read (its blocks included)
    for name in FILES:
        ast.parse((programs.DIR / name).read_text(encoding="utf-8"), name)


def test_the_bootstrap_gets_the_hosts_constants():
    tree = ast.parse(programs._BOOT)
    argv = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "sys.argv"]
    assert [ast.literal_eval(v) for v in argv] == [[config.SCRIPT]]
    exits = [
        ast.unparse(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "os._exit"
    ]
    assert str(config.RC_MEMORY) in exits and f"{config.RC_BLOCKED} if _BLOCKED[0] else 1" in exits
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"RC_MEMORY", "RC_BLOCKED", "SCRIPT"}
    # other values give another program: the constants are not in the file
    other = programs._text("boot.py", "", {"RC_MEMORY": "77", "RC_BLOCKED": "78", "SCRIPT": "'x.py'"})
    assert "os._exit(77)" in other and "os._exit(78 if" in other and "sys.argv = ['x.py']" in other


def test_a_broken_block_or_an_unused_constant_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(programs, "DIR", tmp_path)
    (tmp_path / "ok.py").write_text(
        "a = 1\n# >>> codec: here\nimport x\n# <<< codec\nb = A\n# >>> static\nA = 0\n# <<< static\n"
    )
    assert programs._text("ok.py", "CODEC\n", {"A": "2"}) == "a = 1\nCODEC\nb = 2\n"
    (tmp_path / "open.py").write_text("a = 1\n# >>> static\nA = 0\n")
    with pytest.raises(RuntimeError, match="without its"):
        programs._text("open.py")
    with pytest.raises(RuntimeError, match="does not use B"):
        programs._text("ok.py", "", {"B": "1"})


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
    )
    hook = ns["_hook"]
    hook("open", ("/etc/passwd", "r", os.O_RDONLY))  # reading anywhere: the OS decides
    hook("open", ("x.txt", "w", os.O_WRONLY | os.O_CREAT))  # writing inside
    hook("ctypes.dlopen", ("libc.so.6",))  # ctypes allowed when _BLOCK_FFI is off (bwrap)
    assert ns["_BLOCKED"] == [False]
    for event, args in [
        ("open", ("/tmp/../etc/x", "a", None)),
        ("open", ("/etc/x", None, os.O_RDWR)),
        ("os.remove", ("/etc/x",)),
        ("socket.connect", (None, ("1.2.3.4", 80))),
        ("os.system", ("ls",)),
        ("os.fork", ()),
        ("resource.setrlimit", (0, (1, 1))),
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

    exc = _pieces("judge.py", "_exc", builtins=builtins, _NO_CROSS=frozenset(config.NO_CROSS))["_exc"]
    e = exc("ValueError", "bad")
    assert type(e) is ValueError and str(e) == "bad"
    assert type(exc("KeyError", "k")) is KeyError and type(exc("OSError", "o")) is OSError
    for name in (*config.NO_CROSS, "BaseException", "Nope", "print", 5):
        e = exc(name, "m")
        assert type(e) is RuntimeError and str(e) == f"{name}: m", name


def test_judge_module_names_are_the_names_whose_attributes_the_tests_read(codec):
    import _ast

    names = _pieces("judge.py", "_module_names", _ast=_ast, _walk=codec._walk)["_module_names"]
    tree = ast.parse("import math\nassert math.isclose(f(2), 4.0)\nx = collections.Counter(a.b.c)\ny = f(z)\n")
    assert names(tree) == {"math", "collections", "a"}
