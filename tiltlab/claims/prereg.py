"""Pre-registration of the llm rules, proven by git and by file hashes (not declared).

A check's rule (items, margins, units, seeds, verdict mapping) is defined by files: its code, the
shared rule, the claim statements. ``paper_checks/preregistration.toml`` registers, per check, each
file's ``sha256(content)``. For a row of the check run at commit ``r`` with run-time hashes ``h``
(``tiltlab check`` stamps ``rule_hashes`` from the checkout it runs in, :func:`current_hashes`)::

    entry(c) = the check's [[rule]] table (seeds, files) in preregistration.toml as committed at c
    reg      = the oldest commit c of the newest run of commits touching that file, back from r,
               with entry(c) == entry(r)             (the commit that last changed the entry)
    git(c, p)       = sha256(git show c:p)              (the file as committed at c)
    pre-registered  <=>  entry(r) exists  and  merge-base --is-ancestor reg r  and  reg != r
                         and  h == entry(r).files      (same paths, same hashes)
                         and  h[p] == git(r, p)        (the row's hashes are its run commit's files)
                         and  entry(r).files[p] == git(reg, p)   (the registration hashed its own commit's files)

so a rule registered in the run's own commit, a rule file edited after its registration, a check with
no registration, and a results file whose rows carry hashes other than the files of their run commit
(a forged row: the registered hashes copied in) are refused (:func:`verify_row`, one line naming the
check and the file). Every hash is recomputed from git; what a row says about itself is only compared.
The entry is read at the run commit, so registering the next rule later does not unmake a shipped
row. Shipped runs older than this rule are ``[[legacy]]`` entries (:func:`legacy_for`): shown as
such, never shipped again.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tiltlab.claims import paths

__all__ = [
    "PREREG_FILE",
    "PREREG_PATH",
    "current_hashes",
    "file_sha256",
    "git_sha256",
    "legacy_for",
    "legacy_runs",
    "parse_preregistration",
    "prereg_file",
    "preregister_text",
    "preregistration",
    "registration_commit",
    "repo_root",
    "resolve",
    "respecifications",
    "shared_runs",
    "verify_row",
]

#: The registration file, relative to the repository root.
PREREG_PATH = "paper_checks/preregistration.toml"

_REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the registration file

#: A registration file that replaces the data folder's (tests); None: :func:`prereg_file`'s default.
PREREG_FILE: Path | None = None


def prereg_file() -> Path:
    """The registration file: :data:`PREREG_FILE` where set, else ``preregistration.toml`` of the data
    folder (:func:`tiltlab.claims.paths.data_dir`)."""
    return PREREG_FILE if PREREG_FILE is not None else paths.data_dir() / "preregistration.toml"


"""How each llm rule is registered: ``[[rule]]`` tables with ``check`` (a check name), ``seeds``,
``history`` and a ``[rule.files]`` sub-table ``{path: sha256 of its content}`` of the files that define
the rule (no self-declared commit: the registration commit is found with git,
:mod:`tiltlab.claims.prereg`); ``[[legacy]]`` tables mark shipped runs that predate that rule."""


_SHA256 = re.compile(r"[0-9a-f]{64}")


_COMMIT = re.compile(r"[0-9a-f]{7,40}")


def parse_preregistration(data: Mapping[str, Any], where: str = "preregistration.toml") -> dict[str, dict[str, Any]]:
    """``{check name: {"seeds", "history", "files"}}`` of parsed TOML ``data``: ``files`` maps a path
    (relative to the repository root) to the sha256 (64 hex digits) of its content. An entry without a
    positive seed count or files, or one that declares its own ``rule_commit``, is an error."""
    out: dict[str, dict[str, Any]] = {}
    for row in data.get("rule", []):
        name, seeds, files = row.get("check"), row.get("seeds"), row.get("files")
        if "rule_commit" in row:
            raise ValueError(
                f"{where}: [[rule]] {name!r} declares rule_commit; the registration commit is not declared, it is "
                "the commit that last changed the entry (found with git); move a past run to [[legacy]]"
            )
        if not name or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"{where}: a [[rule]] needs check and seeds >= 1, got {row}")
        if not isinstance(files, dict) or not files:
            raise ValueError(f"{where}: [[rule]] {name!r} needs a [rule.files] table {{path = sha256}}, got {files!r}")
        bad = [p for p, h in files.items() if not (isinstance(h, str) and _SHA256.fullmatch(h))]
        if bad:
            raise ValueError(
                f"{where}: [[rule]] {name!r}: {bad[0]} needs a sha256 (64 hex digits), got {files[bad[0]]!r}"
            )
        if name in out:
            raise ValueError(f"{where}: check {name!r} pre-registered twice")
        out[name] = {"seeds": seeds, "history": row.get("history", ""), "files": dict(files)}
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def preregistration(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The registered llm rules of :func:`prereg_file` (:func:`parse_preregistration`; ``{}`` without
    the file)."""
    path = prereg_file() if path is None else Path(path)
    return parse_preregistration(_read_toml(path), str(path)) if path.is_file() else {}


