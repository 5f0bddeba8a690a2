"""Links planted in a run directory are never followed out of it, by real training processes.

A run directory and its mirror (a local object store) are filled by ``spotwise.Run``, then links
to files and directories *outside* are planted where the runtime opens, removes and renames
entries: the newest step directory (skipped at resume, then saved and uploaded again: the
fallback path), older step directories and files inside one (retention, local and in the
store), leftovers of unfinished saves (cleanup) and the event log (events, and the metrics
recorded as events). A second process resumes and trains on with ``keep_last=1``. Every file
outside must keep its bytes and mtime, and each link must be gone or unused.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.checkpoint.format import MANIFEST, STATE_FILE, TENSORS_FILE, step_dir_name
from spotwise.runtime.commit import list_checkpoints, verify_checkpoint
from spotwise.runtime.tiered import push
from spotwise.storage.local import LocalStorage
from spotwise.telemetry.events import EVENTS_FILE, EventLog, read_events

sys.path.insert(0, str(Path(__file__).parent))
from _link_child import train

pytestmark = pytest.mark.timeout(180)
CHILD = Path(__file__).with_name("_link_child.py")


def train_in_child(run_dir: Path, store: Path, steps: int, keep_last: int) -> dict:
    env = {**os.environ, "SPOTWISE_PLATFORM": "none"}
    cmd = [sys.executable, str(CHILD), str(run_dir), str(store), str(steps), str(keep_last)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class Canary:
    """Every file under ``root``, with its bytes and mtime, to compare after the run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen = self._now()

    def _now(self) -> dict[str, tuple[bytes, int]]:
        return {
            str(p.relative_to(self.root)): (p.read_bytes(), p.lstat().st_mtime_ns)
            for p in sorted(self.root.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }

    def assert_untouched(self) -> None:
        now = self._now()
        assert sorted(now) == sorted(self.seen), "files appeared or vanished outside"
        changed = [name for name, value in self.seen.items() if now[name] != value]
        assert not changed, f"written outside the run directory: {changed}"


def test_links_planted_in_a_run_directory_are_never_followed(tmp_path: Path) -> None:
    run, store, outside = tmp_path / "run", tmp_path / "store", tmp_path / "outside"
    assert train(run, store, 6, keep_last=10) == {"resumed": None, "step": 6}
    if not (store / step_dir_name(4)).is_dir():  # the mirror uploads only the newest pending
        push(LocalStorage(store), run / step_dir_name(4))  # one; the store needs an older one
    # outside: a valid checkpoint of step 8 (step 6's, renumbered), a directory of files
    # named like a checkpoint's, and a file a log could be appended to
    shutil.copytree(run / step_dir_name(6), outside / step_dir_name(8))
    manifest = json.loads((outside / step_dir_name(8) / MANIFEST).read_text())
    manifest["step"] = 8
    del manifest["kind"]  # its run state still says step 6: a checkpoint of no Run
    (outside / step_dir_name(8) / MANIFEST).write_text(json.dumps(manifest))
    assert verify_checkpoint(outside / step_dir_name(8), step=8).valid
    decoy = outside / "decoy"
    decoy.mkdir()
    for name in (MANIFEST, STATE_FILE, TENSORS_FILE):
        (decoy / name).write_text(f"canary {name}\n")
    (outside / "log").write_text('{"time": 1, "kind": "canary"}\n')
    canary = Canary(outside)

    plants = {
        step_dir_name(8): outside / step_dir_name(8),  # newest: skipped, then saved again
        step_dir_name(1): decoy,  # older: retention removes it
        ".tmp-step-00000009-deadbeef": decoy,  # an unfinished save: cleanup removes it
        ".trash-step-00000007-deadbeef": decoy,
        EVENTS_FILE: outside / "log",  # events and the metrics recorded as events
    }
    os.unlink(run / EVENTS_FILE)
    for name, target in plants.items():
        (run / name).symlink_to(target)
    for name in (step_dir_name(8), step_dir_name(1)):  # the same in the store
        (store / name).symlink_to(plants[name])
    for root in (run, store):  # real step directories with links inside
        ckpt = root / step_dir_name(4)
        (ckpt / STATE_FILE).unlink()
        (ckpt / STATE_FILE).symlink_to(decoy / STATE_FILE)
        (ckpt / "sub").symlink_to(decoy)

    assert train_in_child(run, store, 12, keep_last=1) == {"resumed": 6, "step": 12}

    canary.assert_untouched()
    assert verify_checkpoint(outside / step_dir_name(8), step=8).valid
    left = sorted(os.listdir(run))
    assert left == [".lock", EVENTS_FILE, step_dir_name(12)], left
    assert (run / EVENTS_FILE).is_symlink()  # refused as it is, never written through
    assert [c.step for c in list_checkpoints(run, deep=True) if c.valid] == [12]
    assert (store / step_dir_name(12) / MANIFEST).is_file()


def test_event_log_neither_writes_nor_reads_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"time": 1, "kind": "secret"}\n')
    canary = Canary(tmp_path)
    (tmp_path / "run").mkdir()
    planted = tmp_path / "run" / EVENTS_FILE
    planted.symlink_to(outside)
    EventLog(planted).emit("start", step=0)
    assert read_events(planted) == []  # what the dashboard and the controller read
    canary.assert_untouched()
    os.unlink(planted)
    os.mkfifo(planted)  # a FIFO with no reader: the write fails at once instead of blocking
    EventLog(planted).emit("start", step=0)
    assert read_events(planted) == []
