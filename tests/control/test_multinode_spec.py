"""Multi-node jobs: the job file's keys, the exit-code rules of ranks and nodes (pure), and the
providers that cannot run them refusing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotwise.control.providers import make_provider
from spotwise.control.providers.base import AttemptStatus, Phase
from spotwise.control.providers.process import group_status
from spotwise.control.providers.torchrun import launcher_argv
from spotwise.control.spec import parse_spec
from spotwise.control.submission import check_world
from spotwise.errors import ConfigError
from spotwise.runtime.launch import RankEnd, attempt_exit_code


def _spec(tmp_path: Path, **fields):
    return parse_spec({"command": "python train.py", **fields}, base_dir=tmp_path)


def test_defaults_and_world_size(tmp_path: Path):
    one = _spec(tmp_path)
    assert (one.nodes, one.procs_per_node, one.min_nodes, one.world_size) == (1, 1, None, 1)
    ddp = _spec(tmp_path, nodes=4, procs_per_node=8, min_nodes=2)
    assert (ddp.nodes, ddp.min_nodes, ddp.world_size) == (4, 2, 32)


@pytest.mark.parametrize(
    "fields, needles",
    [
        ({"nodes": 2, "min_nodes": 3}, ["min_nodes: more than nodes (2)", "set it to 2 or less"]),
        ({"nodes": 0}, ["nodes:", "greater than or equal to 1", "(given: 0)"]),
        ({"procs_per_node": "many"}, ["procs_per_node:", "valid integer", "'many'"]),
        ({"node": 2}, ["node: unknown field", "did you mean nodes"]),
        ({"procs_per_nod": 2}, ["did you mean procs_per_node"]),
        ({"min_nodes": 0}, ["min_nodes:", "greater than or equal to 1"]),
    ],
)
def test_bad_node_counts_name_the_key_and_the_fix(tmp_path: Path, fields, needles):
    with pytest.raises(ConfigError) as err:
        _spec(tmp_path, **fields)
    for needle in needles:
        assert needle in err.value.message


def test_a_provider_without_multi_node_refuses_more_than_one_process(tmp_path: Path):
    one = make_provider("fake", {}, epoch=0.0)
    assert not one.features.multi_node
    check_world(_spec(tmp_path, provider="local"), one)  # one process: fine anywhere
    for fields in ({"nodes": 2}, {"procs_per_node": 2}):
        with pytest.raises(ConfigError) as err:
            check_world(_spec(tmp_path, **fields), one)
        assert "runs one process per attempt" in err.value.message
        assert "set nodes: 1 and procs_per_node: 1" in (err.value.hint or "")
    aws = make_provider(
        "aws",
        {
            "region": "us-east-1",
            "s3": "s3://bucket-x/p",
            "image_id": "ami-1",
            "instance_type": "g4dn.xlarge",
        },
        epoch=0.0,
    )
    for many in (aws, *(make_provider(name, {}, epoch=0.0) for name in ("local", "sim"))):
        check_world(_spec(tmp_path, nodes=2), many)


def _ends(*codes_at: tuple[int, float]) -> dict[int, RankEnd]:
    return {r: RankEnd(r, code, at) for r, (code, at) in enumerate(codes_at)}


@pytest.mark.parametrize(
    "ends, code",
    [
        ({}, 0),
        (_ends((75, 10), (75, 10)), 75),  # every rank saved on the notice
        (_ends((75, 10), (-15, 11)), 75),  # the agent stopped the other after the 75
        (_ends((-15, 10), (75, 10)), 75),  # same poll (whole seconds): the exit comes first
        (_ends((75, 10), (-9, 10), (75, 12)), 75),
        (_ends((1, 10), (-15, 10)), 1),  # a crash first stays a crash
        (_ends((3, 10), (75, 11)), 3),  # a crash, then the others saved: still an error
        (_ends((75, 10), (2, 11)), 2),  # a rank crashed on the way out: never hidden
        (_ends((-9, 10), (-15, 11)), 1),  # killed (OOM killer...) first: torchrun's own 1
    ],
)
def test_rank_exit_codes_fold_into_the_attempts(ends, code):
    assert attempt_exit_code(ends) == code


def _st(phase: Phase, code: int | None = None, at: float | None = None) -> AttemptStatus:
    return AttemptStatus(phase, exit_code=code, ended_at=at, running_at=1.0)


@pytest.mark.parametrize(
    "nodes, phase, code, stop_rest",
    [
        ([_st(Phase.RUNNING), _st(Phase.RUNNING)], Phase.RUNNING, None, False),
        ([_st(Phase.EXITED, 0, 5), _st(Phase.RUNNING)], Phase.RUNNING, None, False),
        ([_st(Phase.EXITED, 75, 5), _st(Phase.RUNNING)], Phase.RUNNING, None, True),
        # 75 at 17, 3 s ago: the other node's ranks agreed to save too, it ends by itself
        ([_st(Phase.EXITED, 75, 17), _st(Phase.RUNNING)], Phase.RUNNING, None, False),
        ([_st(Phase.LOST, None, 17), _st(Phase.RUNNING)], Phase.RUNNING, None, True),
        ([_st(Phase.EXITED, 1, 17), _st(Phase.RUNNING)], Phase.RUNNING, None, True),
        ([_st(Phase.LOST, None, 5), _st(Phase.STARTING)], Phase.STARTING, None, True),
        ([_st(Phase.EXITED, 0, 5), _st(Phase.EXITED, 0, 6)], Phase.EXITED, 0, False),
        ([_st(Phase.EXITED, 75, 5), _st(Phase.EXITED, 75, 6)], Phase.EXITED, 75, False),
        ([_st(Phase.EXITED, 75, 5), _st(Phase.LOST, None, 9)], Phase.EXITED, 75, False),
        ([_st(Phase.LOST, None, 5), _st(Phase.EXITED, 1, 6)], Phase.LOST, None, False),
        ([_st(Phase.EXITED, 1, 5), _st(Phase.LOST, None, 6)], Phase.EXITED, 1, False),
        ([_st(Phase.EXITED, 75, 5), _st(Phase.EXITED, 2, 6)], Phase.EXITED, 2, False),
    ],
)
def test_node_statuses_fold_into_the_attempts(nodes, phase, code, stop_rest):
    status, stop = group_status(nodes, now=20.0, settle_s=4.0)
    assert (status.phase, status.exit_code, stop) == (phase, code, stop_rest)


def test_launcher_command_lines():
    one = launcher_argv(["python", "t.py"], python="py", nodes=1, procs_per_node=4)
    assert one == (
        "py", "-m", "spotwise.runtime.launch", "--nproc-per-node=4", "--standalone",
        "--max-restarts=0", "--no-python", "python", "t.py",
    )  # fmt: skip
    two = launcher_argv(
        ["t"], python="py", nodes=2, procs_per_node=1, endpoint="127.0.0.1:9", rdzv_id="j-1",
        host=False,
    )  # fmt: skip
    assert "--nnodes=2" in two and "--rdzv-endpoint=127.0.0.1:9" in two
    assert "--rdzv-conf=is_host=false" in two and two[-2:] == ("--no-python", "t")
