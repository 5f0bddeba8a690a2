"""Events shipped to CloudWatch Logs: a real training process against moto on loopback, and
the batching and sequence-token rules of PutLogEvents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import boto3
from botocore.stub import Stubber

from spotwise.telemetry.cloudwatch import MAX_BYTES, MAX_EVENTS, CloudWatchSink, batches, message
from spotwise.telemetry.events import read_events

from .tools import TRAIN


def test_a_training_process_ships_its_events(aws_env: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SPOTWISE_CLOUDWATCH_LOG_GROUP": "/spotwise/test",
        "SPOTWISE_JOB_ID": "job-1",
        "SPOTWISE_ATTEMPT": "2",
    }
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN, str(tmp_path / "run"), "60", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    logs = boto3.client("logs", region_name="us-east-1")
    [stream] = logs.describe_log_streams(logGroupName="/spotwise/test")["logStreams"]
    assert stream["logStreamName"].startswith("job-1/attempt-2/")
    got = logs.get_log_events(
        logGroupName="/spotwise/test", logStreamName=stream["logStreamName"], startFromHead=True
    )
    shipped = [json.loads(e["message"]) for e in got["events"]]
    local = read_events(tmp_path / "run" / "events.jsonl")
    assert shipped == local  # every event, in order, the same records as events.jsonl
    assert [e["kind"] for e in shipped][-1] == "finished"
    assert {e["timestamp"] for e in got["events"]} == {int(e["time"] * 1000) for e in local}


def test_batches_follow_the_service_limits() -> None:
    many = [{"timestamp": 1000 + i, "message": "x"} for i in range(25_000)]
    split = batches(list(reversed(many)))
    assert [len(b) for b in split] == [MAX_EVENTS, MAX_EVENTS, 5_000]
    assert [e["timestamp"] for b in split for e in b] == sorted(e["timestamp"] for e in many)
    big = [{"timestamp": i, "message": "y" * 200_000} for i in range(12)]
    sizes = [sum(len(e["message"]) + 26 for e in b) for b in batches(big)]
    assert all(s <= MAX_BYTES for s in sizes) and sum(len(b) for b in batches(big)) == 12
    day = 24 * 3600 * 1000
    spread = [{"timestamp": t, "message": "z"} for t in (0, day - 1, day + 1, 3 * day)]
    assert [len(b) for b in batches(spread)] == [2, 1, 1]


def test_a_refused_sequence_token_is_retried_with_the_expected_one() -> None:
    client = boto3.client(
        "logs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    stub.add_response("create_log_group", {}, {"logGroupName": "g"})
    stub.add_response("create_log_stream", {}, {"logGroupName": "g", "logStreamName": "s"})
    stub.add_client_error(
        "put_log_events",
        "InvalidSequenceTokenException",
        response_meta={},
        modeled_fields={"expectedSequenceToken": "t-42"},
    )
    stub.add_response(
        "put_log_events",
        {"nextSequenceToken": "t-43"},
        {
            "logGroupName": "g",
            "logStreamName": "s",
            "sequenceToken": "t-42",
            "logEvents": [{"timestamp": 5000, "message": '{"time":5,"kind":"a"}'}],
        },
    )
    stub.add_response(
        "put_log_events",
        {"nextSequenceToken": "t-44"},
        {
            "logGroupName": "g",
            "logStreamName": "s",
            "sequenceToken": "t-43",
            "logEvents": [{"timestamp": 6000, "message": '{"time":6,"kind":"b"}'}],
        },
    )
    with stub:
        sink = CloudWatchSink("g", "s", client=client, flush_s=3600)
        sink({"time": 5, "kind": "a"})
        sink.flush()
        sink({"time": 6, "kind": "b"})  # the next batch carries the token of the last answer
        sink.close()
        stub.assert_no_pending_responses()


def test_a_diverged_loss_is_shipped_as_strict_json() -> None:
    """CloudWatch Logs Insights and every JSON consumer reject ``NaN``; a diverged run's loss
    is shipped as null, as every other view writes it."""

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    record = {"kind": "step", "loss": float("nan"), "grad": [float("inf"), -float("inf"), 1.5]}
    assert json.loads(message(record), parse_constant=refuse) == {
        "kind": "step",
        "loss": None,
        "grad": [None, None, 1.5],
    }
