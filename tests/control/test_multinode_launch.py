"""spotwise.runtime.launch: real torchrun over real gloo ranks keeps exit 75, not crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

TOY = Path(__file__).with_name("ddp_toy.py")


def _launcher(tmp_path: Path, *toy_args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SPOTWISE_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "spotwise.runtime.launch", "--standalone"),
            *("--nproc-per-node=2", "--no-python", sys.executable, str(TOY), *toy_args),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_line(proc: subprocess.Popen[str], needle: str, n: int, out: list[str]) -> None:
    """Read the launcher's output until ``needle`` was seen ``n`` times."""
    assert proc.stdout is not None
    while sum(needle in line for line in out) < n:
        line = proc.stdout.readline()
        assert line, "".join(out)
        out.append(line)


def test_a_notice_on_one_rank_makes_all_save_and_the_attempt_75(tmp_path: Path):
    """The rank that got the notice exits 75 and the other, which learnt it from the agreement,
    is stopped by torch's agent on the way out (or exits 75 too): the attempt is 75, not 1."""
    proc = _launcher(tmp_path, "10000", "0.02")
    out: list[str] = []
    _wait_line(proc, "starts at step 0", 2, out)
    workers = [
        int(p)
        for task in Path(f"/proc/{proc.pid}/task").iterdir()
        for p in (task / "children").read_text().split()
    ]
    assert len(workers) == 2
    os.kill(max(workers), signal.SIGTERM)  # one rank only
    rest, _ = proc.communicate(timeout=60)
    text = "".join(out) + rest
    assert proc.returncode == 75, text
    assert text.count("saved at step") == 2
    assert (tmp_path / "ckpt" / "step.json").exists()
