"""``spotwise emulate gcs`` / ``azure-blob`` as a user runs them: the export line, then the
official client served by it with only that; a bad bucket name is one clear error."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

SPOTWISE = str(Path(sys.executable).with_name("spotwise"))


def _exports(command: list[str]) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = subprocess.Popen(
        [SPOTWISE, "emulate", *command, "--port", "0", "--duration", "60"],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("STORAGE_", "AZURE_"))},
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(2)]
    assert "emulator listening on http://127.0.0.1:" in lines[0]
    [assignment] = shlex.split(lines[1].removeprefix("export "))  # as a shell reads it
    name, _, value = assignment.partition("=")
    return proc, {name: value}


def test_emulate_gcs_serves_a_gs_run_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, exports = _exports(["gcs", "--bucket", "ckpts"])
    try:
        assert set(exports) == {"STORAGE_EMULATOR_HOST"}
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        from spotwise.storage import open_storage

        store = open_storage("gs://ckpts/runs/a")
        store.put("step-00000001/manifest.json", b"{}")
        assert [o.key for o in store.list()] == ["step-00000001/manifest.json"]
    finally:
        proc.terminate()
        proc.wait(20)


def test_emulate_azure_blob_serves_an_az_run_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    proc, exports = _exports(["azure-blob", "--container", "ckpts"])
    try:
        assert set(exports) == {"AZURE_STORAGE_CONNECTION_STRING"}
        for name, value in exports.items():
            monkeypatch.setenv(name, value)
        from spotwise.storage import open_storage

        store = open_storage("az://ckpts/runs/a")
        store.put("step-00000001/manifest.json", b"{}")
        assert store.get("step-00000001/manifest.json") == b"{}"
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_bad_bucket_name_is_one_clear_error() -> None:
    done = subprocess.run(
        [SPOTWISE, "emulate", "gcs", "--port", "0", "--bucket", "Bad_Name!"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "--bucket 'Bad_Name!'" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
