"""run_batch in-process: outputs equal a plain no_grad loop's, a restart computes nothing,
mismatched plans are refused without touching the outputs, damage is detected and redone,
tables go to Parquet, and S3 outputs with object-store leases work the same way."""

from __future__ import annotations

import uuid

import boto3
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load
from torch.utils.data import TensorDataset

from spotwise.batch import outputs_sha256, read_plan, run_batch, verify_outputs
from spotwise.errors import ConfigError, PlanMismatchError
from spotwise.storage import open_storage


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _data(n: int = 230) -> TensorDataset:
    return TensorDataset(torch.randn(n, 8, generator=torch.Generator().manual_seed(1)))


def _run(out, model, data, **kw):
    kw.setdefault("shard_size", 50)
    return run_batch(
        data, lambda b: {"y": model(b[0])}, str(out), model=model, batch_size=16, notices=None, **kw
    )


def test_outputs_match_a_plain_loop_and_a_restart_computes_nothing(tmp_path):
    model, data = _model(), _data()
    first = _run(tmp_path / "out", model, data)
    assert first.computed == [0, 1, 2, 3, 4] and first.items_computed == 230
    storage = open_storage(str(tmp_path / "out"))
    plan = read_plan(storage)
    got = torch.cat([load(storage.get(plan.shard_key(s)))["y"] for s in range(5)])
    with torch.no_grad():
        assert torch.allclose(got, model(data.tensors[0]), atol=1e-6)  # each item once, in order
    digest = outputs_sha256(storage, plan)
    again = _run(tmp_path / "out", model, data)
    assert again.computed == [] and outputs_sha256(storage, plan) == digest


@pytest.mark.parametrize(
    ("change", "named"),
    [({"model": 1}, "model"), ({"shard_size": 40}, "shard size"), ({"n": 231}, "dataset length")],
)
def test_a_different_plan_is_refused_and_nothing_is_overwritten(tmp_path, change, named):
    out = tmp_path / "out"
    _run(out, _model(), _data())
    before = {p.name: p.read_bytes() for p in out.glob("shard-*")}
    model = _model(change.get("model", 0))
    with pytest.raises(PlanMismatchError, match=named) as err:
        _run(out, model, _data(change.get("n", 230)), shard_size=change.get("shard_size", 50))
    assert "nothing was overwritten" in str(err.value)
    assert {p.name: p.read_bytes() for p in out.glob("shard-*")} == before


def test_a_directory_of_other_files_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"notes\.txt"):
        _run(tmp_path / "out", _model(), _data())


def test_a_damaged_shard_is_detected_and_recomputed(tmp_path):
    model, data = _model(), _data()
    _run(tmp_path / "out", model, data)
    storage = open_storage(str(tmp_path / "out"))
    plan = read_plan(storage)
    good = outputs_sha256(storage, plan)
    shard = tmp_path / "out" / plan.shard_key(2)
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # same size, different bytes: only the checksum can tell
    shard.write_bytes(bytes(raw))
    assert verify_outputs(storage, plan) == [2]
    redo = _run(tmp_path / "out", model, data)
    assert redo.computed == [2] and outputs_sha256(storage, plan) == good


def test_tables_are_written_as_parquet(tmp_path):
    model, data = _model(), _data(120)

    def rows(batch):
        y = model(batch[0])
        return {"label": y.argmax(1).numpy(), "score": y.max(1).values.numpy()}

    def run():
        return run_batch(data, rows, str(tmp_path / "t"), model=model, shard_size=50,
                         batch_size=16, kind="table", notices=None)  # fmt: skip

    assert run().computed == [0, 1, 2]
    files = sorted((tmp_path / "t").glob("shard-*.parquet"))
    assert [f.name for f in files] == [f"shard-{i:06d}.parquet" for i in range(3)]
    assert sum(pq.read_table(f).num_rows for f in files) == 120
    assert run().computed == []


def test_s3_outputs_with_object_store_leases(aws_env, tmp_path):
    bucket = f"batch-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    model, data = _model(), _data()
    out = f"s3://{bucket}/preds"
    result = _run(out, model, data)
    assert result.computed == [0, 1, 2, 3, 4]
    keys = {
        o["Key"]
        for o in boto3.client("s3", endpoint_url=aws_env).list_objects_v2(Bucket=bucket)["Contents"]
    }
    assert "preds/leases/shard-000004.json" in keys and "preds/ledger/shard-000004.json" in keys
    local = _run(tmp_path / "local", model, data)
    assert local.computed == result.computed
    assert outputs_sha256(open_storage(out), read_plan(open_storage(out))) == outputs_sha256(
        open_storage(str(tmp_path / "local")), read_plan(open_storage(str(tmp_path / "local")))
    )
    assert _run(out, model, data).computed == []


class _NoticeAfter:
    """A notice source whose terminate notice arrives after ``n`` polls (as SIGTERM would)."""

    def __init__(self, n: int) -> None:
        self.polls, self.n, self.acknowledged = 0, n, False

    def current(self):
        from spotwise.notices.base import Notice, NoticeKind

        self.polls += 1
        return Notice("test", NoticeKind.TERMINATE, 0.0, None) if self.polls > self.n else None

    def acknowledge(self, notice) -> None:
        self.acknowledged = True

    def close(self) -> None:
        pass


def test_a_notice_stops_between_batches_hands_the_lease_back_and_exits_75(tmp_path):
    from spotwise.batch import SQLiteLeases

    model, data = _model(), _data()
    notices = _NoticeAfter(5)  # shard 0 is 4 batches: the notice comes inside shard 1
    with pytest.raises(SystemExit) as stop:
        run_batch(
            data,
            lambda b: {"y": model(b[0])},
            str(tmp_path / "out"),
            model=model,
            shard_size=50,
            batch_size=16,
            notices=notices,
            lease_ttl_s=600,
        )
    assert stop.value.code == 75 and notices.acknowledged
    written = sorted(p.name for p in (tmp_path / "out").glob("shard-*"))
    assert written == ["shard-000000.safetensors"], "nothing partial of shard 1"
    board = SQLiteLeases(tmp_path / "out" / "leases.db")
    lease = board.claim("next", [1], ttl_s=5)  # handed back: no waiting for the 600 s lease
    assert lease is not None
    board.renew(lease, 0.0)
    assert _run(tmp_path / "out", model, data).computed == [1, 2, 3, 4]
