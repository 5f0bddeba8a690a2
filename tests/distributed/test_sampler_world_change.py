"""World-size changes mid-epoch with real processes: a single process interrupted mid-epoch is
resumed by two torchrun ranks (gloo), which are interrupted in the next epoch and resumed by a
single process again. The per-sample logs show each sample of both epochs exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

CHILD = str(Path(__file__).with_name("_sampler_child.py"))
SIZE = 45  # the child's dataset: 45 samples, batches of 4 per rank


def child(workdir: Path, *args: str, ranks: int = 0) -> None:
    launcher = [sys.executable]
    if ranks:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    env = {**os.environ, "SPOTWISE_PLATFORM": "none", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*launcher, CHILD, str(workdir), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def logged(workdir: Path, tags: list[str]) -> dict[int, Counter[int]]:
    per_epoch: dict[int, Counter[int]] = {}
    for path in workdir.glob("log.*.txt"):
        if path.name.split(".")[1] in tags:
            for epoch, sample in (line.split() for line in path.read_text().splitlines()):
                per_epoch.setdefault(int(epoch), Counter())[int(sample)] += 1
    return per_epoch


@pytest.mark.e2e
def test_world_1_to_2_to_1_mid_epoch_sees_each_sample_once(tmp_path: Path) -> None:
    child(tmp_path, "one", "-", "0:3", "a")  # world 1: 3 of epoch 0's 12 batches
    # world 2: the rest of epoch 0 (33 samples: 3 steps of 8, then 5 + 4 so both ranks train
    # on every step), then 2 steps of epoch 1
    child(tmp_path, "two", "a", "0:end,1:2", "b", ranks=2)
    saved = [json.loads((tmp_path / f"b.rank{r}.json").read_text()) for r in range(2)]
    assert saved[0] == saved[1]  # one state for all ranks: rank 0 can save it alone
    assert (saved[0]["epoch"], saved[0]["consumed"], saved[0]["world"]) == (1, 16, 2)
    child(tmp_path, "three", "b", "1:end", "-")  # world 1 again: the rest of epoch 1

    every = Counter(range(SIZE))
    assert logged(tmp_path, ["one", "two", "three"]) == {0: every, 1: every}
    # each part took its share: the world-1 start, then the two ranks, then world 1
    part = logged(tmp_path, ["one"])[0]
    assert sum(part.values()) == 12
    ranks = [
        sum(1 for _ in (tmp_path / f"log.two.rank{r}.txt").read_text().splitlines())
        for r in range(2)
    ]
    assert ranks == [3 * 4 + 3 + 2 + 2 * 4, 3 * 4 + 2 + 2 + 2 * 4]
