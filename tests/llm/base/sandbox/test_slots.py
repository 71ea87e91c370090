"""llm.base.sandbox.slots: the per-run uid slots (the documented formula, rotation, a uid still in use)."""

import os
import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tests.llm.base.sandbox._helpers import FAST, REPORT, needs_bwrap
from tiltlab.llm.base.sandbox import SandboxConfig, run_python, slots

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


def test_slot_uid_is_the_documented_formula():
    cfg = SandboxConfig(uid_base=0x60000000)
    base = 0x60000000 + 256 * (os.getpid() % 4096)
    assert [slots._slot_uid(cfg, k) for k in (None, 0, 1, 255)] == [base, base, base + 1, base + 255]
    for bad in (256, -1):
        with pytest.raises(RuntimeError, match="at most 256"):
            slots._slot_uid(cfg, bad)


@needs_bwrap
@pytest.mark.skipif(not REPORT["parent_is_root"], reason="as an ordinary user the candidate is uid 65534")
def test_a_run_as_root_gets_a_uid_of_this_process_slots():
    lo = SandboxConfig().uid_base + 256 * (os.getpid() % 4096)
    r = run_python("import os\nprint(os.getuid(), os.getgid())", FAST)
    uid, gid = map(int, r.stdout.split())
    assert r.passed and lo <= uid < lo + 256 and gid == uid


def test_uid_slots_rotate_and_skip_uids_still_in_use(monkeypatch):
    alive = {3}
    monkeypatch.setattr(slots, "_slot_next", [2])
    with slots._uid_slot(lambda k: k) as a, slots._uid_slot(lambda k: k) as b:
        pass
    with slots._uid_slot(lambda k: k) as c:
        pass
    assert (a, b, c) == (2, 3, 4)  # rotating, not reusing the slot just released
    monkeypatch.setattr(slots, "_uid_alive", lambda uid: uid in alive)
    monkeypatch.setattr(slots, "_slot_next", [3])
    with slots._uid_slot(lambda k: k) as d:
        pass
    assert d == 4  # slot 3's uid still has a process


@needs_bwrap
def test_successive_runs_get_new_uids():
    if not REPORT["parent_is_root"]:
        pytest.skip("as an ordinary user every run is uid 65534 of its own user namespace")
    uids = [int(run_python("import os\nprint(os.getuid())", FAST).stdout) for _ in range(3)]
    assert len(set(uids)) == 3
