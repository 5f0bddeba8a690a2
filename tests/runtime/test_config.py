"""Run's shape: one mapping of stateful objects, one validated checkpoint config, the
environment read at the edge."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from spotwise import CheckpointConfig
from spotwise.errors import ConfigError
from spotwise.runtime import Run, load_newest_valid, write_checkpoint


def test_config_is_validated_and_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOTWISE_MTBI_S", "120")
    config = CheckpointConfig(every="10m", keep_last=2)
    assert config.mtbi == 3600.0 and config.schedule.seconds == 600.0
    assert config.with_environment({"SPOTWISE_MTBI_S": "120"}).mtbi == 120.0
    assert CheckpointConfig(mtbi_s=60).with_environment({"SPOTWISE_MTBI_S": "120"}).mtbi == 60.0
    with pytest.raises(ConfigError, match="SPOTWISE_MTBI_S='soon' is not a number"):
        config.with_environment({"SPOTWISE_MTBI_S": "soon"})
    with pytest.raises(ConfigError, match="keep_last must be at least 1"):
        CheckpointConfig(keep_last=0)
    with pytest.raises(ConfigError, match="mtbi_s must be a positive number"):
        CheckpointConfig(mtbi_s=-1)
    with pytest.raises(ConfigError, match=r"invalid checkpoint interval every=.often."):
        CheckpointConfig(every="often")


def test_state_mapping_and_keyword_spellings_are_one_mapping(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = CheckpointConfig(every=None)
    with Run(
        tmp_path / "a",
        state={"net": model},
        optimizer=opt,
        steps=2,
        checkpoint=config,
        notices=None,
    ) as run:
        assert set(run.state) == {"net", "optimizer"}
        for _ in run:
            pass
    assert set(load_newest_valid(tmp_path / "a").doc["state"]) == {"net", "optimizer"}
    with pytest.raises(ConfigError, match=r"not both.*also given: keep_last"):
        Run(tmp_path / "b", model=model, checkpoint=config, keep_last=5, notices=None)
    with pytest.raises(ConfigError, match="two objects are named 'model'"):
        Run(tmp_path / "c", state={"model": model}, model=model, notices=None)
    with pytest.raises(ConfigError, match=r"'extra' \(int\) has no state_dict"):
        Run(tmp_path / "d", state={"extra": 3}, notices=None)
    with pytest.raises(ConfigError, match="accumulate must be a whole number"):
        Run(tmp_path / "e", model=model, accumulate=0, notices=None)


def test_mirror_and_local_dir_beside_checkpoint_still_work_and_warn(tmp_path: Path) -> None:
    """Run's own keywords until they moved into CheckpointConfig: merged into checkpoint=, not
    refused like 0.1's (code of that time passed both), and never given twice."""
    model = torch.nn.Linear(3, 2)
    with pytest.warns(DeprecationWarning, match=r"local_dir= -> checkpoint=CheckpointConfig"):
        run = Run(
            "memory://beside",
            state={"model": model},
            checkpoint=CheckpointConfig(every=7),
            local_dir=tmp_path / "stage",
            notices=None,
        )
    with run:
        assert run.config.every == 7 and run.config.local_dir == tmp_path / "stage"
        assert run.run_dir == tmp_path / "stage"
    with pytest.raises(ConfigError, match=r"local_dir= is given twice"):
        Run(
            "memory://beside",
            state={"model": model},
            checkpoint=CheckpointConfig(local_dir=tmp_path / "a"),
            local_dir=tmp_path / "b",
            notices=None,
        )


def test_a_version_1_checkpoint_still_resumes(tmp_path: Path) -> None:
    """Written the way the previous release laid the state out (four fixed sections)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with Run(
        tmp_path / "new", state={"model": model, "optimizer": opt}, steps=2, notices=None
    ) as run:
        for _ in run:
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
    loaded = load_newest_valid(tmp_path / "new")
    assert loaded is not None
    state = dict(loaded.state)
    entries = state.pop("state")
    state["spotwise"] = {k: v for k, v in state["spotwise"].items() if k != "accumulate"}
    state["spotwise"]["version"] = 1
    state.update(
        models={"main": entries["model"]},
        optimizers={"main": entries["optimizer"]},
        schedulers={},
        scalers={},
    )
    write_checkpoint(tmp_path / "old", 2, dict(loaded.tensors), state)
    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    resumed = Run(
        tmp_path / "old", state={"model": other, "optimizer": other_opt}, steps=2, notices=None
    )
    assert resumed.step == 2 and resumed.resumed_from is not None
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters(), strict=True)
    )
    assert other_opt.state_dict()["state"][0]["momentum_buffer"] is not None
    resumed.close()


def test_a_notices_argument_that_is_no_source_is_refused_by_name(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="notices='sigterm' is not a notice source") as err:
        Run(tmp_path / "run", state={"model": model}, steps=1, notices="sigterm")
    assert "'auto', None" in str(err.value.hint)
