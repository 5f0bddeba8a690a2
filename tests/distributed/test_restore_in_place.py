"""A distributed resume loads a model's tensors in place, without a blank copy of each, and still
changes nothing when any chunk fails to read: in this process (one real gloo rank), a checkpoint
whose distributed metadata was rewritten (its manifest re-signed, so only the load can object)
either leaves the live model exactly as it was, or, where its chunks leave part of a tensor
uncovered, loads that part as zeros, as it would into a blank tensor."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch

from spotwise import Run
from spotwise.checkpoint.format import MANIFEST, STATE_FILE
from spotwise.errors import StateMismatchError


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))


def _saved(run_dir: Path, rewrite: Callable[[dict[str, Any]], None]) -> dict[str, torch.Tensor]:
    """Save one step of a model, rewrite its distributed metadata; returns the saved weights."""
    model = _model(0)
    run = Run(run_dir, state={"model": model}, notices=None)
    run.step = 1
    run.save()
    run.close()
    ckpt = run_dir / "step-00000001"
    state = json.loads((ckpt / STATE_FILE).read_text())
    rewrite(state["dcp"]["metadata"])
    data = json.dumps(state).encode()
    (ckpt / STATE_FILE).write_bytes(data)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][STATE_FILE] = {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    return {k: v.clone() for k, v in model.state_dict().items()}


def _rename_last(metadata: dict[str, Any]) -> None:
    # the tensors load in the order of their names: the others are read (and checked) first
    row = next(r for r in metadata["storage"] if r[0] == "model/1.weight")
    row[3] = "no-such-tensor"


def _halve_chunk(metadata: dict[str, Any]) -> None:
    metadata["tensors"]["model/0.bias"]["chunks"] = [[[0], [4]]]


def test_a_failed_read_leaves_the_live_model_as_it_was(tmp_path: Path, one_rank: None) -> None:
    _saved(tmp_path, _rename_last)
    model = _model(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with (
        pytest.warns(RuntimeWarning, match="skipping checkpoint step-00000001"),
        pytest.raises(StateMismatchError, match="lacks tensor 'no-such-tensor'"),
    ):
        Run(tmp_path, state={"model": model}, notices=None)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


@pytest.mark.parametrize("rewrite", [lambda metadata: None, _halve_chunk])
def test_a_resume_loads_in_place_and_reads_uncovered_parts_as_zeros(
    tmp_path: Path, one_rank: None, rewrite: Callable[[dict[str, Any]], None]
) -> None:
    saved = _saved(tmp_path, rewrite)
    model = _model(1)
    live = {k: v.data_ptr() for k, v in model.state_dict().items()}
    run = Run(tmp_path, state={"model": model}, notices=None)
    assert run.step == 1
    run.close()
    if rewrite is _halve_chunk:
        saved["0.bias"][4:] = 0
    for key, value in model.state_dict().items():
        assert value.data_ptr() == live[key], key  # the model's own tensors, loaded in place
        assert torch.equal(value, saved[key]), key
