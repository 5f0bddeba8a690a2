"""``spotwise ckpt list|verify|pull`` on s3:// URIs, against the loopback moto server."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from typer.testing import CliRunner

from spotwise.cli.main import app
from spotwise.errors import ConfigError
from spotwise.runtime.commit import verify_checkpoint, write_checkpoint
from spotwise.runtime.tiered import push


def _upload(store, tmp_path: Path, steps: tuple[int, ...]) -> None:
    for step in steps:
        info = write_checkpoint(tmp_path / "local", step, {"w": torch.full((64,), float(step))})
        push(store, info.path)


def test_list_verify_and_pull_s3(make_s3, bucket: str, tmp_path: Path) -> None:
    store = make_s3("runs/a")
    _upload(store, tmp_path, (100, 200))
    uri = f"s3://{bucket}/runs/a"
    runner = CliRunner()

    listed = runner.invoke(app, ["ckpt", "list", uri, "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [(c["step"], c["valid"]) for c in rows] == [(100, True), (200, True)]

    # same size, different bytes: only a deep verification (download + CRC32C) can tell
    data = bytearray(store.get("step-00000200/tensors.safetensors"))
    data[-1] ^= 0xFF
    store.put("step-00000200/tensors.safetensors", bytes(data))
    verified = runner.invoke(app, ["ckpt", "verify", uri, "--json"])
    assert verified.exit_code == 1
    report = json.loads(verified.output)
    assert report["ok"] is False
    assert [(c["step"], c["valid"]) for c in report["checkpoints"]] == [(100, True), (200, False)]
    assert "tensors.safetensors fails its CRC32C check" in report["checkpoints"][1]["problem"]

    pulled = runner.invoke(app, ["ckpt", "pull", uri, str(tmp_path / "dest")])
    assert pulled.exit_code == 0, pulled.output
    assert "step-00000100" in pulled.output
    assert verify_checkpoint(tmp_path / "dest" / "step-00000100", deep=True).valid
    table = runner.invoke(app, ["ckpt", "list", str(tmp_path / "dest")])
    assert table.exit_code == 0 and "100" in table.output


def test_pull_needs_a_remote_uri(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["ckpt", "pull", str(tmp_path), str(tmp_path / "d")])
    assert isinstance(result.exception, ConfigError)
