"""A small semantic mutation tester: which single-point changes to a module do its tests notice?

Each mutant changes one thing a reviewer would break on purpose, found with :mod:`ast` and written back
into the source at the node's exact span (everything else in the file stays byte-identical):

* ``repeat``            ``x.repeat_interleave(g)`` <-> ``x.repeat(g)``; ``expand`` -> ``repeat`` is not
                        tried (it is an equivalent rewrite)
* ``any_all``           ``any(...)`` <-> ``all(...)``; ``min`` <-> ``max``
* ``compare``           ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``is`` <-> ``is not``,
                        ``in`` <-> ``not in``
* ``selfcmp``           ``a == b`` -> ``a == a`` and ``b == b`` (also ``!=``, ``is``, ``is not``) where
                        neither side is a literal: a check that compares a value with itself (the
                        recorded verdict with the recorded one, instead of the re-derived one)
* ``sign``              ``-x`` -> ``x`` (a sign or a margin's side flipped)
* ``boolop``            ``and`` <-> ``or``
* ``not``               ``not x`` -> ``x``
* ``arith``             ``+`` <-> ``-``, ``*`` <-> ``/``
* ``index``             ``[-1]`` -> ``[0]``, ``[0]`` -> ``[-1]``
* ``dict_key``          a dict literal (two or more keys) loses one key
* ``default``           a function's default: a bool flipped, a number changed (0 -> 1, n -> 2n),
                        a string replaced by ``"<mutant>"``, ``None`` -> ``0``
* ``kwarg``             a keyword argument dropped from a call
* ``const``             a numeric literal in an expression: 0 -> 1, 1 -> 0, n -> 2n

Use (from the repository root; it edits files in place and restores them, so run it in a worktree of
its own, never in a checkout another process is testing)::

    python .ci/mutate.py --module llm/disa/stage2/run.py --tests tests/llm/disa/test_stage2.py --per-module 12 \
        --out build/mutation.jsonl

Every mutant runs the named test files (``pytest -x -q``); a failing run or a run past the timeout kills
it, a passing one is a survivor. ``--only`` re-runs the survivors of an earlier ``--out`` file (after
tests were added: a killed mutant stays killed when tests are only added). The summary prints the kill
rate per module. Judging a survivor (equivalent, or a missing test) is the reader's work: the tool
records the exact line before and after.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SWAP_ATTR = {"repeat_interleave": "repeat", "repeat": "repeat_interleave"}
SWAP_NAME = {"any": "all", "all": "any", "min": "max", "max": "min"}
SWAP_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
#: calls and keywords whose arguments shape output or files, not results: no ``kwarg`` mutants there
PRESENTATION = {"progress_bar", "mkdir", "print", "dumps", "dump", "write_text", "open", "add_argument", "tqdm"}
PRESENTATION_KW = {"desc", "unit", "indent", "sort_keys", "exist_ok", "parents", "flush", "file", "help", "stacklevel"}
SELF_CMP = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}


@dataclass
class Mutant:
    module: str
    op: str
    line: int
    start: tuple[int, int]
    end: tuple[int, int]
    before: str
    after: str
    status: str = "pending"
    seconds: float = 0.0
    killed_by: str = ""
    #: with --ref: was it killed by a test that existed at the reference revision? (None: not known)
    killed_before: bool | None = None

    @property
    def key(self) -> str:
        return f"{self.module}:{self.start[0]}:{self.start[1]}:{self.op}:{self.after}"


def _number_mutant(value: object) -> object | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value == 0:
        return 1
    if value == 1:
        return 0
    return value * 2


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _replacements(node: ast.AST, parent: ast.AST | None) -> list[tuple[str, ast.AST, str]]:
    """(operator class, node whose span is replaced, replacement source) for one node."""
    out: list[tuple[str, ast.AST, str]] = []
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in SWAP_ATTR:
            new = ast.Call(
                func=ast.Attribute(value=func.value, attr=SWAP_ATTR[func.attr], ctx=ast.Load()),
                args=node.args,
                keywords=node.keywords,
            )
            out.append(("repeat", node, ast.unparse(new)))
        if isinstance(func, ast.Name) and func.id in SWAP_NAME:
            new = ast.Call(func=ast.Name(id=SWAP_NAME[func.id], ctx=ast.Load()), args=node.args, keywords=node.keywords)
            out.append(("any_all", node, ast.unparse(new)))
        fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        for i, kw in enumerate(node.keywords):
            if kw.arg is None or fname in PRESENTATION or kw.arg in PRESENTATION_KW:
                continue
            new = ast.Call(func=node.func, args=node.args, keywords=node.keywords[:i] + node.keywords[i + 1 :])
            out.append(("kwarg", node, ast.unparse(new)))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_CMP:
        new = ast.Compare(left=node.left, ops=[SWAP_CMP[type(node.ops[0])]()], comparators=node.comparators)
        out.append(("compare", node, ast.unparse(new)))
        left, right = node.left, node.comparators[0]
        if isinstance(node.ops[0], SELF_CMP) and not any(isinstance(x, ast.Constant) for x in (left, right)):
            for side in (left, right):
                same = ast.Compare(left=side, ops=node.ops, comparators=[side])
                out.append(("selfcmp", node, ast.unparse(same)))
    elif isinstance(node, ast.BoolOp):
        new = ast.BoolOp(op=ast.Or() if isinstance(node.op, ast.And) else ast.And(), values=node.values)
        out.append(("boolop", node, ast.unparse(new)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", node, "(" + ast.unparse(node.operand) + ")"))
    elif (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and not (isinstance(parent, ast.Subscript) and parent.slice is node)  # [-1]: the ``index`` class
    ):
        out.append(("sign", node, "(" + ast.unparse(node.operand) + ")"))
    elif isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        left, right = node.left, node.right
        # a string or path expression is no arithmetic
        if not any(
            isinstance(x, ast.JoinedStr) or (isinstance(x, ast.Constant) and isinstance(x.value, str))
            for x in (left, right)
        ):
            new = ast.BinOp(left=left, op=SWAP_BIN[type(node.op)](), right=right)
            out.append(("arith", node, "(" + ast.unparse(new) + ")"))
    elif isinstance(node, ast.Subscript):
        sl = node.slice
        if isinstance(sl, ast.UnaryOp) and isinstance(sl.op, ast.USub) and getattr(sl.operand, "value", None) == 1:
            out.append(("index", sl, "0"))
        elif isinstance(sl, ast.Constant) and sl.value == 0 and not isinstance(sl.value, bool):
            out.append(("index", sl, "-1"))
    elif isinstance(node, ast.Dict) and len(node.keys) >= 2 and all(k is not None for k in node.keys):
        for i in range(len(node.keys)):
            new = ast.Dict(keys=node.keys[:i] + node.keys[i + 1 :], values=node.values[:i] + node.values[i + 1 :])
            out.append(("dict_key", node, ast.unparse(new)))
    elif isinstance(node, ast.Constant) and isinstance(parent, ast.BinOp | ast.Compare | ast.Call | ast.keyword):
        new_value = _number_mutant(node.value)
        if new_value is not None:
            out.append(("const", node, repr(new_value)))
    return out


def _default_replacements(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.AST, str]]:
    out: list[tuple[str, ast.AST, str]] = []
    for d in [*fn.args.defaults, *(d for d in fn.args.kw_defaults if d is not None)]:
        if not isinstance(d, ast.Constant):
            continue
        v = d.value
        if isinstance(v, bool):
            out.append(("default", d, repr(not v)))
        elif v is None:
            out.append(("default", d, "0"))
        elif isinstance(v, str):
            out.append(("default", d, repr("<mutant>")))
        else:
            nv = _number_mutant(v)
            if nv is not None:
                out.append(("default", d, repr(nv)))
    return out


def find_mutants(path: Path, root: Path) -> list[Mutant]:
    src = path.read_text()
    tree = ast.parse(src)
    docstrings = _docstring_nodes(tree)
    lines = src.splitlines(keepends=True)
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    found: list[Mutant] = []
    seen: set[tuple] = set()
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        reps = _replacements(node, parents.get(id(node)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            reps += _default_replacements(node)
        for op, target, after in reps:
            if not hasattr(target, "end_lineno") or target.end_lineno is None:
                continue
            start = (target.lineno, target.col_offset)
            end = (target.end_lineno, target.end_col_offset)
            before = _span(lines, start, end)
            if before == after or (start, end, after) in seen:
                continue
            # logging, messages and type annotations are not behaviour worth a mutant
            if _in_message_or_annotation(target, parents):
                continue
            seen.add((start, end, after))
            found.append(Mutant(str(path.relative_to(root)), op, start[0], start, end, before, after))
    return found


def _in_message_or_annotation(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    cur: ast.AST | None = node
    while cur is not None:
        p = parents.get(id(cur))
        if isinstance(p, ast.arg | ast.AnnAssign) and getattr(p, "annotation", None) is cur:
            return True
        if isinstance(p, ast.FunctionDef | ast.AsyncFunctionDef) and p.returns is cur:
            return True
        if isinstance(p, ast.Raise | ast.JoinedStr | ast.Assert):
            return True
        if isinstance(p, ast.Call):
            f = p.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in {"print", "warn", "info", "debug", "warning", "error", "write", "_say", "log", "echo"}:
                return True
        cur = p
    return False


def _span(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    (l0, c0), (l1, c1) = start, end
    if l0 == l1:
        return lines[l0 - 1][c0:c1]
    return lines[l0 - 1][c0:] + "".join(lines[l0 : l1 - 1]) + lines[l1 - 1][:c1]


def apply(src: str, m: Mutant) -> str:
    lines = src.splitlines(keepends=True)
    (l0, c0), (l1, c1) = m.start, m.end
    head = "".join(lines[: l0 - 1]) + lines[l0 - 1][:c0]
    tail = lines[l1 - 1][c1:] + "".join(lines[l1:])
    after = m.after.replace("\n", " ")
    return head + after + tail


def run_tests(tests: list[str], timeout: float, extra: tuple[str, ...] = ()) -> tuple[str, float, str]:
    """(status, seconds, the first failing test's node id or "")."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "--no-header", *extra, *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "CI": "true"})
    except subprocess.TimeoutExpired:
        return "killed (timeout)", time.monotonic() - t0, ""
    dt = time.monotonic() - t0
    failed = next((ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))), "")
    if r.returncode == 0:
        return "survived", dt, ""
    if r.returncode in (2, 3, 4, 5):  # interrupted, internal error, usage, no tests: the mutant broke import
        return "killed (error)", dt, failed
    return "killed", dt, failed


