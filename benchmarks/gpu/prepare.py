"""Companion of benchmarks/gpu/run.py, run HERE (where PyPI is reachable): the wheels the GPU machine lacks.

The device machine (one H100/H200, Python 3.12, torch 2.11+cu130, transformers 5.17, accelerate 1.15,
peft, triton, pytest, pyarrow, pandas, ...) reaches no package index, and has no TRL, no Liger-Kernel and
no ``datasets``. This script downloads the pinned wheels of :data:`PINS` into ``.whl/`` (ignored by git;
the device call carries it), writes ``benchmarks/gpu/manifest.json`` (name, version, file name,
sha256, size; committed) and a stamp ``.whl/STAMP.json`` with this checkout's git commit (the device may
receive the tree without ``.git``; run.py falls back to it).

The pins are the three packages plus what their ``Requires-Dist`` needs that the device lacks:
``datasets`` needs ``dill`` and ``multiprocess``; everything else they require (torch, triton,
transformers, accelerate, numpy, pandas, pyarrow, fsspec, huggingface-hub, ...) is on the device
(:data:`DEVICE_HAS`). The download step re-reads every wheel's METADATA and fails if a requirement is
neither pinned nor on the device, or if a pinned version violates another pin's specifier.
``datasets`` is 5.0.0, not the newest: 5.1 and later require ``pyarrow>=24`` and the device's pyarrow
version is not known here; 5.0.0 requires ``pyarrow>=21``.

    python benchmarks/gpu/prepare.py            # download (or reuse) .whl/, write the manifest, verify
    python benchmarks/gpu/prepare.py --verify   # check .whl/ against the manifest (stdlib only; the device runs it)

``--verify`` fails when a manifest file is missing or has another sha256, when ``.whl/`` holds a wheel the
manifest does not list (two versions of one package stop the device's ``pip install``), or when the
total exceeds :data:`MAX_TOTAL_BYTES`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WHEEL_DIR = REPO / ".whl"
MANIFEST = HERE / "manifest.json"
STAMP = "STAMP.json"
MAX_TOTAL_BYTES = 30 * 2**20
"""The wheels travel with the working tree (64 MiB per call, the tree included): at most 30 MiB."""

PINS: dict[str, str] = {
    "trl": "1.16.0",  # the TRL the project tests (pyproject: trl>=1.10.0,<1.17)
    "liger-kernel": "0.8.5",  # the fused linear cross-entropy the fused log-prob path is measured against
    "datasets": "5.0.0",  # TRL imports it; 5.0.0 requires pyarrow>=21 (5.1+: >=24, unknown on the device)
    "dill": "0.4.1",  # datasets: dill>=0.3.0,<0.4.2
    "multiprocess": "0.70.19",  # datasets: multiprocess<0.70.20; it requires dill>=0.4.1
}
"""One version of each package the device lacks."""

DEVICE_HAS: dict[str, str | None] = {
    "torch": "2.11.0",
    "triton": "3.6.0",
    "transformers": "5.17.0",
    "accelerate": "1.15.0",
    "numpy": "2.5.2",
    "huggingface-hub": "1.33.0",
    "tokenizers": "0.23.2",
    "safetensors": "0.8.0",
    "peft": None,
    "pandas": None,
    "pyarrow": None,
    "fsspec": None,
    "filelock": None,
    "packaging": None,
    "pyyaml": None,
    "tqdm": None,
    "xxhash": None,
    "psutil": None,
    "jinja2": None,
    "requests": None,
    "httpx": None,
    "aiohttp": None,
    "pytest": None,
}
"""Packages on the device image (.library device notes, 2026-11), with the versions a session's
``pip list`` showed there (None: present, version not recorded)."""

PIP_PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *[
        a
        for p in (
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux1_x86_64",
        )
        for a in ("--platform", p)
    ],
]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _wheel_name_version(path: Path) -> tuple[str, str]:
    parts = path.name[: -len(".whl")].split("-")
    return _norm(parts[0]), parts[1]


def _metadata(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(meta).decode("utf-8")


# ----------------------------------------------------------------------------------------------- verify


def verify(wheel_dir: Path, manifest_path: Path) -> list[str]:
    """The problems of ``wheel_dir`` against ``manifest_path`` (empty: all good). Standard library only."""
    if not manifest_path.is_file():
        return [f"no manifest at {manifest_path}"]
    manifest = json.loads(manifest_path.read_text())
    wheels = manifest.get("wheels", [])
    problems = []
    listed = {w["filename"] for w in wheels}
    total = 0
    for w in wheels:
        f = wheel_dir / w["filename"]
        if not f.is_file():
            problems.append(f"missing: {w['filename']}")
            continue
        total += f.stat().st_size
        digest = _sha256(f)
        if digest != w["sha256"]:
            problems.append(f"sha256 mismatch: {w['filename']}: {digest} != manifest {w['sha256']}")
    names = [w["name"] for w in wheels]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        problems.append(f"the manifest lists more than one version of {dup}")
    if wheel_dir.is_dir():
        extra = sorted(p.name for p in wheel_dir.glob("*.whl") if p.name not in listed)
        if extra:
            problems.append(f"wheels not in the manifest (the device installs every .whl): {extra}")
    limit = int(manifest.get("max_total_bytes", MAX_TOTAL_BYTES))
    if total > limit:
        problems.append(f"total {total} bytes exceeds {limit}")
    return problems


# ----------------------------------------------------------------------------------------------- download


def _requirements_problems(paths: list[Path]) -> list[str]:
    """Every non-extra ``Requires-Dist`` of the pinned wheels is pinned or on the device, and its
    specifier accepts the pinned (or the device's recorded) version."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import Version

    env = dict(default_environment(), python_version="3.12", python_full_version="3.12.3")
    env.update(sys_platform="linux", platform_system="Linux", platform_machine="x86_64", implementation_name="cpython")
    pinned = {_norm(k): v for k, v in PINS.items()}
    device = {_norm(k): v for k, v in DEVICE_HAS.items()}
    problems = []
    for path in paths:
        who = _wheel_name_version(path)[0]
        for line in _metadata(path).splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue  # an extra's requirement, or another platform's
            name = _norm(req.name)
            have = pinned.get(name, device.get(name, "absent"))
            if have == "absent":
                problems.append(f"{who} requires {req}: neither pinned (PINS) nor on the device (DEVICE_HAS)")
            elif have is not None and not req.specifier.contains(Version(have), prereleases=True):
                problems.append(f"{who} requires {req}, but {name} {have} is pinned / on the device")
    return problems


def _git_stamp() -> dict:
    def git(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def prepare(wheel_dir: Path, manifest_path: Path) -> int:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    pinned = {_norm(k): v for k, v in PINS.items()}
    for p in sorted(wheel_dir.glob("*.whl")):  # one version of each: drop what the pins no longer name
        name, version = _wheel_name_version(p)
        if pinned.get(name) != version:
            print(f"removing {p.name} (not pinned)")
            p.unlink()
    have = {_wheel_name_version(p)[0] for p in wheel_dir.glob("*.whl")}
    todo = [f"{k}=={v}" for k, v in PINS.items() if _norm(k) not in have]
    if todo:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *PIP_PLATFORM, "-d", str(wheel_dir), *todo]
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    paths = sorted(wheel_dir.glob("*.whl"))
    got = {_wheel_name_version(p) for p in paths}
    missing = [f"{k}=={v}" for k, v in PINS.items() if (_norm(k), v) not in got]
    if missing:
        print(f"error: not downloaded: {missing}", file=sys.stderr)
        return 1
    problems = _requirements_problems(paths)
    if problems:
        print("error: the pinned wheels' requirements are not covered:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    wheels = []
    for p in paths:
        name, version = _wheel_name_version(p)
        wheels.append(
            {"name": name, "version": version, "filename": p.name, "sha256": _sha256(p), "bytes": p.stat().st_size}
        )
    total = sum(w["bytes"] for w in wheels)
    manifest = {
        "about": "wheels carried to the GPU machine for benchmarks/gpu/run.py; written by benchmarks/gpu/prepare.py",
        "python": "3.12",
        "platform": "manylinux x86_64 (pure-Python wheels: py3-none-any)",
        "max_total_bytes": MAX_TOTAL_BYTES,
        "total_bytes": total,
        "wheels": wheels,
    }
    text = json.dumps(manifest, indent=2) + "\n"
    old = manifest_path.read_text() if manifest_path.is_file() else None
    manifest_path.write_text(text)
    print(f"manifest {'unchanged' if old == text else 'written'}: {manifest_path}")
    stamp = {**_git_stamp(), "written": datetime.now(UTC).isoformat(timespec="seconds")}
    (wheel_dir / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    for w in wheels:
        print(f"  {w['filename']:<48} {w['bytes'] / 2**20:6.2f} MiB  sha256 {w['sha256'][:16]}...")
    print(f"  total {total / 2**20:.2f} MiB in {len(wheels)} wheels (limit {MAX_TOTAL_BYTES / 2**20:.0f} MiB)")
    problems = verify(wheel_dir, manifest_path)
    if problems:
        print("error: " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"stamp: {stamp}")
    print('next: the device call of benchmarks/gpu/README.md (carry: [".whl"])')
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--verify", action="store_true", help="only check the wheel folder against the manifest")
    p.add_argument("--dir", type=Path, default=WHEEL_DIR, help="wheel folder (default: .whl/ at the repo root)")
    p.add_argument(
        "--manifest", type=Path, default=MANIFEST, help="manifest path (default: benchmarks/gpu/manifest.json)"
    )
    args = p.parse_args(argv)
    if args.verify:
        problems = verify(args.dir, args.manifest)
        if problems:
            print("wheel check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        n = len(json.loads(args.manifest.read_text())["wheels"])
        print(f"wheel check passed: {n} wheels in {args.dir} match {args.manifest}")
        return 0
    return prepare(args.dir, args.manifest)


if __name__ == "__main__":
    raise SystemExit(main())
