"""Real (tiny) training loops for the runtime tests, and a scriptable notice source."""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from spotwise.notices.base import Notice, NoticeKind
from spotwise.runtime import CheckpointConfig, Run


class NoisyDataset(Dataset):
    """Map-style data whose items draw from the torch, NumPy and Python RNGs, like random
    augmentation does, so that worker seeding matters."""

    def __init__(self, size: int = 70) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, 8, generator=generator)
        self.y = torch.randint(0, 3, (size,), generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        jitter = 0.01 * torch.rand(8) + 0.001 * float(np.random.rand()) + 0.001 * random.random()
        return self.x[i] + jitter, self.y[i]


@dataclass
class Trained:
    records: list[tuple[int, int, str, str]]  # (step, epoch, batch digest, loss.hex())
    weights: str
    run: Run


def weights_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for _, tensor in sorted(model.state_dict().items()):
        digest.update(tensor.detach().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def train(
    run_dir: Path,
    steps: int,
    *,
    stop_after: int | None = None,
    workers: int = 0,
    checkpoint: CheckpointConfig = CheckpointConfig(every=5),
    hidden: int = 16,
    sleep_s: float = 0.0,
    **run_kwargs: Any,
) -> Trained:
    """Train a small dropout MLP with Adam, a scheduler and a shuffling loader. ``stop_after``
    abandons the loop after that step's body (before its boundary), like a crash."""
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    loader = DataLoader(NoisyDataset(), batch_size=8, shuffle=True, num_workers=workers)
    run_kwargs.setdefault("notices", None)
    run = Run(
        run_dir,
        state={"model": model, "optimizer": optimizer, "scheduler": scheduler},
        loader=loader,
        steps=steps,
        checkpoint=checkpoint,
        **run_kwargs,
    )
    records = []
    for x, y in run:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step = run.step + 1
        digest = hashlib.sha1(x.numpy().tobytes()).hexdigest()[:12]
        records.append((step, run.epoch, digest, loss.item().hex()))
        if sleep_s:
            time.sleep(sleep_s)
        if stop_after is not None and step == stop_after:
            break
    run.close()
    return Trained(records, weights_digest(model), run)


@pytest.fixture()
def trainer():
    return train


@dataclass
class ScriptedNotices:
    """An in-memory NoticeSource: ``at_step[n]`` is returned from the n-th call of current()."""

    at_call: dict[int, Notice] = field(default_factory=dict)
    calls: int = 0
    acknowledged: list[Notice] = field(default_factory=list)
    closed: bool = False

    def current(self) -> Notice | None:
        self.calls += 1
        return self.at_call.get(self.calls)

    def acknowledge(self, notice: Notice) -> None:
        self.acknowledged.append(notice)

    def close(self) -> None:
        self.closed = True


def make_notice(kind: NoticeKind, received: float = 1.0) -> Notice:
    return Notice(
        source="fake",
        kind=kind,
        received_monotonic=received,
        deadline_monotonic=None,
        action=kind.value,
    )


@pytest.fixture()
def scripted_notices():
    return ScriptedNotices, make_notice
