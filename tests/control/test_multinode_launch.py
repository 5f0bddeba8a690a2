"""spotwise.runtime.launch: real torchrun over real gloo ranks keeps exit 75, not crashes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TOY = Path(__file__).with_name("ddp_toy.py")


def test_a_notice_on_one_rank_makes_all_save_and_the_attempt_75(tmp_path: Path):
    """The rank that got the notice exits 75 and the other, which learnt it from the agreement,
    is stopped by torch's agent on the way out (or exits 75 too): the attempt is 75, not 1."""
    out = tmp_path / "out.log"
    with open(out, "w") as sink:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "spotwise.runtime.launch", "--standalone"),
                *("--nproc-per-node=2", "--no-python", sys.executable, str(TOY), "10000", "0.02"),
            ],
            env={**os.environ, "SPOTWISE_CHECKPOINT_DIR": str(tmp_path / "ckpt")},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    workers: list[int] = []
    try:
        deadline = time.time() + 120
        while out.read_text().count("starts at step 0") < 2:
            assert time.time() < deadline and proc.poll() is None, out.read_text()
            time.sleep(0.1)
        workers += [
            int(p)
            for task in Path(f"/proc/{proc.pid}/task").iterdir()
            for p in (task / "children").read_text().split()
        ]
        assert len(workers) == 2
        os.kill(max(workers), signal.SIGTERM)  # one rank only
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:  # leave nothing running (torch starts ranks in own sessions)
            for pid in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert proc.returncode == 75, text
    assert text.count("saved at step") == 2
    assert (tmp_path / "ckpt" / "step.json").exists()
