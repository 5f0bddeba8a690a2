"""``workdir: pack:PATH`` from a client on another machine: the client packs the folder itself
(its ignore files, the size limit), uploads it to the server (``PUT /api/v1/workdirs/SHA``:
streamed, verified, content-addressed, idempotent) and the job's machine runs that code though
the server never reads the client's folder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotwise.control.workdir import pack

from ._remote import remote_server
from .conftest import Server, wait_until
from .test_client import SPOTWISE, TERMINAL, _cli, _client_env, _token_for

MAIN = """\
import os
print("files:", ",".join(sorted(n for n in os.listdir(".") if not n.startswith(".spotwise"))))
print("data:", open("data/values.txt").read().strip())
"""
SIM = {"name": "sim", "boot_s": 0.1}


def _project(root: Path) -> Path:
    code = root / "proj"
    (code / "data").mkdir(parents=True)
    (code / "main.py").write_text(MAIN)
    (code / "data" / "values.txt").write_text("42 from the laptop\n")
    (code / "notes.log").write_text("left out by .gitignore\n")
    (code / "secret.env").write_text("left out by .spotwiseignore\n")
    (code / ".gitignore").write_text("*.log\n.gitignore\n")
    (code / ".spotwiseignore").write_text("secret.env\n.spotwiseignore\njob.yaml\n")
    (code / "job.yaml").write_text(
        json.dumps(
            {
                "name": "packed",
                "command": "python main.py",
                "workdir": "pack:~/proj",  # the client's HOME, not the server's
                "market": "on-demand",
                "provider": SIM,
            }
        )
    )
    return code


@pytest.fixture()
def real_server(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    with remote_server(tmp_path) as served:
        yield served


def test_a_clients_packed_workdir_reaches_the_sim_machine(real_server, tmp_path: Path) -> None:
    url, _, host_env = real_server
    laptop = tmp_path / "laptop"
    code = _project(laptop)
    elsewhere = laptop / "elsewhere"
    elsewhere.mkdir()
    alice = {
        **_client_env(tmp_path, url, _token_for("alice", "user", host_env), "alice"),
        "HOME": str(laptop),
    }
    launched = subprocess.run(
        [*SPOTWISE, "launch", "../proj/job.yaml"],
        cwd=elsewhere,
        env=alice,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.strip().splitlines()[-1]
    # the server's ~/proj never existed, and the laptop's is gone: only the upload reaches it
    shutil.rmtree(code)

    def state() -> str:
        return str(json.loads(_cli("status", job_id, "--json", env=alice).stdout)["state"])

    wait_until(lambda: state() in TERMINAL, timeout_s=300)
    log = _cli("logs", job_id, env=alice).stdout
    assert state() == "SUCCEEDED", log
    assert "files: data,main.py\n" in log and "data: 42 from the laptop\n" in log, log
    [archive] = (Path(host_env["SPOTWISE_HOME"]) / "workdirs").iterdir()  # beside its jobs
    assert re.fullmatch(r"[0-9a-f]{64}\.tar\.gz", archive.name)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600

    # over the limit: refused here, at submit, with its size; nothing reaches the server
    big = _project(laptop)
    with open(big / "weights.bin", "wb") as f:
        f.truncate(101 * 2**20)  # (sparse: nothing is written, its size is what counts)
    refused = _cli("launch", str(big / "job.yaml"), env=alice)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "101.0 MiB" in refused.stderr and "over the limit of 100.0 MiB" in refused.stderr
    assert ".spotwiseignore" in refused.stderr
    assert [j["id"] for j in json.loads(_cli("jobs", "--json", env=alice).stdout)] == [job_id]


def test_the_upload_route_verifies_stores_once_and_feeds_a_submit(server, tmp_path: Path):
    s: Server = server()
    code = _project(tmp_path / "laptop")
    archive = tmp_path / "code.tar.gz"
    sha = pack(code, archive)
    route = f"/api/v1/workdirs/{sha}"
    body = archive.read_bytes()
    uploads = Path(os.environ["SPOTWISE_HOME"]) / "workdirs"

    assert s.call("GET", route, token=None).status == 401
    assert s.call("PUT", route, "viewer-token", body).status == 403  # viewers submit nothing
    assert s.call("GET", route).status == 404
    wrong = s.call("PUT", f"/api/v1/workdirs/{'0' * 64}", body=body)
    assert wrong.status == 422 and sha in wrong.json()["error"]  # the digest it really has
    assert s.call("PUT", "/api/v1/workdirs/not-a-digest", body=body).status == 422
    junk = b"not an archive"
    refused = s.call("PUT", f"/api/v1/workdirs/{hashlib.sha256(junk).hexdigest()}", body=junk)
    assert refused.status == 422 and "not a .tar.gz" in refused.json()["error"]
    assert not uploads.exists() or list(uploads.iterdir()) == []  # nothing refused is kept

    assert s.call("PUT", route, body=body).status == 201
    assert s.call("PUT", route, body=body).status == 200  # idempotent: the same file
    assert s.call("GET", route).json() == {"sha256": sha, "bytes": len(body)}
    assert [p.name for p in uploads.iterdir()] == [f"{sha}.tar.gz"]

    # a submit naming it: the folder the job file names does not exist on the server's host
    job = (code / "job.yaml").read_bytes()
    gone = "/nonexistent/laptop/proj"
    missing = s.call("POST", f"/api/v1/jobs?base_dir={gone}&workdir_sha256={'1' * 64}", body=job)
    assert missing.status == 422 and "upload it first" in missing.json()["hint"]
    not_pack = textwrap.dedent("name: x\ncommand: python main.py\n").encode()
    assert s.call("POST", f"/api/v1/jobs?workdir_sha256={sha}", body=not_pack).status == 422
    submitted = s.call("POST", f"/api/v1/jobs?base_dir={gone}&workdir_sha256={sha}", body=job)
    assert submitted.status == 201, submitted.body
    job_id = submitted.json()["id"]
    wait_until(lambda: s.call("GET", f"/api/v1/jobs/{job_id}").json()["state"] in TERMINAL)
    log = s.call("GET", f"/api/v1/jobs/{job_id}/logs").body.decode()
    assert s.call("GET", f"/api/v1/jobs/{job_id}").json()["state"] == "SUCCEEDED", log
    assert "data: 42 from the laptop\n" in log
