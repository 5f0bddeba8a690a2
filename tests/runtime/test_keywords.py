"""Run's 0.1 flat keywords (``model=``, ``every=``...) still work for a release, warn with the
replacement, and mean exactly what ``state=`` and ``checkpoint=`` mean."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from spotwise import CheckpointConfig, Run
from spotwise.runtime import list_checkpoints, load_newest_valid


def _train(run: Run, model: torch.nn.Linear, opt: torch.optim.Optimizer) -> None:
    for _ in run:
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_flat_keywords_warn_and_save_what_state_and_checkpoint_save(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(DeprecationWarning) as caught:
        old = Run(tmp_path / "old", model=model, optimizer=opt, steps=4, every=2, keep_last=1,
                  notices=None)  # fmt: skip
    message = str(caught[0].message)
    assert 'model=, optimizer= -> state={"model": ..., "optimizer": ...}' in message
    assert "every=, keep_last= -> checkpoint=CheckpointConfig(every=..., keep_last=...)" in message
    assert caught[0].filename == __file__  # points at the caller's line
    assert old.config == CheckpointConfig(every=2, keep_last=1)
    _train(old, model, opt)

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the new spelling warns of nothing
        new = Run(tmp_path / "new", state={"model": model, "optimizer": opt}, steps=4,
                  checkpoint=CheckpointConfig(every=2, keep_last=1), notices=None)  # fmt: skip
    _train(new, model, opt)

    assert [c.step for c in list_checkpoints(tmp_path / "old")] == [4]
    assert [c.step for c in list_checkpoints(tmp_path / "new")] == [4]
    before, after = load_newest_valid(tmp_path / "old"), load_newest_valid(tmp_path / "new")
    assert before is not None and after is not None
    assert before.doc["state"].keys() == after.doc["state"].keys() == {"model", "optimizer"}
    assert all(torch.equal(before.tensors[k], after.tensors[k]) for k in before.tensors)


def test_a_keyword_run_never_had_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'keep_lats'"):
        Run(tmp_path / "run", state={"m": torch.nn.Linear(1, 1)}, keep_lats=2, notices=None)
    assert not (tmp_path / "run").exists()  # refused before anything was written
