"""What Run cannot resume exactly is refused at start, with the setting and the fix named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from spotwise.errors import ConfigError
from spotwise.runtime import CheckpointConfig, Run


class Plain(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(6).float().unsqueeze(1))


class Positioned(Plain):
    def state_dict(self) -> dict[str, int]:
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def test_loaders_without_a_position_are_refused(tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    with pytest.raises(ConfigError, match="IterableDataset Plain mid-stream") as err:
        Run(
            tmp_path / "a",
            state={"model": model},
            loader=DataLoader(Plain()),
            steps=3,
            notices=None,
        )
    assert "state_dict()/load_state_dict()" in err.value.hint
    with pytest.raises(ConfigError, match="num_workers=2 over an IterableDataset") as err:
        Run(
            tmp_path / "b",
            state={"model": model},
            loader=DataLoader(Positioned(), num_workers=2),
            steps=3,
            notices=None,
        )
    assert "StatefulDataLoader" in err.value.hint
    data = TensorDataset(torch.arange(8).float())
    with pytest.raises(ConfigError, match="custom samplers") as err:
        Run(
            tmp_path / "c",
            state={"model": model},
            loader=DataLoader(data, sampler=[3, 1, 2]),
            steps=3,
            notices=None,
        )
    assert "StatefulDataLoader(dataset, sampler=...)" in err.value.hint


def test_no_save_inside_an_accumulation_window(tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    loader = DataLoader(TensorDataset(torch.arange(8).float()), batch_size=2)
    run = Run(
        tmp_path,
        state={"model": model},
        loader=loader,
        steps=2,
        accumulate=2,
        checkpoint=CheckpointConfig(every=None),
        notices=None,
    )
    flags = []
    for _ in run:
        flags.append(run.sync_gradients)
        if not run.sync_gradients:
            with pytest.raises(ConfigError, match="inside an accumulation window"):
                run.save()
    # 2 optimizer steps of 2 micro-batches: the loader's position counts micro-batches
    assert flags == [False, True, False, True] and run.step == 2 and run.batch_in_epoch == 4


def test_accelerate_settings_spotwise_cannot_make_exact_are_refused(tmp_path: Path) -> None:
    from accelerate import Accelerator

    from spotwise.integrations.accelerate import accelerated_run

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = torch.nn.Linear(1, 1)
    loader = DataLoader(TensorDataset(torch.arange(8).float()), batch_size=2)
    with pytest.raises(ConfigError, match=r"passed through accelerator\.prepare") as err:
        accelerated_run(
            accelerator, tmp_path / "a", state={"model": model}, loader=accelerator.prepare(loader)
        )
    assert "before prepare()" in err.value.hint
    with pytest.raises(ConfigError, match="accumulate= comes from the Accelerator"):
        accelerated_run(accelerator, tmp_path / "b", state={"model": model}, accumulate=4)
    run = accelerated_run(
        accelerator, tmp_path / "c", state={"model": model}, loader=loader, steps=1, notices=None
    )
    assert run.accumulate == 2
    run.close()