def test_names(path: Path, rev: str | None) -> set[str]:
    """The test function names of one test file, now or at git revision ``rev`` (empty if absent)."""
    if rev is None:
        src = path.read_text() if path.exists() else ""
    else:
        r = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
        src = r.stdout if r.returncode == 0 else ""
    tree = ast.parse(src) if src else ast.Module(body=[], type_ignores=[])
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def is_new(node_id: str, old: dict[str, set[str]]) -> bool:
    """A test added since the reference revision: its function did not exist in its file then."""
    file, _, rest = node_id.partition("::")
    name = rest.split("::")[-1].split("[")[0]
    if file not in old:
        old[file] = test_names(Path(file), REF[0])
    return name not in old[file]


REF: list[str | None] = [None]


def covering_tests(cov_file: Path, module: Path) -> dict[int, set[str]]:
    """line -> the test node ids that ran it (pytest-cov's per-test contexts), for one source file."""
    from coverage import CoverageData

    data = CoverageData(basename=str(cov_file))
    data.read()
    want = module.resolve()
    out: dict[int, set[str]] = {}
    for f in data.measured_files():
        if Path(f).resolve() != want:
            continue
        for line, ctxs in data.contexts_by_lineno(f).items():
            ids = {c.rsplit("|", 1)[0] for c in ctxs if c}
            out.setdefault(line, set()).update(ids)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--module", action="append", default=[], help="a source file (repeatable)")
    ap.add_argument("--tests", nargs="+", default=[], help="test files run against every mutant")
    ap.add_argument(
        "--map",
        type=Path,
        help="'module | test files' lines (.ci/mutation_map.txt): every module with its own tests, one baseline",
    )
    ap.add_argument(
        "--ref",
        help="a git revision: a mutant killed only by tests added since then counts as a survivor 'before'",
    )
    ap.add_argument("--per-module", type=int, default=0, help="sample this many mutants per module (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", default="", help="comma-separated operator classes to keep (default: all)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per mutant (appended)")
    ap.add_argument("--only", type=Path, help="re-run only the survivors recorded in this JSON-lines file")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument(
        "--cover",
        action="store_true",
        help="run each mutant against only the tests that executed its lines in the baseline (pytest-cov contexts)",
    )
    ap.add_argument("--reuse-coverage", action="store_true", help="skip the baseline: reuse --out's coverage file")
    ap.add_argument("--last", default="", help="comma-separated modules whose mutants run last (slow tests)")
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant's test run (default: max(60, 2 x baseline + 30); 600 with --map). A run past it "
        "counts as killed, so raise it on a loaded machine",
    )
    args = ap.parse_args(argv)
    root = Path.cwd()
    REF[0] = args.ref
    tests_of: dict[str, list[str]] = {}
    if args.map:
        for ln in args.map.read_text().splitlines():
            if ln.strip() and not ln.startswith("#"):
                mod, _, tests = ln.partition("|")
                tests_of[mod.strip()] = tests.split()
        args.module = args.module or list(tests_of)
        args.tests = sorted({t for m in args.module for t in tests_of[m]})
    if not args.module or not args.tests:
        ap.error("give --module and --tests, or --map")
    rng = random.Random(args.seed)
    keep = set(filter(None, args.ops.split(",")))
    todo: list[Mutant] = []
    if args.only:
        rows = [json.loads(x) for x in args.only.read_text().splitlines() if x.strip()]
        wanted = {r["module"] for r in rows}
        todo = [
            Mutant(
                **{
                    **r,
                    "start": tuple(r["start"]),
                    "end": tuple(r["end"]),
                    "status": "pending",
                    "seconds": 0.0,
                    "killed_by": "",
                    "killed_before": None,
                }
            )
            for r in rows
            if r["status"] == "survived" and r["module"] in {str(Path(m)) for m in args.module} & wanted
        ]
    else:
        for mod in args.module:
            ms = find_mutants(root / mod, root)
            if keep:
                ms = [m for m in ms if m.op in keep]
            if args.per_module and len(ms) > args.per_module:
                ms = rng.sample(ms, args.per_module)
                ms.sort(key=lambda m: m.start)
            todo += ms
    slow = set(filter(None, args.last.split(",")))
    todo.sort(key=lambda m: m.module in slow)  # stable: the sampled order otherwise
    if args.list:
        for m in todo:
            print(f"{m.module}:{m.line} [{m.op}] {m.before!r} -> {m.after!r}")
        return 0
    cov_file = args.out.with_suffix(".coverage")
    extra: tuple[str, ...] = ()
    if args.cover and not args.reuse_coverage:
        cov_file.unlink(missing_ok=True)
        os.environ["COVERAGE_FILE"] = str(cov_file)
        covs = [f"--cov={d}" for d in sorted({str(Path(m).resolve().parent) for m in args.module})]
        extra = (*covs, "--cov-context=test", "--cov-report=")
    if args.reuse_coverage:  # the baseline of an earlier run of the same tests, its coverage file beside --out
        base, base_s, extra = "survived", 0.0, ()
    else:
        base, base_s, _ = run_tests(args.tests, timeout=3600, extra=extra)
    if base != "survived":
        print(f"the tests fail without any mutant ({base}); fix them first", file=sys.stderr)
        return 2
    timeout = args.timeout or (max(60.0, 2 * base_s + 30) if not args.map else 600.0)
    lines_to_tests: dict[str, dict[int, set[str]]] = {}
    if args.cover:
        os.environ.pop("COVERAGE_FILE", None)
        for mod in {m.module for m in todo}:
            lines_to_tests[mod] = covering_tests(cov_file, root / mod)
    print(f"baseline passes in {base_s:.1f} s; {len(todo)} mutants; timeout {timeout:.0f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for i, m in enumerate(todo, 1):
        path = root / m.module
        original = path.read_text()
        try:
            path.write_text(apply(original, m))
            own = tests_of.get(m.module, args.tests)
            old: dict[str, set[str]] = {}
            if args.cover:
                cov = lines_to_tests.get(m.module, {})
                ids = sorted(set().union(*(cov.get(ln, set()) for ln in range(m.start[0], m.end[0] + 1))))
                if args.ref:  # tests that existed at --ref first: with -x, a new test fails only if they all passed
                    ids.sort(key=lambda i: is_new(i, old))
                # a line no test ran in-process may still run in a test's subprocess: run the files then
                m.status, m.seconds, m.killed_by = run_tests(ids or own, timeout)
                if not ids:
                    m.status += " [not covered in-process]"
            else:
                ids = []
                m.status, m.seconds, m.killed_by = run_tests(own, timeout)
            if args.ref:
                if not m.status.startswith("killed"):
                    m.killed_before = False
                elif m.killed_by and not is_new(m.killed_by, old):
                    m.killed_before = True
                elif m.killed_by and ids:  # every older selected test ran first and passed
                    m.killed_before = False
        finally:
            path.write_text(original)
        print(f"[{i}/{len(todo)}] {m.status:16s} {m.module}:{m.line} [{m.op}] {m.before!r} -> {m.after!r}", flush=True)
        with args.out.open("a") as f:
            f.write(json.dumps(asdict(m)) + "\n")
    by_mod: dict[str, list[int]] = {}
    for m in todo:
        k = by_mod.setdefault(m.module, [0, 0, 0])
        k[0] += m.status.startswith("killed")
        k[1] += 1
        k[2] += bool(m.killed_before)
    for mod, (k, n, kb) in sorted(by_mod.items()):
        print(f"{mod}: {k}/{n} killed" + (f" ({kb} by tests older than {args.ref})" if args.ref else ""))
    return 0


def _terminate(signum, frame):  # a SIGTERM unwinds through the ``finally`` that restores the file
    raise KeyboardInterrupt


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    raise SystemExit(main())
