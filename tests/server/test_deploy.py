"""The deploy recipes (deploy/): the systemd unit passes ``systemd-analyze verify`` and its own
ExecStart serves; every Kubernetes manifest passes the official schemas, the Role grants what the
``kubernetes`` provider uses, two replicas share the PostgreSQL store and the home volume, and
the Deployment's own arguments
serve TLS; the objects the loopback Kubernetes double knows are created through the official
client."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes import client, config, utils

from spotwise.emulators.kubernetes import KubernetesEmulator
from spotwise.server.serve import check_bind, check_lease

from .conftest import Server

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "spotwise-server.service"
MANIFESTS = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.31"  # as tests/control/test_kube_manifest.py
UNIT_VENV = "/opt/spotwise/venv"
LISTENING = re.compile(r"spotwise server on (https?://\S+?)/ ")  # the first line it prints


# --- systemd ---------------------------------------------------------------------------------
def unit_service() -> dict[str, list[str]]:
    """The [Service] section's values by key, in order (systemd repeats keys, configparser
    does not)."""
    values: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def verify(unit: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None and os.environ.get("CI") != "true",
    reason="no systemd-analyze (Debian's systemd package); CI fails instead",
)
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path):
    """Verified with the venv it names replaced by this one (verify checks the binary exists);
    an unknown key, which systemd only warns about, fails it too."""
    text = UNIT.read_text().replace(UNIT_VENV, sys.prefix)
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    checked = verify(unit)
    assert checked.returncode == 0 and checked.stderr == "", checked.stderr
    unit.write_text(text.replace("Restart=always", "Restrat=always"))
    assert "Unknown key" in verify(unit).stderr


def test_the_unit_runs_the_server_sandboxed_and_restarted():
    service = unit_service()
    home = "/var/lib/spotwise"
    assert service["User"] == ["spotwise"]  # a dedicated user, not root
    assert f"SPOTWISE_HOME={home}" in service["Environment"]
    assert service["EnvironmentFile"] == ["-/etc/spotwise/server.env"]  # optional: SPOTWISE_DB
    assert service["Restart"] == ["always"]
    assert service["KillSignal"] == ["SIGTERM"]  # the server lets its jobs go on SIGTERM
    assert service["NoNewPrivileges"] == ["yes"] and service["PrivateTmp"] == ["yes"]
    assert service["ProtectSystem"] == ["strict"] and service["ReadWritePaths"] == [home]
    assert service["UMask"] == ["0077"]  # the admin-token file and the store stay private
    argv = shlex.split(service["ExecStart"][0])
    assert argv[0] == f"{UNIT_VENV}/bin/spotwise" and argv[1] == "server"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_the_units_exec_start_serves_with_tokens(tmp_path: Path):
    """The unit's command line as a real process: this venv, a tmp home, port 0 (the unit's
    8790 may be taken here)."""
    service = unit_service()
    argv = shlex.split(service["ExecStart"][0].replace(UNIT_VENV, sys.prefix))
    argv[argv.index("--port") + 1] = "0"
    env_home = next(e for e in service["Environment"] if e.startswith("SPOTWISE_HOME="))
    home = tmp_path / "home"
    env = {**_plain_env(), env_home.split("=")[0]: str(home), "PYTHONUNBUFFERED": "1"}
    server = _start(argv, env)
    try:
        assert server.call("GET", "/healthz", token=None).status == 200
        assert server.call("GET", "/api/v1/jobs", token=None).status == 401
        token_file = home / "admin-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert server.call("GET", "/api/v1/jobs", token=token_file.read_text().strip()).json() == []
    finally:
        server.stop()
    assert server.proc.returncode == -signal.SIGTERM  # the unit's KillSignal stops it in time


# --- Kubernetes ------------------------------------------------------------------------------
def manifests() -> dict[str, dict[str, Any]]:
    """Every object of deploy/kubernetes/*.yaml by kind."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in found, f"{doc['kind']} twice"
            found[doc["kind"]] = doc
    return found


def test_every_manifest_passes_the_official_schema():
    objects = manifests()
    assert set(objects) == {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Secret",
        "PersistentVolumeClaim",
        "Service",
        "Deployment",
    }
    for obj in objects.values():
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION
        assert obj["kind"] == "Namespace" or obj["metadata"]["namespace"] == "spotwise"


def test_the_role_is_exactly_the_one_the_kubernetes_provider_documents():
    """docs/control.md's Role is what the provider calls (create/watch/delete Jobs, read pods,
    their logs and the checkpoint claim); the deployed one grants that and nothing more."""
    control = (ROOT / "docs" / "control.md").read_text()
    block = re.search(
        r"```yaml\n(apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n.*?)---", control, re.S
    )
    assert block is not None
    documented = yaml.safe_load(block.group(1))["rules"]
    objects = manifests()
    assert objects["Role"]["rules"] == documented
    binding = objects["RoleBinding"]
    assert binding["roleRef"]["name"] == objects["Role"]["metadata"]["name"]
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "spotwise"}
    ]
    assert objects["ServiceAccount"]["metadata"]["name"] == pod["serviceAccountName"]


def test_two_replicas_on_the_database_of_the_secret_and_one_shared_home():
    """Leases let two servers share the PostgreSQL store (each job driven by one): two replicas,
    rolling updates, the lease as documented, and a home volume both can mount."""
    objects = manifests()
    spec = objects["Deployment"]["spec"]
    assert spec["replicas"] == 2 and spec["strategy"]["type"] == "RollingUpdate"
    container = spec["template"]["spec"]["containers"][0]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"])
    assert check_lease(args["lease"]) <= 30  # a dead replica's jobs adopted within 30 s
    assert objects["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    env = {e["name"]: e for e in container["env"]}
    db = env["SPOTWISE_DB"]["valueFrom"]["secretKeyRef"]
    assert db["name"] == objects["Secret"]["metadata"]["name"]
    assert db["key"] in objects["Secret"]["stringData"]
    assert "value" not in env["SPOTWISE_DB"]  # by reference only
    home = env["SPOTWISE_HOME"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    claim = volumes[mounts[home]]["persistentVolumeClaim"]["claimName"]
    assert claim == objects["PersistentVolumeClaim"]["metadata"]["name"]
    # the first admin token: a file from the same Secret, read by the server at first start
    token_file = Path(env["SPOTWISE_ADMIN_TOKEN_FILE"]["value"])
    volume = volumes[mounts[str(token_file.parent)]]["secret"]
    assert volume["secretName"] == objects["Secret"]["metadata"]["name"]
    assert volume["items"] == [{"key": "admin-token", "path": token_file.name}]
    assert "admin-token" in objects["Secret"]["stringData"]
    for probe in (container["readinessProbe"], container["livenessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz" and probe["httpGet"]["scheme"] == "HTTPS"
    service = objects["Service"]["spec"]
    assert service["type"] == "ClusterIP" and service["ports"][0]["port"] == 8790
    assert service["selector"].items() <= spec["template"]["metadata"]["labels"].items()


def test_the_deployments_arguments_serve_tls(tmp_path: Path):
    """The container's own command line and environment, accepted by the server's bind check
    as written, then run here (on 127.0.0.1, port 0, a self-signed certificate, the admin
    token a file as the Secret mounts it): probed as the kubelet does, the preset token let in
    and never printed, the dashboard answering the Service's host names and no other."""
    container = manifests()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = [tuple(a.removeprefix("--").split("=", 1)) for a in container["args"]]
    one = dict(args)
    assert one["host"] == "0.0.0.0"
    check_bind(one["host"], Path(one["tls-cert"]), Path(one["tls-key"]), False)  # no raise
    service_names = [v for k, v in args if k == "allowed-host"]
    assert "spotwise-server.spotwise.svc" in service_names
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=spotwise-server", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    here = {"host": "127.0.0.1", "port": "0", "tls-cert": str(cert), "tls-key": str(key)}
    argv = [f"{sys.prefix}/bin/{container['command'][0]}", *container["command"][1:]]
    argv += [f"--{k}={here.get(k, v)}" for k, v in args]
    token = f"spw_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"  # as secret.yaml says
    token_file = tmp_path / "secret" / "admin-token"
    token_file.parent.mkdir()
    token_file.write_text(token + "\n")
    token_file.chmod(0o440)  # the volume's defaultMode
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["SPOTWISE_ADMIN_TOKEN_FILE"].endswith("/admin-token")
    home = tmp_path / "home"
    env.update(SPOTWISE_HOME=str(home), SPOTWISE_ADMIN_TOKEN_FILE=str(token_file))
    server = _start(argv, {**_plain_env(), **env})
    trusting = ssl.create_default_context(cafile=str(cert))  # verified: the cert it serves

    def get(path: str, host: str | None = None) -> int:
        headers = {"Authorization": f"Bearer {token}", **({"Host": host} if host else {})}
        request = urllib.request.Request(server.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, context=trusting, timeout=30) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code

    try:
        assert server.url.startswith("https://")
        with urllib.request.urlopen(server.url + "/healthz", context=trusting, timeout=30) as r:
            assert r.status == 200
        assert get("/api/v1/jobs") == 200  # the Secret's token is the admin's
        for name in service_names:
            assert get("/", f"{name}:8790") == 200  # the dashboard, through the Service
        assert get("/", "rebound.example.com") == 400  # any other name: DNS rebinding
    finally:
        server.stop()
        rest = server.proc.stdout.read() if server.proc.stdout else ""
    assert "registered" in rest and token not in rest  # never printed
    assert not (home / "admin-token").exists()  # nor written anywhere


def test_the_secrets_placeholder_token_is_refused(tmp_path: Path):
    """secret.yaml applied unchanged starts no server with a known admin token."""
    placeholder = manifests()["Secret"]["stringData"]["admin-token"]
    token_file = tmp_path / "admin-token"
    token_file.write_text(placeholder)
    env = {**_plain_env(), "SPOTWISE_HOME": str(tmp_path / "home")}
    env["SPOTWISE_ADMIN_TOKEN_FILE"] = str(token_file)
    refused = subprocess.run(
        [f"{sys.prefix}/bin/spotwise", "server", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # (it stops at once; starting Python is what a loaded machine slows)
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"--admin-token-file {token_file} does not hold a spotwise token" in refused.stderr
    assert "secrets.token_hex(6)" in refused.stderr  # how to make one
    assert placeholder not in refused.stderr.replace(str(token_file), "")


def test_the_objects_the_double_knows_are_created_through_the_official_client(tmp_path: Path):
    """The loopback double serves namespaces, secrets and claims (not Deployments, Services or
    RBAC): those manifests are created as written, and read back."""
    emu = KubernetesEmulator(tmp_path / "k8s")
    emu.start()
    try:
        api = config.new_client_from_config(str(emu.kubeconfig))
        for name in ("namespace.yaml", "secret.yaml", "pvc.yaml"):
            utils.create_from_yaml(api, str(MANIFESTS / name))
        core = client.CoreV1Api(api)
        secret = core.read_namespaced_secret("spotwise-server", "spotwise")
        assert set(secret.data) == {"SPOTWISE_DB", "admin-token"}
        claim = core.read_namespaced_persistent_volume_claim("spotwise-home", "spotwise")
        assert claim.spec.access_modes == ["ReadWriteMany"]
    finally:
        emu.stop()


# --- helpers ---------------------------------------------------------------------------------
def _plain_env() -> dict[str, str]:
    """This environment without the caller's SPOTWISE_* settings (the recipes set their own)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k == "SPOTWISE_PLATFORM" or not k.startswith("SPOTWISE_")
    }


def _start(argv: list[str], env: dict[str, str]) -> Server:
    """Start a server and wait for the line that says where it listens."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = LISTENING.search(line)
    if found is None:
        proc.kill()
        pytest.fail(f"the server did not start: {line!r}")
    return Server(proc, found.group(1))
