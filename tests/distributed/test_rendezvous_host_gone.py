"""Two nodes under spotwise's launcher, node 0's machine taken (its launcher and rank SIGKILLed):
the rendezvous store lived in node 0's launcher, so node 1's launcher loses it while its own rank
still runs. That is a lost node, not an error of node 1: its attempt must end 75 (interrupted),
so the controller relaunches the job instead of counting a failure against it."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwise.exitcode import EXIT_INTERRUPTED

from .conftest import finish

pytestmark = pytest.mark.e2e

# a rank that takes part in no collective: the only thing node 1 can lose is the rendezvous
RANK = """
import os, sys, time
print(f"rank {os.environ['GROUP_RANK']} ready pid {os.getpid()}", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _node(rank: int, port: int, script: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "spotwise.runtime.launch", "--nnodes=2", "--nproc-per-node=1"]
    argv += [f"--node-rank={rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
    argv += [f"--rdzv-conf=is_host={'true' if rank == 0 else 'false'}", "--rdzv-id=lost-host"]
    argv += [str(script), "120"]  # bounded: a failed test leaves nothing behind for long
    env = {**os.environ, "SPOTWISE_PLATFORM": "none", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _ready_pid(node: subprocess.Popen[str], timeout: float = 120) -> int:
    """The pid its rank printed once the two nodes met (read line by line from its pipe)."""
    assert node.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    for line in node.stdout:
        seen.append(line)
        found = re.search(r"rank \d+ ready pid (\d+)", line)
        if found:
            return int(found.group(1))
        assert time.monotonic() < deadline, "".join(seen)[-3000:]
    raise AssertionError("".join(seen)[-3000:])


def test_a_node_whose_rendezvous_host_is_gone_ends_interrupted(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = _free_port()
    host, other = _node(0, port, script), _node(1, port, script)
    try:
        host_rank = _ready_pid(host)
        _ready_pid(other)
        # node 0's machine is gone: its launcher's group and its rank's own session
        os.killpg(host.pid, signal.SIGKILL)
        os.killpg(host_rank, signal.SIGKILL)
        rc, out = finish(other, timeout=120)
    finally:
        for node in (host, other):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
            node.communicate()
    assert rc == EXIT_INTERRUPTED, out[-3000:]
    assert "the rendezvous host (node 0) is gone" in out, out[-3000:]
