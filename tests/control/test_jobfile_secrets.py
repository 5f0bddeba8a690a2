"""Job secrets by reference (env_from): the store keeps where a value is, never the value."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from spotwise.control.controller import Controller
from spotwise.control.launching import launch_request
from spotwise.control.providers import Placement, make_provider
from spotwise.control.providers.kubernetes import KubernetesProvider
from spotwise.control.secret_refs import SecretRef, aws_fetch_script
from spotwise.control.spec import Resources, load_spec, parse_spec
from spotwise.control.store import JobState, Store, spotwise_home
from spotwise.control.submission import submit
from spotwise.emulators.kubernetes import KubernetesEmulator
from spotwise.errors import ConfigError

TOKEN = "hf_s3cr3t-value-0123456789"
# exits 0 when HF_TOKEN holds TOKEN, without TOKEN in the command (which the store keeps)
CHECK = (
    "import hashlib, os, sys; sys.exit(0 if hashlib.sha256(os.environ['HF_TOKEN'].encode())"
    f".hexdigest() == {hashlib.sha256(TOKEN.encode()).hexdigest()!r} else 1)"
)


def _store_bytes() -> bytes:
    return b"".join(p.read_bytes() for p in spotwise_home().glob("spotwise.db*"))


def test_a_file_secret_reaches_the_process_and_never_the_store(workdir: Path, kit: SimpleNamespace):
    (workdir / "hf_token").write_text(TOKEN + "\n")  # as `echo $TOKEN > hf_token` writes it
    spec = kit.spec(
        workdir, command=["python", "-c", CHECK], env_from={"HF_TOKEN": {"file": "hf_token"}}
    )
    assert kit.run(spec)["state"] == "SUCCEEDED"  # the value (newline dropped) was in the env
    stored = _store_bytes()
    assert stored and TOKEN.encode() not in stored
    assert str(workdir / "hf_token").encode() in stored  # the reference is what is kept


def test_a_plain_secret_in_env_is_stored_and_warned(tmp_path: Path, caplog):
    """The old way still works (the store keeps it); the launch says which key and the fix."""
    job = tmp_path / "job.yaml"
    job.write_text(f"command: x\nenv: {{HF_TOKEN: {TOKEN}, EPOCHS: '3', WANDB_API_KEY: k}}\n")
    with caplog.at_level(logging.WARNING):
        load_spec(job)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "env.HF_TOKEN looks like a secret" in warned and "env_from: {HF_TOKEN:" in warned
    assert "env.WANDB_API_KEY" in warned and "EPOCHS" not in warned
    assert TOKEN not in warned


def test_a_secret_file_gone_at_launch_fails_the_job_with_the_reason(workdir: Path):
    """A launch that fails after validation ends FAILED, never LAUNCHING forever."""
    secret = workdir / "hf_token"
    secret.write_text(TOKEN)
    spec = parse_spec(
        {
            "command": "python -c pass",
            "provider": "local",
            "env_from": {"HF_TOKEN": {"file": str(secret)}},
        },
        base_dir=workdir,
    )
    store = Store()
    job = submit(store, spec)
    secret.unlink()
    started = time.monotonic()
    assert Controller(store, job.id).run() is JobState.FAILED
    assert time.monotonic() - started < 30
    final = store.job(job.id)
    assert "env_from.HF_TOKEN" in final.message and "cannot read it" in final.message


@pytest.mark.parametrize(
    ("ref", "needles"),
    [
        ({"kubernetes_secret": "hf/token"}, ["env_from.HF_TOKEN", "kubernetes provider", "file"]),
        ({"aws_ssm": "/ml/hf"}, ["env_from.HF_TOKEN", "aws provider", "{file: PATH}"]),
        ({"file": "missing"}, ["env_from.HF_TOKEN", "is not a file"]),
        ({"file": "a", "aws_ssm": "b"}, ["exactly one of"]),
        ({"kubernetes_secret": "no-key"}, ["SECRET-NAME/KEY"]),
        ({"vault": "x"}, ["env_from.HF_TOKEN.vault", "unknown field"]),
    ],
)
def test_references_the_provider_cannot_resolve_are_refused(tmp_path: Path, ref, needles):
    with pytest.raises(ConfigError) as err:
        parse_spec({"command": "x", "env_from": {"HF_TOKEN": ref}}, base_dir=tmp_path)
    for needle in needles:
        assert needle in str(err.value)


def test_kubernetes_secret_becomes_a_secret_key_ref(tmp_path: Path):
    with KubernetesEmulator(tmp_path / "cluster") as emu:
        options = {
            "image": "python:3.11",
            "kubeconfig": str(emu.kubeconfig),
            "checkpoint_pvc": "checkpoints",
        }
        spec = parse_spec(
            {
                "command": "python train.py",
                "provider": {"name": "kubernetes", **options},
                "env_from": {"HF_TOKEN": {"kubernetes_secret": "hf/token"}},
            },
            base_dir=tmp_path,
        )
        provider = KubernetesProvider(
            options, epoch=time.time(), instance_type=None, preflight=False, resources=Resources()
        )
        req = launch_request(
            spec, provider, "j-1", 1, Placement("spot", provider.features.zones[0]),
            job_dir=tmp_path / "job", log_path=tmp_path / "job.log",
        )  # fmt: skip
        env = provider.manifest(req)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    } in env
    assert "hf/token" in yaml.safe_dump(spec.model_dump(mode="json"))


def test_aws_references_are_fetched_on_the_instance(aws_env: str, tmp_path: Path):
    """The bootstrap's lines, run by bash with boto3 against SSM / Secrets Manager (moto)."""
    import boto3

    boto3.client("ssm").put_parameter(Name="/ml/hf", Value=TOKEN, Type="SecureString")
    boto3.client("secretsmanager").create_secret(Name="prod/db", SecretString="pw with 'quotes'")
    spec = parse_spec(
        {
            "command": "x",
            "provider": {
                "name": "aws",
                "s3": "s3://bucket-b/jobs",
                "image_id": "ami-1",
                "instance_type": "g4dn.xlarge",
                "region": "us-east-1",
                "zones": ["us-east-1a"],
            },
            "env_from": {
                "HF_TOKEN": {"aws_ssm": "/ml/hf"},
                "DB_PASSWORD": {"aws_secret": "prod/db"},
            },
        },
        base_dir=tmp_path,
    )
    script = aws_fetch_script(spec.env_from, sys.executable, "us-east-1")
    assert TOKEN not in script
    provider = make_provider("aws", spec.provider.options, epoch=0.0)
    user_data = provider.user_data(
        launch_request(
            spec,
            provider,
            "j-1",
            1,
            Placement("spot", "us-east-1a"),
            job_dir=tmp_path / "job",
            log_path=tmp_path / "job.log",
        )
    )
    assert "-m spotwise.control.secret_refs aws_ssm /ml/hf --region us-east-1" in user_data
    assert TOKEN not in user_data and "pw with" not in user_data
    shown = subprocess.run(
        ["bash", "-c", f"set -u\n{script}\nprintf '%s|%s' \"$HF_TOKEN\" \"$DB_PASSWORD\""],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"{TOKEN}|pw with 'quotes'"
    missing = aws_fetch_script(
        {"HF_TOKEN": SecretRef(aws_ssm="/ml/missing")}, sys.executable, "us-east-1"
    )
    failed = subprocess.run(
        ["bash", "-c", f"{missing}\necho reached"], capture_output=True, text=True, timeout=60
    )
    assert failed.returncode == 1 and "reached" not in failed.stdout
    assert "cannot read aws_ssm '/ml/missing'" in failed.stderr and "Traceback" not in failed.stderr
