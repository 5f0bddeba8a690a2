"""A distributed Run reuses DCP's save plan only while its state's layout holds: in this process
(one real gloo rank), an optimizer that gains a parameter group after the first save (as when
training unfreezes layers) is saved whole by the next save and restored exactly."""

from __future__ import annotations

from pathlib import Path

import torch

from spotwise import CheckpointConfig, Run
from spotwise.runtime.commit import list_checkpoints


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()


def test_a_changed_layout_is_planned_again(tmp_path: Path, one_rank: None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    optimizer = torch.optim.Adam([model.weight], lr=0.1)
    run = Run(
        tmp_path,
        state={"model": model, "optimizer": optimizer},
        notices=None,
        checkpoint=CheckpointConfig(keep_last=5),
    )
    _train(model, optimizer)
    run.step = 1
    run.save()  # the bias frozen: no state of it
    optimizer.add_param_group({"params": [model.bias]})
    _train(model, optimizer)
    run.step = 2
    run.save()  # the bias's moments and group now: a new layout
    _train(model, optimizer)
    run.step = 3
    run.save()  # the same layout: the plan of step 2 is reused
    run.close()
    assert [c.step for c in list_checkpoints(tmp_path, deep=True) if c.valid] == [1, 2, 3]
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: v.clone() for k, v in optimizer.state[model.bias].items()}

    torch.manual_seed(1)
    fresh = torch.nn.Linear(16, 8)
    fresh_optimizer = torch.optim.Adam([fresh.weight], lr=0.1)
    fresh_optimizer.add_param_group({"params": [fresh.bias]})
    _train(fresh, fresh_optimizer)  # other values in every tensor, the same layout
    resumed = Run(tmp_path, state={"model": fresh, "optimizer": fresh_optimizer}, notices=None)
    assert resumed.step == 3
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, expected[key]), key
    state = fresh_optimizer.state[fresh.bias]
    assert set(state) == set(moments)
    for key, value in state.items():
        assert torch.equal(value, moments[key]), key
    resumed.close()
