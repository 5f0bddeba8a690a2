"""The provider seam as the job file and the controller see it: names and typed options from the
registry (plugins included), features instead of names, orphans swept."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from spotwise.control.controller import Controller
from spotwise.control.providers import LaunchRequest, Placement, make_provider
from spotwise.control.spec import parse_spec
from spotwise.control.store import Store
from spotwise.control.submission import submit
from spotwise.control.summary import job_summary
from spotwise.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"


def test_a_misspelt_provider_gets_did_you_mean(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        parse_spec({"command": "x", "provider": "slrum"}, base_dir=tmp_path)
    assert "provider.name" in str(info.value) and "did you mean slurm" in str(info.value)


def test_provider_options_are_typed_and_named_in_the_users_words(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        parse_spec(
            {
                "command": "x",
                "provider": {
                    "name": "sim",
                    "time_compression": "fast",
                    "notice": "email",
                    "boot": 1,
                },
            },
            base_dir=tmp_path,
        )
    text = str(info.value)
    assert "provider.sim.time_compression" in text and "'fast'" in text
    assert "provider.sim.notice" in text and "'email'" in text
    assert "provider.sim.boot: unknown option; did you mean 'boot_s'?" in text


PLUGIN = '''
from spotwise.control.providers.fake import FakeOptions, FakeProvider


class DemoOptions(FakeOptions):
    colour: str = "blue"


class DemoProvider(FakeProvider):
    """A provider that lives in another package, found through its entry point."""

    name = "demo"
    Options = DemoOptions
'''

USE_PLUGIN = """
import sys
from spotwise.control.controller import Controller
from spotwise.control.submission import submit
from spotwise.control.summary import job_summary
from spotwise.control.spec import parse_spec
from spotwise.control.store import Store
from spotwise.errors import ConfigError

try:
    parse_spec({"command": "x", "provider": {"name": "demo", "colour": 3}})
except ConfigError as exc:
    print("rejected:", exc.message)
spec = parse_spec({"command": "x", "provider": {"name": "demo", "colour": "red",
                                                "exits": [75, 0]}})
store = Store()
job = submit(store, spec)
Controller(store, job.id).run()
s = job_summary(store, store.job(job.id))
print("state:", s["state"], "attempts:", len(s["attempts"]), "provider:", s["provider"])
"""


def test_a_provider_from_another_package_is_accepted_by_entry_point(tmp_path: Path):
    site = tmp_path / "site"
    (site / "spotwise_demo_plugin").mkdir(parents=True)
    (site / "spotwise_demo_plugin" / "__init__.py").write_text(PLUGIN)
    dist = site / "spotwise_demo_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spotwise-demo-plugin\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[spotwise.providers]\ndemo = spotwise_demo_plugin:DemoProvider\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{site}")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(USE_PLUGIN)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "\n  provider.demo.colour: Input should be a valid string (given: 3)" in out.stdout
    assert "state: SUCCEEDED attempts: 2 provider: demo" in out.stdout


def _fake_job(tmp_path: Path, **options):
    spec = parse_spec(
        {
            "name": "f",
            "command": "x",
            "restart_backoff": 0,
            "provider": {"name": "fake", **options},
        },
        base_dir=tmp_path,
    )
    store = Store()
    job = submit(store, spec)
    provider = make_provider("fake", spec.provider.options, epoch=job.created_at)
    return store, job, provider


def test_preempted_and_lost_attempts_recover_on_the_fake(tmp_path: Path):
    store, job, fake = _fake_job(tmp_path, exits=[75, "lost", 0], run_s=0.05, full=["fake-a"])
    assert Controller(store, job.id, provider=fake).run().value == "SUCCEEDED"
    s = job_summary(store, store.job(job.id))
    assert [a["reason"] for a in s["attempts"]] == ["preempted", "lost", "succeeded"]
    assert s["preemptions"] == 2
    # fake-a has no spot capacity: no attempt ever ran there on spot
    assert all(r.placement != Placement("spot", "fake-a") for r in fake.launches)
    assert all(r.env["SPOTWISE_PLATFORM"] == "none" for r in fake.launches)  # features.platform


def test_machines_no_attempt_owns_are_terminated_at_start_and_end(tmp_path: Path):
    store, job, fake = _fake_job(tmp_path, exits=[0], run_s=[0.3, 60.0])
    # what a crashed controller could leave: a machine for an attempt the store never opened
    req = LaunchRequest(
        job_id=job.id,
        n=7,
        argv=("x",),
        workdir=tmp_path,
        env={},
        log_path=tmp_path / "log",
        attempt_dir=tmp_path / "a7",
        placement=Placement("spot", "fake-b"),
    )
    stray = fake.launch(req)
    fake.opts.run_s = [0.3]  # the job's own attempt is short
    assert Controller(store, job.id, provider=fake).run().value == "SUCCEEDED"
    assert fake.status(stray).phase.value in ("exited", "lost")
    events = [e["message"] for e in store.events(job.id) if e["kind"] == "orphan"]
    assert events == [f"terminating {stray['id']} (attempt 7), which no live attempt owns"]
