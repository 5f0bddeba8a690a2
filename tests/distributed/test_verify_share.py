"""The split verify of a distributed checkpoint: each rank checks the bytes of its share of the
files, the shares together cover every file once, and the bytes a rank checked are kept for the
load that follows (tests/distributed/test_torchrun.py checks that a corrupt shard on one rank
still makes every rank fall back together)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spotwise.checkpoint.format import STATE_FILE, TENSORS_FILE
from spotwise.checkpoint.write import write_durable
from spotwise.errors import CorruptCheckpointError
from spotwise.runtime.commit import Share, commit_files, load_checkpoint
from spotwise.runtime.distributed.sharded import verify_share
from spotwise.runtime.format import pack_tensors

WRITERS = 4  # ranks that wrote the checkpoint


def rank_files(world: int) -> list[str]:
    return [
        name
        for rank in range(world)
        for name in (
            f"dcp-{rank:05d}.safetensors",
            f"rank-{rank:05d}.safetensors",
            f"rank-{rank:05d}.json",
        )
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_shares_cover_every_file_once_and_hold_each_ranks_own(world: int) -> None:
    names = [*rank_files(WRITERS), "extra.json"]
    shares = [verify_share(names, rank, world) for rank in range(world)]
    assert sorted(n for share in shares for n in share) == sorted(names)  # disjoint, complete
    for rank in range(min(world, WRITERS)):  # same world size: a rank checks what it reads
        assert set(rank_files(WRITERS)[3 * rank : 3 * rank + 3]) <= shares[rank]
    assert "extra.json" in shares[0]


def _blob(value: float) -> tuple[memoryview, ...]:
    blob = pack_tensors({"t": torch.full((256,), value)})
    return (blob.layout.header, *blob.chunks)


def test_a_rank_checks_and_keeps_only_its_share(tmp_path: Path) -> None:
    tmp = tmp_path / ".tmp-step-00000010-1"
    tmp.mkdir()
    others = {}
    for rank in range(2):
        others |= write_durable(
            tmp,
            {
                f"dcp-{rank:05d}.safetensors": _blob(rank + 1.0),
                f"rank-{rank:05d}.json": (json.dumps({"rank": rank}).encode(),),
            },
        )
    own = {TENSORS_FILE: _blob(0.0), STATE_FILE: (json.dumps({"state": {}}).encode(),)}
    path = commit_files(tmp, 10, own, others).path
    shard = path / "dcp-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # rank 1's shard rots
    shard.write_bytes(bytes(data))

    def share(rank: int) -> Share:
        return lambda manifest: verify_share(manifest.files, rank, 2)

    rank0 = load_checkpoint(path, share=share(0))  # the rot is not in rank 0's share
    assert set(rank0.members) == {"dcp-00000.safetensors", "rank-00000.json"}
    assert (
        rank0.members["dcp-00000.safetensors"].numpy().tobytes()
        == (path / "dcp-00000.safetensors").read_bytes()
    )
    assert rank0.members["rank-00000.json"].numpy().tobytes() == b'{"rank": 0}'
    with pytest.raises(CorruptCheckpointError, match=r"dcp-00001\.safetensors fails its CRC32C"):
        load_checkpoint(path, share=share(1))
    with pytest.raises(CorruptCheckpointError, match=r"dcp-00001\.safetensors fails its CRC32C"):
        load_checkpoint(path)  # without a share: every byte, as before
