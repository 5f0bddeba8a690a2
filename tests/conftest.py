"""Test-wide settings: never probe real cloud metadata; keep state in temp dirs."""

from __future__ import annotations

import os

# Platform auto-detection probes the link-local metadata address; it must never run in tests.
os.environ["SPOTWISE_PLATFORM"] = "none"
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")

import pytest


@pytest.fixture(autouse=True)
def _spotwise_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own SPOTWISE_HOME so jobs and databases never leak between tests."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path_factory.mktemp("spotwise-home")))
    monkeypatch.setenv("SPOTWISE_PLATFORM", "none")


@pytest.fixture(scope="session")
def moto_server():
    """A real S3/EC2-speaking HTTP server on loopback (moto in server mode, as s3fs tests use).

    Yields the endpoint URL. Clients reach it with the real boto3 and fake credentials; nothing
    leaves 127.0.0.1. Tests that need a clean slate create uniquely named buckets.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture()
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the AWS SDK at the loopback moto server with fake credentials."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_server
