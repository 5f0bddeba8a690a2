"""SLURM: end time and GraceTime from env and recorded scontrol/squeue output."""

from __future__ import annotations

import os
import signal
import time

import pytest

from spotwise.notices.slurm import (
    SlurmDetector,
    grace_time_s,
    parse_end_time,
    parse_scontrol,
)

# `scontrol show partition preempt` output (slurm 23.x layout), trimmed of nothing.
PARTITION = """PartitionName=preempt
   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL
   AllocNodes=ALL Default=NO QoS=N/A
   DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=120 Hidden=NO
   MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED
   Nodes=localhost
   PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO
   OverTimeLimit=NONE PreemptMode=REQUEUE
   State=UP TotalCPUs=2 TotalNodes=1 SelectTypeParameters=NONE
"""
NO_GRACE = PARTITION.replace("GraceTime=120", "GraceTime=0")
JOB = (
    "JobId=42 JobName=train UserId=me(1000) JobState=RUNNING Reason=None "
    "RunTime=00:01:00 TimeLimit=00:10:00 StartTime=2026-11-29T23:00:00 "
    "EndTime=2026-11-29T23:10:00 Partition=preempt"
)


def test_parse_recorded_output() -> None:
    fields = parse_scontrol(JOB)
    assert fields["JobId"] == "42" and fields["Partition"] == "preempt"
    assert parse_end_time(fields["EndTime"]) == time.mktime(
        time.strptime("2026-11-29T23:10:00", "%Y-%m-%dT%H:%M:%S")
    )
    assert grace_time_s(PARTITION) == 120.0
    assert grace_time_s(NO_GRACE) is None
    assert grace_time_s("") is None


@pytest.mark.parametrize("text", ["N/A", "Unknown", "", "  ", "garbage"])
def test_unknown_end_times(text: str) -> None:
    assert parse_end_time(text) is None


def test_epoch_end_time_from_env() -> None:
    assert parse_end_time("1764457800") == 1764457800.0


def recorder(outputs: dict[str, str]):  # type: ignore[no-untyped-def]
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv)
        return outputs.get(argv[0])

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_signal_deadline_is_the_job_end_time() -> None:
    end = time.time() + 90.0
    runner = recorder({})
    det = SlurmDetector(
        env={"SLURM_JOB_ID": "42", "SLURM_JOB_END_TIME": str(int(end))},
        runner=runner,
        refresh_in_background=False,
    )
    try:
        assert det.installed == ("TERM", "INT", "USR1")
        os.kill(os.getpid(), signal.SIGUSR1)
        notice = det.poll()
        assert notice is not None and notice.action == "SIGUSR1" and notice.source == "slurm"
        left = notice.deadline_monotonic - notice.received_monotonic
        assert 85.0 < left <= 90.0
        assert ["squeue", "-h", "-j", "42", "-o", "%e"] in runner.calls  # re-read on the signal
    finally:
        det.close()


def test_live_end_time_from_squeue_wins() -> None:
    later = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 300))
    det = SlurmDetector(
        env={"SLURM_JOB_ID": "42", "SLURM_JOB_END_TIME": str(int(time.time() + 60))},
        runner=recorder({"squeue": later + "\n"}),
        refresh_in_background=False,
    )
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        notice = det.poll()
        left = notice.deadline_monotonic - notice.received_monotonic
        assert 290.0 < left <= 300.0
    finally:
        det.close()


def test_sigterm_deadline_is_the_partition_grace_time() -> None:
    det = SlurmDetector(
        env={"SLURM_JOB_ID": "42", "SLURM_JOB_PARTITION": "preempt"},
        runner=recorder({"scontrol": PARTITION}),
        refresh_in_background=False,
    )
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        notice = det.poll()
        assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(120.0)
    finally:
        det.close()


def test_without_grace_time_sigterm_gets_killwait() -> None:
    det = SlurmDetector(
        env={"SLURM_JOB_ID": "42", "SLURM_JOB_PARTITION": "preempt"},
        runner=recorder({"scontrol": NO_GRACE}),
        refresh_in_background=False,
    )
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        notice = det.poll()
        assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(30.0)
    finally:
        det.close()


def test_failing_slurm_commands_fall_back_to_defaults() -> None:
    det = SlurmDetector(
        env={"SLURM_JOB_ID": "42", "SLURM_JOB_PARTITION": "preempt"},
        runner=recorder({}),  # every command fails (None)
        refresh_in_background=False,
    )
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        notice = det.poll()
        assert notice.deadline_monotonic - notice.received_monotonic == pytest.approx(60.0)
    finally:
        det.close()
