"""Disk full, file-size limit and read-only file systems during saves, in real processes: the
error names the cause, a background failure surfaces at a later step, and the checkpoints that
committed before stay intact."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.runtime import list_checkpoints

CHILD = Path(__file__).with_name("_fault_child.py")


def run_child(args: list[str], *, wrap: list[str] | None = None) -> dict:
    env = {**os.environ, "SPOTWISE_PLATFORM": "none"}
    cmd = [*(wrap or []), sys.executable, str(CHILD), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_intact(run_dir: Path, steps: list[int]) -> None:
    infos = list_checkpoints(run_dir, deep=True)
    assert [i.step for i in infos] == steps
    assert all(i.valid for i in infos), [i.problem for i in infos]
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]


def _namespaces_work(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
        capture_output=True,
    )
    return probe.returncode == 0


def in_tmpfs(mnt: Path, size: str) -> list[str]:
    """Run the command in a private mount namespace with a small tmpfs at ``mnt`` (needs
    unprivileged user namespaces; no root mount on the host)."""
    script = f'mount -t tmpfs -o size={size} tmpfs "{mnt}" && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, "sh"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_file_size_limit(tmp_path: Path, mode: str) -> None:
    report = run_child([str(tmp_path / "run"), mode, "fsize"])
    assert report["error"] is not None, "the save under a 4 KiB file-size limit did not fail"
    assert "file too large" in report["error"]
    assert "earlier checkpoints are intact" in report["error"]
    if mode == "async":
        assert "background save failed" in report["error"]
        # the failed save of step 6 surfaces at a later boundary (7, or 8 if still running at 7)
        assert report["failed_at"] in (7, 8)
    else:
        assert report["failed_at"] == 6
    assert_intact(tmp_path / "run", [2, 4])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_disk_full(tmp_path: Path, mode: str) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _namespaces_work(mnt):
        pytest.skip("unprivileged user namespaces are unavailable: cannot mount a small tmpfs")
    # 1 MiB holds three ~300 KiB checkpoints; old ones are deleted only after a commit
    outside = tmp_path / "copy"
    wrap = in_tmpfs(mnt, "1m")
    cmd = [*wrap, "sh", "-c", f'"$0" "$@"; cp -a "{mnt}/run" "{outside}"']
    report = run_child([str(mnt / "run"), mode, "none"], wrap=cmd)
    assert report["error"] is not None and "no space left on the device" in report["error"]
    assert report["failed_at"] in ((9, 10) if mode == "async" else (8,))
    assert_intact(outside, [2, 4, 6])


def test_read_only_file_system(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _namespaces_work(mnt):
        pytest.skip("unprivileged user namespaces are unavailable: cannot mount a tmpfs")
    outside = tmp_path / "copy"
    cmd = [*in_tmpfs(mnt, "8m"), "sh", "-c", f'"$0" "$@"; cp -a "{mnt}/run" "{outside}"']
    report = run_child([str(mnt / "run"), "sync", "readonly", str(mnt)], wrap=cmd)
    assert report["error"] is not None and "read-only" in report["error"]
    assert_intact(outside, [2, 4])
