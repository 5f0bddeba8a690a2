"""The soak script, short: random kill patterns at random moments (interpreter start, a step, a
save), each followed by an immediate restart, end in the uninterrupted run's weights."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_short_soak_stays_identical(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--kills", "4", "--seed", "3",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"soak: 4 kills, \d+ restarts, identical", last), result.stdout
    finished = int(re.search(r"^runs finished: (\d+)$", result.stdout, re.M).group(1))
    # every kill was followed by a restart of the same run directory, unless it came too late
    # and the run had finished
    assert int(last.split()[3]) >= 4 - finished
