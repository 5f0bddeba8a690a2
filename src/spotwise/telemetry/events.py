"""A tiny append-only JSONL event log: one ``{"time": ..., "kind": ..., ...}`` object a line.

Each event is a single ``write`` on a file opened with O_APPEND, so concurrent writers (the
training loop and its background saver, or several processes) never interleave within a line,
and a crash loses at most the event being written. The file is opened relative to its
directory without following a link (a planted ``events.jsonl -> elsewhere`` is not written
through, nor read) and non-blocking (a planted FIFO cannot hang the run).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spotwise.dirfd import open_entry, opened_dir

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"  # the runtime's event log, in its run directory
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK


class EventLog:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self._warned = False  # a failing log is reported once, not once per event

    def subscribe(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Also hand every event emitted from now on to ``listener`` (live metrics use it)."""
        self._listeners.append(listener)

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one event; failures are logged, never raised (events are not worth a crash)."""
        record = {"time": time.time(), "kind": kind, **fields}
        for listener in self._listeners:
            try:
                listener(record)
            except Exception as exc:  # a metrics or shipping bug must not stop training
                log.warning("event listener %r failed on %s: %s", listener, kind, exc)
        line = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with opened_dir(self.path.parent) as parent:
                fd = open_entry(parent, self.path.name, _APPEND)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(level, "could not record event %s in %s: %s", kind, self.path, exc)


def read_events(path: str | os.PathLike[str], kind: str | None = None) -> list[dict[str, Any]]:
    """All events in the log (optionally of one kind), skipping a torn last line."""
    path = Path(path)
    try:
        with opened_dir(path.parent) as parent:
            fd = open_entry(parent, path.name, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as file:
            text = file.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:  # a link (never followed) or no regular file
        log.warning("not reading events from %s: %s", path, exc.strerror)
        return []
    events = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            log.warning("skipping a malformed event line in %s", path)
            continue
        if kind is None or record.get("kind") == kind:
            events.append(record)
    return events
