"""A distributed Run's rank chooses how its large files reach the disk as a single process does
(one real gloo rank in this process): its first large save directly, the next through the page
cache, later ones the way this rank measured faster, background saves alike; the checkpoints
kept pass every check, and the resume from the last one is exact."""

from __future__ import annotations

from pathlib import Path

import torch

from spotwise import CheckpointConfig, Run
from spotwise.runtime.commit import list_checkpoints
from spotwise.telemetry.events import EVENTS_FILE, read_events


def test_a_rank_tries_the_page_cache_and_keeps_the_faster_way(
    tmp_path: Path, one_rank: None
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3000, 3000)  # 36 MB of weights: large enough to measure
    run = Run(tmp_path, state={"model": model}, notices=None, checkpoint=CheckpointConfig())
    for step in range(1, 6):
        with torch.no_grad():
            model.weight.add_(1.0)
        run.step = step
        run.save(block=step % 2 == 1)  # blocking and background saves alike
    run.close()
    saves = read_events(tmp_path / EVENTS_FILE, "checkpoint")
    assert [e["step"] for e in saves] == [1, 2, 3, 4, 5]
    written = [e["written"] for e in saves]
    assert written[:2] == ["direct", "page cache"]
    assert set(written) <= {"direct", "page cache"}  # later: whichever this rank measured faster
    kept = list_checkpoints(tmp_path, deep=True)
    assert [c.step for c in kept] == [3, 4, 5] and all(c.valid for c in kept)
    expected = model.weight.detach().clone()

    fresh = torch.nn.Linear(3000, 3000)
    resumed = Run(tmp_path, state={"model": fresh}, notices=None)
    assert resumed.step == 5
    assert torch.equal(fresh.weight, expected)
    resumed.close()
