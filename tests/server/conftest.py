"""The server as a real process on 127.0.0.1 (a free port), and a small HTTP client for it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SERVE = Path(__file__).with_name("_serve.py")
URL = re.compile(r"spotwise server on (http://\S+?)/ ")


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str

    def call(
        self, method: str, path: str, token: str | None = "admin-token", body: bytes | None = None
    ) -> Answer:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.url + path, body, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return Answer(r.status, r.read(), {k.lower(): v for k, v in r.headers.items()})
        except urllib.error.HTTPError as e:
            return Answer(e.code, e.read())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def start_server() -> Server:
    """Start the server and wait for the line that says where it listens."""
    proc = subprocess.Popen(
        [sys.executable, str(SERVE)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = URL.search(line)
    if found is None:
        proc.kill()
        pytest.fail(f"the server did not start: {line!r}")
    return Server(proc, found.group(1))


@pytest.fixture()
def server() -> Iterator[Callable[[], Server]]:
    """``server()`` starts one (again after a kill); all are stopped at the end."""
    started: list[Server] = []

    def start() -> Server:
        started.append(start_server())
        return started[-1]

    yield start
    for s in started:
        s.stop()


def wait_until(pred: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while not pred():
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.1)