def legacy_runs(path: Path | None = None) -> list[dict[str, str]]:
    """``[{"check", "run_commit", "rule_commit", "reason"}]``: :func:`prereg_file`'s ``[[legacy]]``
    tables, shipped runs that are not strictly pre-registered (kept, marked, never shipped again)."""
    path = prereg_file() if path is None else Path(path)
    if not path.is_file():
        return []
    out = []
    for row in _read_toml(path).get("legacy", []):
        run, rule = row.get("run_commit"), row.get("rule_commit")
        ok = all(isinstance(c, str) and _COMMIT.fullmatch(c) for c in (run, rule))
        if not (row.get("check") and ok and str(row.get("reason", "")).strip()):
            raise ValueError(
                f"{path}: a [[legacy]] needs check, run_commit and rule_commit (7-40 hex digits) and a reason, got {row}"
            )
        out.append({k: str(row[k]) for k in ("check", "run_commit", "rule_commit", "reason")})
    return out


def shared_runs(path: Path | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """``[(run, claims)]``: the experiments that decide more than one claim (:func:`prereg_file`'s
    ``[[shared_run]]`` tables)."""
    path = prereg_file() if path is None else Path(path)
    if not path.is_file():
        return []
    with open(path, "rb") as fh:
        rows = tomllib.load(fh).get("shared_run", [])
    out = []
    for row in rows:
        claims = tuple(row.get("claims", ()))
        if not row.get("run") or len(claims) < 2:
            raise ValueError(f"{path}: a [[shared_run]] needs a run name and at least two claims, got {row}")
        out.append((str(row["run"]), claims))
    return out


def respecifications(path: Path | None = None) -> list[dict[str, Any]]:
    """``[{"claim", "check", "before", "reason", "items": [{"name", "kind", "margin"}]}]``: :func:`prereg_file`'s
    ``[[respecification]]`` tables. Each records that a claim's judged item set was changed after commit
    ``before`` (the last commit under the earlier items; after a run had been judged under them, or after
    its data were known) and keeps the earlier set, so that every run is also shown under the items it was first registered with
    (:func:`tiltlab.claims.rejudge.under_items`); a change of items leaves this trace, never none."""
    path = prereg_file() if path is None else Path(path)
    if not path.is_file():
        return []
    out = []
    for row in _read_toml(path).get("respecification", []):
        items = row.get("items")
        ok = (
            row.get("claim")
            and row.get("check")
            and isinstance(row.get("before"), str)
            and _COMMIT.fullmatch(row["before"])
            and str(row.get("reason", "")).strip()
            and isinstance(items, list)
            and items
        )
        if not ok:
            raise ValueError(
                f"{path}: a [[respecification]] needs claim, check, before (a commit, 7-40 hex digits), a reason and "
                f"the earlier items ([{{name, kind, margin}}, ...]), got {row}"
            )
        parsed = []
        for it in items:
            if not (
                isinstance(it, dict) and it.get("name") and it.get("kind") and isinstance(it.get("margin"), int | float)
            ):
                raise ValueError(
                    f"{path}: [[respecification]] {row['claim']}: an item needs name, kind and margin, got {it}"
                )
            parsed.append({"name": str(it["name"]), "kind": str(it["kind"]), "margin": float(it["margin"])})
        out.append({k: str(row[k]) for k in ("claim", "check", "before", "reason")} | {"items": parsed})
    return out


# --------------------------------------------------------------------------- registration commits and rows


def repo_root(root: Path | None = None) -> Path:
    """``root``, or the checkout holding the code (read at call time, so tests can point it elsewhere)."""
    return Path(_REPO if root is None else root)


def file_sha256(path: Path) -> str | None:
    """sha256 (hex) of the file's bytes; None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def current_hashes(names: Iterable[str], root: Path | None = None) -> dict[str, dict[str, str | None]]:
    """``{check: {path: sha256 now}}`` of the rule files registered for each named check in the
    checkout at ``root`` (a check without a registration gets none; an unreadable file None)."""
    root = repo_root(root)
    entries = preregistration(root / PREREG_PATH)
    return {n: {p: file_sha256(root / p) for p in entries[n]["files"]} for n in names if n in entries}


def _git(root: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo_root(root)), *args], capture_output=True, text=True, check=False, timeout=30
    )


def resolve(commit: str, root: Path | None = None) -> str | None:
    """The full hash of ``commit`` (an abbreviation or ``git describe`` output) in ``root``'s clone."""
    try:
        out = _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _entry_at(commit: str, check: str, root: Path | None) -> dict[str, Any] | None:
    """The check's ``[[rule]]`` table, without its ``history`` prose, as committed at ``commit``
    (None where the file, the entry or valid TOML is missing)."""
    out = _git(root, "show", f"{commit}:{PREREG_PATH}")
    if out.returncode != 0:
        return None
    try:
        rules = tomllib.loads(out.stdout).get("rule", [])
    except tomllib.TOMLDecodeError:
        return None
    for row in rules:
        if isinstance(row, dict) and row.get("check") == check:
            return {k: v for k, v in row.items() if k != "history"}
    return None


def git_sha256(commit: str, path: str, root: Path | None = None) -> str | None:
    """sha256 (hex) of ``path``'s bytes as committed at ``commit`` (``git show commit:path``); None
    where the commit does not hold the file."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo_root(root)), "show", f"{commit}:{path}"],
            capture_output=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256(out.stdout).hexdigest() if out.returncode == 0 else None


def registration_commit(check: str, run: str, root: Path | None = None) -> tuple[str | None, dict[str, Any] | None]:
    """``(reg, entry)``: the check's registration as committed at the full commit ``run`` and the
    commit that last changed it (walking the commits that touch :data:`PREREG_PATH` back from ``run``;
    ``(None, None)`` without an entry)."""
    entry = _entry_at(run, check, root)
    if entry is None:
        return None, None
    log = _git(root, "log", "--format=%H", run, "--", PREREG_PATH)
    reg = None
    for c in log.stdout.split():
        if _entry_at(c, check, root) != entry:
            break
        reg = c
    return reg, entry


def legacy_for(row: Mapping[str, Any], legacy: Iterable[Mapping[str, str]]) -> Mapping[str, str] | None:
    """The ``[[legacy]]`` entry of a shipped row (same check, run commit equal up to abbreviation)."""
    commit = str(row.get("commit_sha") or row.get("commit") or "")
    for leg in legacy:
        run = leg["run_commit"]
        if leg["check"] == row.get("check") and commit and (commit.startswith(run) or run.startswith(commit)):
            return leg
    return None


def verify_row(row: Mapping[str, Any], root: Path | None = None) -> str:
    """The registration commit (full hash) of a check row that is strictly pre-registered (module
    docstring); else ``ValueError``, one line naming the check and, for a hash, the file."""
    check, claim = row.get("check"), row.get("claim")
    who = f"check {check} ({claim})"
    commit = row.get("commit")
    if not commit:
        raise ValueError(f"{who}: the run's commit is unknown (run it from a git checkout)")
    if str(commit).endswith("-dirty"):
        raise ValueError(f"{who}: ran on a modified checkout ({commit}); commit the changes and run it again")
    run = resolve(str(row.get("commit_sha") or commit), root)
    if run is None:
        raise ValueError(f"{who}: its run commit {commit} is not in this clone")
    if row.get("commit_sha") and resolve(str(commit), root) != run:
        raise ValueError(
            f"{who}: its commit {commit} and its full hash {str(row['commit_sha'])[:12]} are different commits"
        )
    reg, entry = registration_commit(str(check), run, root)
    if reg is None or entry is None:
        raise ValueError(f"{who}: no [[rule]] registration in {PREREG_PATH} at its run commit {run[:12]}")
    if reg == run:
        raise ValueError(
            f"{who}: registered in its run commit {run[:12]}, not strictly before it; commit the registration, then run"
        )
    if _git(root, "merge-base", "--is-ancestor", reg, run).returncode != 0:
        raise ValueError(f"{who}: its registration commit {reg[:12]} is not an ancestor of its run commit {run[:12]}")
    have = row.get("rule_hashes")
    if not isinstance(have, Mapping):
        raise ValueError(
            f"{who}: the row carries no run-time rule hashes (run it with `tiltlab check` of this version)"
        )
    files = entry.get("files") or {}
    for path in sorted(set(files) | set(have)):
        if path not in have:
            raise ValueError(f"{who}: {path} is registered at {reg[:12]} but was not hashed at run time")
        if path not in files:
            raise ValueError(f"{who}: {path} was hashed at run time but is not registered at {reg[:12]}")
        at_run = git_sha256(run, path, root)
        if at_run is None:
            raise ValueError(f"{who}: {path} is registered but not in its run commit {run[:12]} (git show)")
        if have[path] != at_run:
            raise ValueError(
                f"{who}: {path}: the row's run-time sha256 {str(have[path])[:12]} is not the file's at its run "
                f"commit {run[:12]} ({at_run[:12]}, git show): the row's hashes do not come from its commit"
            )
        if at_run != files[path]:
            raise ValueError(
                f"{who}: {path} changed after its registration at {reg[:12]} "
                f"(sha256 {at_run[:12]} at run time, {str(files[path])[:12]} registered)"
            )
        at_reg = git_sha256(reg, path, root)
        if at_reg != files[path]:
            raise ValueError(
                f"{who}: {path}: registered sha256 {str(files[path])[:12]} at {reg[:12]} is not the file's at that "
                f"commit ({'absent' if at_reg is None else at_reg[:12]}, git show): the registration did not hash "
                "its own commit's file"
            )
    return reg


_HEADER = re.compile(r"^\s*\[")
_FILE_LINE = re.compile(r'^(\s*"((?:[^"\\]|\\.)*)"\s*=\s*")([0-9a-fA-F]*)(".*)$')
_CHECK_LINE = re.compile(r'^\s*check\s*=\s*"([^"]*)"')


def preregister_text(
    text: str, checks: Iterable[str] | None = None, root: Path | None = None
) -> tuple[str, list[tuple[str, str]]]:
    """``(new text, [(check, path) whose hash changed])``: ``text`` (a preregistration.toml) with the
    sha256 of every ``[rule.files]`` path of the named checks (None: every ``[[rule]]``) set to the
    file's content under ``root`` now (a new path may start as ``"path" = ""``). Every other line is
    kept as it is (comments, history, order); the result must parse as a valid registration."""
    root = repo_root(root)
    names = {r.get("check") for r in tomllib.loads(text).get("rule", []) if isinstance(r, dict)}
    want = {str(n) for n in names if n} if checks is None else set(checks)
    missing = sorted(want - names)
    if missing:
        raise ValueError(
            f"--preregister: check {missing[0]} has no [[rule]] in {PREREG_PATH}; "
            "add one (check, seeds, history, [rule.files] paths) first"
        )
    lines = text.splitlines(keepends=True)
    check, in_files, changed = None, False, []
    for i, line in enumerate(lines):
        if _HEADER.match(line):
            head = line.strip()
            if head == "[[rule]]":
                check, in_files = None, False
            elif head == "[rule.files]":
                in_files = True
            else:
                check, in_files = None, False
            continue
        m = _CHECK_LINE.match(line)
        if m and not in_files:
            check = m.group(1)
            continue
        m = _FILE_LINE.match(line)
        if in_files and check in want and m:
            path = m.group(2)
            sha = file_sha256(root / path)
            if sha is None:
                raise ValueError(f"--preregister: {path} (a rule file of check {check}) cannot be read under {root}")
            if sha != m.group(3):
                changed.append((check, path))
            lines[i] = f"{m.group(1)}{sha}{m.group(4)}" + ("\n" if line.endswith("\n") else "")
    new = "".join(lines)
    after = parse_preregistration(tomllib.loads(new), PREREG_PATH)
    for name in want:  # every registered path was rewritten: nothing left to a layout the scan missed
        stale = [p for p, h in after[name]["files"].items() if h != file_sha256(root / p)]
        if stale:
            raise ValueError(f"--preregister: {stale[0]} of check {name} was not rewritten (keep one path per line)")
    return new, changed
