"""Walking the process tree while it changes: a process that ends between being listed and
being read is no error (it crashed `spotwise run` with a traceback instead of exit 75, when the
program's children exited as the notice was forwarded)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from spotwise.proctree import children, descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# a shell that keeps starting short-lived children and reaping them
CHURN = "while true; do for i in 1 2 3 4 5 6 7 8; do (sleep 0.00$i) & done; wait; done"


def test_walking_a_tree_whose_processes_keep_ending_never_raises() -> None:
    # the walk before this fix raised within 250-550 calls (0.08-0.15 s) in 5 of 5 tries
    shell = subprocess.Popen(["bash", "-c", CHURN])
    seen = calls = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            calls += 1
            seen += bool(descendants(shell.pid, running=True))
    finally:
        shell.kill()
        shell.wait()
    assert calls > 1000
    assert seen > 0  # the walk did find the children it raced with


def test_the_tree_below_a_process_and_its_zombies() -> None:
    # a child in a session of its own with a grandchild, and a child that ends unreaped
    script = (
        "import os, subprocess, sys, time\n"
        "grand = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "gone = subprocess.Popen(['true'])\n"
        "time.sleep(0.5)\n"
        "print(grand.pid, child.pid, gone.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        grand, child, gone = (int(p) for p in parent.stdout.readline().split())
        assert sorted(children(parent.pid)) == sorted([grand, child, gone])
        assert sorted(descendants(parent.pid)) == sorted([grand, child, gone])
        assert sorted(descendants(parent.pid, running=True)) == sorted([grand, child])
    finally:
        for pid in descendants(parent.pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.kill()
        parent.wait()


def test_a_process_that_is_gone_has_nothing_below_it() -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()
    assert children(ended.pid) == [] and descendants(ended.pid) == []
