"""Test-wide settings: never probe real cloud metadata; keep state in temp dirs."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

# Platform auto-detection probes the link-local metadata address; it must never run in tests.
os.environ["SPOTWISE_PLATFORM"] = "none"
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")

import pytest

ROOT = Path(__file__).resolve().parents[1]
_STARTED: dict[str, str | None] = {}  # service -> what its script answered
_SKIPPED: dict[str, int] = {}  # reason -> tests skipped for it, summed up in one line at the end


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for reason, n in _SKIPPED.items():
        terminalreporter.write_line(f"spotwise: {n} tests skipped, {reason}")


def require_service(name: str, probe: Callable[[], str | None], script: str) -> str:
    """Make sure a real service the tests need is up and say where: ``probe`` answers that (or
    None when it is down). A service that is down is started with the repository's own script
    when we are root (what ``.ci/run`` does, so ``make test`` works on a fresh machine too; the
    script's last line of output is then the answer); otherwise the test fails under CI (a
    missing service must never pass as skipped) or is skipped, summed up in one line."""
    found = probe()
    if found:
        return found
    path = ROOT / script
    if name not in _STARTED and os.geteuid() == 0 and path.exists():
        out = subprocess.run([str(path)], capture_output=True, text=True, timeout=900)
        last = (out.stdout.strip().splitlines() or [""])[-1]
        _STARTED[name] = (probe() or last or None) if out.returncode == 0 else None
        if not _STARTED[name]:
            print(f"{script} could not start {name}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    started = _STARTED.get(name)
    if started:
        return started
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} is not reachable in CI: {script} must start it")
    reason = f"{name} is not reachable: `sudo {script}` installs and starts it"
    _SKIPPED[reason] = _SKIPPED.get(reason, 0) + 1
    pytest.skip(reason)


def _slurm_up() -> str | None:
    if shutil.which("scontrol") is None:
        return None
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30)
    return "localhost" if ping.returncode == 0 else None


@pytest.fixture(scope="session")
def slurm() -> None:
    """A real slurmctld + slurmd on localhost (scripts/slurm-up.sh)."""
    require_service("slurmctld", _slurm_up, "scripts/slurm-up.sh")


@pytest.fixture(autouse=True)
def _spotwise_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own SPOTWISE_HOME so jobs and databases never leak between tests."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path_factory.mktemp("spotwise-home")))
    monkeypatch.setenv("SPOTWISE_PLATFORM", "none")


_HANDLED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


@pytest.fixture(autouse=True)
def _signals_left_as_found() -> Iterator[None]:
    """Each test leaves this process's signal handlers as it found them: one left behind (a
    Run that never gave SIGTERM back, a library's handler) changes every later test of this
    worker, and SIGTERM left ignored is inherited by every machine the worker then launches.
    The handlers are put back either way, so one failure here stays one."""
    before = {signum: signal.getsignal(signum) for signum in _HANDLED}
    yield
    left = {
        signal.Signals(signum).name: signal.getsignal(signum)
        for signum, handler in before.items()
        if signal.getsignal(signum) != handler
    }
    for signum, handler in before.items():
        signal.signal(signum, handler)
    assert not left, f"the test left signal handlers changed: {left}"


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


@pytest.fixture()
def retail_api(monkeypatch: pytest.MonkeyPatch):
    """A loopback Azure Retail Prices API (tests/market/retail_api.py), set as the source's URL."""
    import importlib.util

    from spotwise import settings

    spec = importlib.util.spec_from_file_location(
        "retail_api", Path(__file__).parent / "market" / "retail_api.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with module.serving() as server:
        monkeypatch.setenv(settings.AZURE_PRICES_URL.name, module.url_of(server))
        yield server


@pytest.fixture()
def gcs_env(monkeypatch: pytest.MonkeyPatch):
    """A loopback Google Cloud Storage (spotwise.emulators.gcs) that the real
    google-cloud-storage client reaches through STORAGE_EMULATOR_HOST, with no credentials.
    Yields the emulator; ``gcs_bucket`` makes a bucket on it."""
    from spotwise.emulators.gcs import GcsEmulator

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    with GcsEmulator() as emulator:
        for name, value in emulator.env().items():
            monkeypatch.setenv(name, value)
        yield emulator


@pytest.fixture()
def gcs_bucket(gcs_env) -> str:
    from google.cloud import storage

    name = f"spotwise-{uuid.uuid4().hex[:12]}"
    storage.Client().create_bucket(name)
    return name


@pytest.fixture()
def azure_blob_env(monkeypatch: pytest.MonkeyPatch):
    """A loopback Azure Blob service (spotwise.emulators.azure_blob) that the real
    azure-storage-blob client reaches through AZURE_STORAGE_CONNECTION_STRING (the development
    account, shared-key signed). Yields the emulator; ``azure_container`` makes a container."""
    from spotwise.emulators.azure_blob import AzureBlobEmulator

    for name in ("AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_URL"):
        monkeypatch.delenv(name, raising=False)
    with AzureBlobEmulator() as emulator:
        for name, value in emulator.env().items():
            monkeypatch.setenv(name, value)
        yield emulator


@pytest.fixture()
def azure_container(azure_blob_env) -> str:
    from azure.storage.blob import BlobServiceClient

    name = f"spotwise-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(azure_blob_env.connection_string()).create_container(
        name
    )
    return name


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The PostgreSQL server of the store tests: ``SPOTWISE_TEST_POSTGRES_URL`` (.ci/run exports
    what scripts/pg-up.sh prints), or the URL the script prints when the tests start it."""
    return require_service(
        "PostgreSQL",
        lambda: os.environ.get("SPOTWISE_TEST_POSTGRES_URL", "").strip() or None,
        "scripts/pg-up.sh",
    )


@pytest.fixture(params=["sqlite", "postgres"])
def store_db(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """Runs a test on both databases of the job store: SQLite in the test's SPOTWISE_HOME, or a
    fresh schema of the test PostgreSQL, named by SPOTWISE_DB (so the processes the test starts
    use it too). Yields the database's URL (with its password)."""
    if request.param == "sqlite":
        monkeypatch.delenv("SPOTWISE_DB", raising=False)
        yield f"sqlite:///{os.environ['SPOTWISE_HOME']}/spotwise.db"
        return
    import secrets

    import sqlalchemy as sa

    base = sa.make_url(request.getfixturevalue("postgres_url"))
    schema = f"test_{secrets.token_hex(6)}"
    admin = sa.create_engine(base.set(drivername="postgresql+psycopg"), poolclass=sa.NullPool)
    with admin.begin() as db:
        db.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = base.update_query_dict({"options": f"-csearch_path={schema}"})
    monkeypatch.setenv("SPOTWISE_DB", url.render_as_string(hide_password=False))
    try:
        yield os.environ["SPOTWISE_DB"]
    finally:
        with admin.begin() as db:
            db.exec_driver_sql("SET lock_timeout = '10s'")
            db.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, before)
        signal.signal(signal.SIGXFSZ, handler)


@pytest.fixture()
def file_size_limit() -> Callable[[int], contextlib.AbstractContextManager[None]]:
    """``with file_size_limit(n):`` writes past ``n`` bytes fail with EFBIG (as on a full
    quota), for this process."""
    return _file_size_limit
