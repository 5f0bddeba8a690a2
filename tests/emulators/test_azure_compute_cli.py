"""``spotwise emulate azure-compute`` as a user runs it: the exports a client needs (the
Resource Manager and the job store's Blob account), then the official SDKs served by it with
them; a bad ``--fault`` is a clear error."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

SPOTWISE = str(Path(sys.executable).with_name("spotwise"))


def test_emulate_azure_compute_prints_what_a_client_needs(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [SPOTWISE, "emulate", "azure-compute", "--port", "0", "--bucket", "spotwise-digits",
         "--workdir", str(tmp_path), "--duration", "60"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]  # listening, ids, two exports
        assert "azure-compute emulator listening on http://127.0.0.1:" in lines[0]
        exports = dict(
            shlex.split(line.removeprefix("export "))[0].split("=", 1)  # as a shell reads it
            for line in lines
            if line.startswith("export ")
        )
        assert set(exports) == {"SPOTWISE_AZURE_ENDPOINT_URL", "AZURE_STORAGE_CONNECTION_STRING"}
        from azure.storage.blob import ContainerClient

        store = ContainerClient.from_connection_string(
            exports["AZURE_STORAGE_CONNECTION_STRING"], "spotwise-digits"
        )
        assert store.exists()  # --bucket made the job store's container
        from azure.mgmt.compute import ComputeManagementClient

        from spotwise.control.providers.azure import _LoopbackToken, _plain_http_on_loopback
        from spotwise.emulators.azure_compute import SUBSCRIPTION

        client = ComputeManagementClient(
            _LoopbackToken(),
            SUBSCRIPTION,
            base_url=exports["SPOTWISE_AZURE_ENDPOINT_URL"],
            per_call_policies=[_plain_http_on_loopback()],
        )
        assert list(client.virtual_machines.list("spotwise-rg")) == []
        sizes = {s.name for s in client.resource_skus.list(filter="location eq 'eastus'")}
        assert "Standard_NC4as_T4_v3" in sizes
    finally:
        proc.terminate()
        proc.wait(20)


def test_emulate_azure_compute_refuses_an_unknown_fault() -> None:
    done = subprocess.run(
        [SPOTWISE, "emulate", "azure-compute", "--port", "0", "--fault", "Explode:2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "--fault 'Explode:2'" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
