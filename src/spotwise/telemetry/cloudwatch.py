"""Ship the runtime's events (checkpoints, notices, GPU samples, logged metrics) to CloudWatch
Logs as well as to ``events.jsonl`` (boto3, the ``spotwise[aws]`` extra).

Turned on by ``SPOTWISE_CLOUDWATCH_LOG_GROUP`` (stream: ``SPOTWISE_CLOUDWATCH_LOG_STREAM``, by
default ``<job or run dir>/attempt-<n>/<pid>``). Events are buffered and sent by one daemon
thread every few seconds and at close, in batches the way ``PutLogEvents`` requires them: in
time order, at most 10,000 events and 1,048,576 bytes (each message's UTF-8 size plus 26), no
batch spanning more than 24 hours, messages cut to 256 KiB. The service no longer checks
sequence tokens, but older endpoints do: the token of each answer is sent with the next batch,
and a batch refused for its token is sent again once with the token the error names. A failure
to ship is logged, never raised: monitoring must not stop training.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from spotwise import settings
from spotwise.registry import require
from spotwise.telemetry.jsonsafe import dumps

log = logging.getLogger(__name__)

MAX_EVENTS = 10_000
MAX_BYTES = 1_048_576
EVENT_OVERHEAD = 26
MAX_MESSAGE_BYTES = 262_144 - EVENT_OVERHEAD
MAX_SPAN_MS = 24 * 3600 * 1000
FLUSH_S = 5.0


def batches(events: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split ``{"timestamp": ms, "message": str}`` events into valid PutLogEvents batches."""
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for e in sorted(events, key=lambda e: e["timestamp"]):
        n = len(e["message"].encode()) + EVENT_OVERHEAD
        if current and (
            len(current) == MAX_EVENTS
            or size + n > MAX_BYTES
            or e["timestamp"] - current[0]["timestamp"] > MAX_SPAN_MS
        ):
            out.append(current)
            current, size = [], 0
        current.append(e)
        size += n
    if current:
        out.append(current)
    return out


def message(record: dict[str, Any]) -> str:
    """One event as CloudWatch stores it: strict JSON (a NaN loss is null, as in every view),
    cut to the service's size limit."""
    text = dumps(record, default=str, separators=(",", ":"))
    raw = text.encode()
    return (
        text if len(raw) <= MAX_MESSAGE_BYTES else raw[:MAX_MESSAGE_BYTES].decode(errors="ignore")
    )


class CloudWatchSink:
    """An ``EventLog`` listener that ships every event to one log stream."""

    def __init__(
        self, group: str, stream: str, client: Any = None, flush_s: float = FLUSH_S
    ) -> None:
        boto3 = require("boto3", "aws", "shipping events to CloudWatch Logs")
        self.client = client or boto3.client("logs")
        self.group, self.stream = group, stream
        self._errors = self.client.exceptions
        self._token: str | None = None
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._create()
        self._thread = threading.Thread(
            target=self._loop, args=(flush_s,), daemon=True, name="spotwise-cloudwatch"
        )
        self._thread.start()

    @classmethod
    def from_environment(cls, default_stream: str) -> CloudWatchSink | None:
        group = settings.CLOUDWATCH_LOG_GROUP.text()
        if not group:
            return None
        stream = settings.CLOUDWATCH_LOG_STREAM.text() or default_stream
        require("boto3", "aws", "shipping events to CloudWatch Logs")  # a missing extra: say so
        try:
            return cls(group, stream)
        except Exception as exc:  # credentials, region, endpoint: botocore's errors are many
            log.warning(
                "not shipping events to CloudWatch Logs %s/%s: %s (set by %s)",
                group,
                stream,
                exc,
                settings.CLOUDWATCH_LOG_GROUP.name,
            )
            return None

    def _create(self) -> None:
        for create, kwargs in (
            (self.client.create_log_group, {}),
            (self.client.create_log_stream, {"logStreamName": self.stream}),
        ):
            with contextlib.suppress(self._errors.ResourceAlreadyExistsException):
                create(logGroupName=self.group, **kwargs)

    def __call__(self, record: dict[str, Any]) -> None:
        event = {
            "timestamp": int(float(record.get("time", time.time())) * 1000),
            "message": message(record),
        }
        with self._lock:
            self._pending.append(event)

    def _loop(self, flush_s: float) -> None:
        while not self._stop.wait(flush_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        with self._send_lock:
            for batch in batches(pending):
                self._put(batch)

    def _put(self, batch: list[dict[str, Any]], retry: bool = True) -> None:
        kwargs: dict[str, Any] = {
            "logGroupName": self.group,
            "logStreamName": self.stream,
            "logEvents": batch,
        }
        if self._token:
            kwargs["sequenceToken"] = self._token
        try:
            answer = self.client.put_log_events(**kwargs)
        except (
            self._errors.InvalidSequenceTokenException,
            self._errors.DataAlreadyAcceptedException,
        ) as exc:
            self._token = exc.response.get("expectedSequenceToken")
            if retry and "InvalidSequenceToken" in type(exc).__name__:
                self._put(batch, retry=False)
            return
        except Exception as exc:  # botocore's tree is wide; any failure only costs the batch
            log.warning(
                "could not ship %d events to CloudWatch Logs %s/%s: %s",
                len(batch),
                self.group,
                self.stream,
                exc,
            )
            return
        self._token = answer.get("nextSequenceToken") or self._token
        rejected = answer.get("rejectedLogEventsInfo")
        if rejected:
            log.warning(
                "CloudWatch Logs rejected some events of %s/%s: %s",
                self.group,
                self.stream,
                rejected,
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()
