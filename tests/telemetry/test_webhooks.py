"""Job state webhooks against a real HTTP receiver on 127.0.0.1: what is posted, its signature,
retries after a 500, a receiver that never answers, and the job file's ``notify`` key."""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spotwise.control.controller import Controller
from spotwise.control.spec import parse_spec
from spotwise.control.store import JobState, Store
from spotwise.errors import ConfigError
from spotwise.storage.s3 import RetryPolicy
from spotwise.telemetry.webhooks import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Delivery,
    Webhook,
    WebhookSender,
    default_sender,
    state_body,
    verify_signature,
)

SECRET = "s3cr3t-for-the-hmac"
FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers each POST with the next of ``codes`` (the last one from then on); while
    ``hold`` is clear, every request waits unanswered."""

    codes: list[int]
    url: str = ""
    got: queue.Queue[Received] = field(default_factory=queue.Queue)
    hold: threading.Event = field(default_factory=threading.Event)

    def next_code(self) -> int:
        return self.codes.pop(0) if len(self.codes) > 1 else self.codes[0]


@contextlib.contextmanager
def serving(box: Receiver) -> Iterator[Receiver]:
    """``box`` answering on 127.0.0.1 (its ``url``) until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            box.got.put(Received(dict(self.headers.items()), body))
            box.hold.wait(60)
            self.send_response(box.next_code())
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    box.url = f"http://127.0.0.1:{server.server_port}/services/T000/B000/slackpath"
    try:
        yield box
    finally:
        box.hold.set()
        server.shutdown()
        server.server_close()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    box = Receiver([200])
    box.hold.set()
    with serving(box):
        yield box


def _delivery(**fields: str) -> Delivery:
    hook = Webhook.model_validate({"secret_from": "env:HOOK_SECRET", "timeout": "5s", **fields})
    body = json.dumps(state_body("t-abc123", "t", "SUCCEEDED", "exit 0", 1.0)).encode()
    return Delivery(hook, body, "d1")


def test_a_delivery_is_signed_and_retried_after_a_500(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("HOOK_URL", receiver.url)  # a Slack URL kept out of the job store
    receiver.codes = [500, 503, 200]
    sender = WebhookSender(FAST)
    with caplog.at_level(logging.INFO, logger="spotwise.telemetry.webhooks"):
        sender.send(_delivery(url_from="env:HOOK_URL"))
        assert sender.drain(30)
    tries = [receiver.got.get_nowait() for _ in range(3)]
    assert receiver.got.empty()
    for got in tries:
        doc = json.loads(got.body)
        assert doc["text"] == "spotwise: job t-abc123 is SUCCEEDED: exit 0"
        assert (doc["job_id"], doc["state"]) == ("t-abc123", "SUCCEEDED")
        assert got.headers[DELIVERY_HEADER] == "d1"
        ts, signed = got.headers[TIMESTAMP_HEADER], got.headers[SIGNATURE_HEADER]
        assert signed.startswith("sha256=") and verify_signature(SECRET, got.body, ts, signed)
        assert not verify_signature("another secret", got.body, ts, signed)
        assert not verify_signature(SECRET, got.body + b" ", ts, signed)
        assert not verify_signature(SECRET, got.body, ts, signed, now=int(ts) + 301.0)
    logged = caplog.text
    assert "webhook env:HOOK_URL: HTTP 500; retry 1" in logged and "HTTP 503; retry 2" in logged
    assert SECRET not in logged and "slackpath" not in logged


def test_failures_are_given_up_and_logged_without_secrets(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    receiver.codes = [404]
    sender = WebhookSender(FAST)
    sender.send(_delivery(url=receiver.url))  # a 4xx is an answer: not retried
    sender.send(_delivery(url=receiver.url, secret_from="env:NOT_SET_ANYWHERE"))  # not sent
    sender.send(_delivery(url_from="env:NOT_SET_EITHER"))
    assert sender.drain(30)
    assert receiver.got.qsize() == 1
    port = receiver.url.split(":")[2].split("/")[0]
    assert f"webhook http://127.0.0.1:{port}: HTTP 404; not delivered (try 1 of 4)" in caplog.text
    assert "env:NOT_SET_ANYWHERE is not set in the controller's environment" in caplog.text
    assert "env:NOT_SET_EITHER is not set to an http(s) URL" in caplog.text
    assert SECRET not in caplog.text and "slackpath" not in caplog.text


def _spec(tmp_path: Path, *webhooks: dict[str, object]):
    doc = {
        "name": "hooked",
        "command": "python -c 'import time; time.sleep(3)'",  # seen running, however loaded
        "provider": "local",
        "restart_backoff": 0,
        "notify": {"webhooks": list(webhooks)},
    }
    return parse_spec(doc, base_dir=tmp_path)


def test_a_job_posts_its_states_and_a_receiver_that_never_answers_does_not_delay_it(
    receiver: Receiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two receivers: the job file's answers, its owner's holds every request unanswered
    until the job ended."""
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    silent = Receiver([200])  # hold not set: requests wait
    with serving(silent):
        spec = _spec(tmp_path, {"url": receiver.url, "secret_from": "env:HOOK_SECRET"})
        store = Store()
        # the silent one is the webhook of the job's owner, for all their jobs
        store.accounts.add_user("alice", "user")
        store.accounts.set_notify("alice", {"webhooks": [{"url": silent.url, "timeout": "60s"}]})
        job = store.create_job(spec.name, spec.model_dump(mode="json"), None, owner="alice")
        assert Controller(store, job.id).run() is JobState.SUCCEEDED
        # the job ended with no answer from the silent receiver, which holds its first request
        assert not silent.hold.is_set()
        assert json.loads(silent.got.get(timeout=30).body)["state"] == "LAUNCHING"
        states = []
        while not states or states[-1] != "SUCCEEDED":
            got = receiver.got.get(timeout=30)
            assert verify_signature(
                SECRET, got.body, got.headers[TIMESTAMP_HEADER], got.headers[SIGNATURE_HEADER]
            )
            states.append(json.loads(got.body)["state"])
        assert states == ["LAUNCHING", "RUNNING", "SUCCEEDED"]
        silent.hold.set()
        assert default_sender().drain(30)
    assert silent.got.qsize() == 2  # the others in their turn, once answered


@pytest.mark.parametrize(
    ("hook", "needle"),
    [
        ({"url": "ftp://x"}, "notify.webhooks.0.url: expected an http://"),
        ({"url": "http://h:99999"}, "notify.webhooks.0.url: expected an http://"),
        ({"url": "https://h", "url_from": "env:U"}, "notify.webhooks.0: give exactly one of url"),
        ({"states": ["RUNNING"]}, "notify.webhooks.0: give exactly one of url and url_from"),
        ({"url": "https://h", "secret": "x"}, "notify.webhooks.0.secret: unknown field"),
        (
            {"url": "https://h", "secret_from": "HOOK"},
            "notify.webhooks.0.secret_from: expected env:NAME",
        ),
        ({"url": "https://h", "states": ["DONE"]}, "notify.webhooks.0.states: 'DONE': not a state"),
        (
            {"url": "https://h", "timeout": "soon"},
            "notify.webhooks.0.timeout: 'soon' is not a duration",
        ),
    ],
)
def test_a_bad_webhook_names_its_key(tmp_path: Path, hook: dict[str, object], needle: str):
    with pytest.raises(ConfigError) as err:
        _spec(tmp_path, hook)
    assert needle in str(err.value)
