"""The JSONL event log."""

from __future__ import annotations

import threading
from pathlib import Path

from spotwise.telemetry.events import EventLog, read_events


def test_events_append_and_filter(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "sub" / "events.jsonl")
    log.emit("checkpoint", step=5, bytes=10)
    log.emit("notice", source="aws")
    events = read_events(log.path)
    assert [e["kind"] for e in events] == ["checkpoint", "notice"]
    assert events[0]["step"] == 5 and isinstance(events[0]["time"], float)
    assert read_events(log.path, "notice") == [events[1]]


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl")
    payload = "x" * 2000

    def write(n: int) -> None:
        for i in range(50):
            log.emit("w", writer=n, i=i, payload=payload)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = read_events(log.path)
    assert len(events) == 200 and all(e["payload"] == payload for e in events)


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    EventLog(path).emit("ok")
    with open(path, "a") as f:
        f.write('{"kind": "tor')
    assert [e["kind"] for e in read_events(path)] == ["ok"]
