"""The unsupervised-machine watchdog's decisions (fresh, stale, none, clock skew), its detector
against a real local store that the controller's :class:`Heartbeat` writes, and the job file's
``unsupervised_limit``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spotwise import settings
from spotwise.control.heartbeat import Heartbeat, heartbeat_location, machine_env
from spotwise.control.spec import parse_spec
from spotwise.errors import ConfigError, NoticeError
from spotwise.notices.heartbeat import (
    HEARTBEAT_KEY,
    HeartbeatDetector,
    Unsupervised,
    beat_every_s,
    heartbeat_detectors,
    renew_due,
)
from spotwise.notices.platform import plan_from_environment

LOCATION_ENV = settings.HEARTBEAT_URI.name
LIMIT_ENV = settings.UNSUPERVISED_LIMIT_S.name


def beat(written: float, by: str = "host pid 1") -> bytes:
    return json.dumps({"written_unix": written, "controller": by}).encode()


def test_a_heartbeat_that_keeps_changing_is_fresh_however_long_the_machine_runs():
    watch = Unsupervised(limit_s=10.0, changed_at=0.0)
    for t in range(0, 100, 3):
        assert not watch.observe(beat(t), float(t))


def test_a_heartbeat_unchanged_for_the_limit_is_stale_and_a_read_failure_is_no_change():
    watch = Unsupervised(limit_s=10.0, changed_at=0.0)
    assert not watch.observe(beat(1), 1.0)
    assert not watch.observe(beat(1), 10.9)  # the same bytes: no renewal seen
    assert not watch.observe(None, 10.95)  # (unreadable: nothing learnt)
    assert watch.observe(None, 11.0)
    assert watch.observe(beat(1), 50.0)


def test_no_heartbeat_ever_counts_from_the_watchdogs_start():
    watch = Unsupervised(limit_s=5.0, changed_at=100.0)
    assert not watch.observe(None, 104.9)
    assert watch.observe(None, 105.0)


@pytest.mark.parametrize("skew_s", [-86400.0 * 365, 0.0, 86400.0 * 365])
def test_the_controllers_clock_is_never_compared_with_the_machines(skew_s: float):
    """A controller a year ahead of or behind the machine: renewals keep the machine going, and
    the last one stops it exactly ``limit`` of the machine's own time after it was seen."""
    watch = Unsupervised(limit_s=5.0, changed_at=0.0)
    for t in range(0, 20):
        assert not watch.observe(beat(t + skew_s), float(t))
    assert not watch.observe(beat(19 + skew_s), 23.9)
    assert watch.observe(beat(19 + skew_s), 24.0)


def test_the_controller_renews_a_few_times_per_limit_not_at_every_tick():
    assert beat_every_s(3.0) == 0.5
    assert beat_every_s(3600.0) == 60.0  # at most a minute between writes
    assert renew_due(None, 0.0, 3.0)
    assert not renew_due(10.0, 10.25, 3.0)  # a server ticks every 0.25 s
    assert renew_due(10.0, 10.5, 3.0)
    assert renew_due(10.0, 9.0, 3.0)  # a clock that went back renews at once


def test_the_detector_reads_what_the_controller_writes_and_latches_its_notice(tmp_path: Path):
    now = [0.0]
    writer = Heartbeat(str(tmp_path), 6.0)
    detector = HeartbeatDetector(str(tmp_path), 6.0, grace_s=5.0, clock=lambda: now[0])
    assert detector.poll_interval_s == 1.0
    for t in range(12):  # a controller renewing (its clock is not the machine's)
        now[0] = float(t)
        assert writer.beat(1e9 + t) is None
        assert detector.poll() is None
    doc = json.loads((tmp_path / HEARTBEAT_KEY).read_bytes())
    assert doc["controller"] == writer.identity and doc["unsupervised_limit_s"] == 6.0
    now[0] = 16.9  # the controller is gone since its write at t=11
    assert detector.poll() is None
    now[0] = 17.0
    notice = detector.poll()
    assert notice is not None and notice.is_terminate and notice.source == "heartbeat"
    assert notice.action == "unsupervised" and notice.deadline_monotonic == 22.0
    writer.beat(2e9)  # too late: the machine is already saving and stopping
    now[0] = 18.0
    assert detector.poll() == notice


def test_a_heartbeat_the_controller_cannot_write_is_reported_once(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    writer = Heartbeat(str(blocker / "checkpoint"), 6.0)
    said = writer.beat(0.0)
    assert said is not None and "cannot renew the heartbeat" in said and "6s" in said
    assert writer.beat(0.2) is None  # not due again yet
    assert writer.beat(5.0) is None  # failing still: said once
    blocker.unlink()
    assert writer.beat(10.0) == f"heartbeat in {blocker / 'checkpoint'} renewed again"


def test_the_machine_gets_the_watchdog_only_where_both_sides_reach_the_heartbeat():
    assert heartbeat_location("/runs/j", same_host=True) == "/runs/j"
    assert heartbeat_location("s3://b/jobs/j/checkpoint", same_host=False) is not None
    assert heartbeat_location("/mnt/pvc/j", same_host=False) is None  # a pod's volume
    assert machine_env(3600.0, "/runs/j") == {LOCATION_ENV: "/runs/j", LIMIT_ENV: "3600"}
    assert machine_env(None, "/runs/j") == {} and machine_env(60.0, None) == {}
    assert Heartbeat("/runs/j", None).beat(0.0) is None  # none: nothing written


def test_the_watcher_runs_the_watchdog_from_the_machines_environment(tmp_path: Path):
    env = {"SPOTWISE_PLATFORM": "none", LOCATION_ENV: str(tmp_path), LIMIT_ENV: "30"}
    plan = plan_from_environment(env)
    plan.signals.close()  # (it installed this process's signal handlers: give them back)
    [detector] = [d for d in plan.remote if d.name == "heartbeat"]
    assert isinstance(detector, HeartbeatDetector) and detector.limit_s == 30.0
    assert heartbeat_detectors({"SPOTWISE_PLATFORM": "none"}) == []
    with pytest.raises(NoticeError, match=LIMIT_ENV):
        heartbeat_detectors({LOCATION_ENV: str(tmp_path), LIMIT_ENV: "soon"})


def _spec(tmp_path: Path, **extra: object):
    return parse_spec({"command": "true", **extra}, base_dir=tmp_path)


def test_the_job_file_key_default_none_and_a_clear_error(tmp_path: Path):
    assert _spec(tmp_path).unsupervised_limit_s == 3600.0
    assert _spec(tmp_path, unsupervised_limit="90m").unsupervised_limit_s == 5400.0
    assert _spec(tmp_path, unsupervised_limit="none").unsupervised_limit_s is None
    assert _spec(tmp_path, unsupervised_limit=None).unsupervised_limit_s is None
    for bad, why in (("0.5s", "at least 1s"), ("soon", "'soon' is not a duration")):
        with pytest.raises(ConfigError) as err:
            _spec(tmp_path, unsupervised_limit=bad)
        assert f"unsupervised_limit: {why}" in err.value.message
        assert "none to never stop a machine" in err.value.message
