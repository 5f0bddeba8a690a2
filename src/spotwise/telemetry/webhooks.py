"""Webhooks on job state changes: a Slack-compatible JSON POST, signed, retried, off the loop.

Configured per job (``notify: {webhooks: [{url, secret_from, states, timeout}]}``) and per
user for all their jobs (``spotwise users notify``, the same document in the store). The
controller only enqueues (:func:`notify_state`); one thread per destination posts, so a
receiver that is slow, down or never answers delays neither the job nor other destinations,
and its failures are logged (host only: a Slack URL's path is its secret; never the signing
secret) and retried with the storage layer's backoff. Deliveries left at exit get
``EXIT_DRAIN_S`` to finish.

Signature (docs/server.md, "Webhooks"): ``X-Spotwise-Timestamp: <unix seconds>`` and
``X-Spotwise-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed by the secret>``;
:func:`verify_signature` is the receiver's check.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import json
import logging
import os
import queue
import random
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from spotwise.durations import parse_duration_s
from spotwise.echo import shown
from spotwise.retry import RetryPolicy

if TYPE_CHECKING:
    from spotwise.control.store import Store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Spotwise-Signature"
TIMESTAMP_HEADER = "X-Spotwise-Timestamp"
DELIVERY_HEADER = "X-Spotwise-Delivery"  # the same on every retry of one delivery
SIGNATURE_TOLERANCE_S = 300.0  # how old a timestamp verify_signature accepts
EXIT_DRAIN_S = 10.0  # what a controller ending its job waits for the last deliveries
QUEUE_LIMIT = 1000  # deliveries waiting per destination; beyond it new ones are dropped
MAX_WEBHOOKS = 10
_ENV_REF = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]*)\Z")
_STATES = ("LAUNCHING", "RUNNING", "PREEMPTED", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED")
_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


# --- the job file's ``notify`` section -------------------------------------------------------
class Webhook(BaseModel):
    """One receiver of a job's state changes."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    url: str | None = None
    # env:NAME, read where the controller (the server) runs when posting; only the reference
    # is stored with the job: for the URL (a Slack URL is a credential) and the HMAC key.
    url_from: str | None = None
    secret_from: str | None = None  # None: unsigned (as a Slack incoming webhook expects)
    states: tuple[str, ...] = _STATES  # which states are sent (default: every change)
    timeout_s: float = Field(default=10.0, alias="timeout", gt=0, le=300)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        problem = None if v is None else url_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("url_from", "secret_from")
    @classmethod
    def _env_ref(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_REF.match(v):
            raise ValueError(
                "expected env:NAME, the environment variable of the controller (or server) "
                "that holds the value, e.g. env:WEBHOOK_SECRET"
            )
        return v

    @model_validator(mode="after")
    def _one_url(self) -> Webhook:
        if (self.url is None) == (self.url_from is None):
            raise ValueError("give exactly one of url and url_from")
        return self

    @field_validator("states", mode="before")
    @classmethod
    def _states(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        bad = [s for s in v if s not in _STATES] if isinstance(v, list) else []
        if bad:
            raise ValueError(
                f"{', '.join(map(shown, bad[:3]))}: not a state; allowed: {', '.join(_STATES)}"
            )
        return v

    @field_validator("timeout_s", mode="before")
    @classmethod
    def _timeout(cls, v: Any) -> float:
        return parse_duration_s(v)

    @property
    def where(self) -> str:
        """The destination as logs show it: ``env:NAME``, or the URL's scheme, host and port
        (a Slack URL's path is its secret)."""
        if self.url is None:
            return str(self.url_from)
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")

    def resolved_url(self) -> str | None:
        """The URL to post to now: ``url``, or the value of ``url_from``'s variable."""
        if self.url is not None:
            return self.url
        value = os.environ.get(str(self.url_from).removeprefix("env:"), "").strip()
        return value if value and not url_problem(value) else None


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be posted to, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected an http:// or https:// URL, e.g. https://hooks.slack.com/services/..."
    return None


class Notify(BaseModel):
    """The job file's ``notify`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    webhooks: list[Webhook] = Field(default_factory=list, max_length=MAX_WEBHOOKS)


# --- signing -----------------------------------------------------------------------------------
def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def verify_signature(
    secret: str,
    body: bytes,
    timestamp: str,
    signed: str,
    *,
    now: float | None = None,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
) -> bool:
    """The receiver's check: the body is the one signed with ``secret``, signed recently
    (an old timestamp is a replay)."""
    try:
        age = (time.time() if now is None else now) - int(timestamp)
    except ValueError:
        return False
    return abs(age) <= tolerance_s and hmac.compare_digest(
        signature(secret, timestamp, body), signed
    )


def state_body(job_id: str, job_name: str, state: str, message: str, at: float) -> dict[str, Any]:
    """What is posted: Slack's ``text``, and the same facts as fields for a program."""
    return {
        "text": f"spotwise: job {job_id} is {state}: {message}",
        "job_id": job_id,
        "job_name": job_name,
        "state": state,
        "message": message,
        "at": at,
    }


# --- delivery ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    webhook: Webhook
    body: bytes
    id: str


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A signed body is never re-sent to another address: a redirect is an answer (a failure)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class WebhookSender:
    """Posts deliveries from one thread per destination, in order, each retried with backoff."""

    def __init__(self, retry: RetryPolicy | None = None) -> None:
        self.retry = retry or RetryPolicy(max_attempts=5, base_delay_s=1.0, max_delay_s=30.0)
        self._queues: dict[str, queue.Queue[Delivery]] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0
        self._rand = random.Random()

    def send(self, delivery: Delivery) -> None:
        """Queue ``delivery``; never blocks (a full destination queue drops it, logged)."""
        with self._lock:
            key = delivery.webhook.url or delivery.webhook.where
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = queue.Queue(QUEUE_LIMIT)
                threading.Thread(
                    target=self._run, args=(q,), name="spotwise-webhook", daemon=True
                ).start()
            try:
                q.put_nowait(delivery)
            except queue.Full:
                log.warning("webhook %s: %d deliveries waiting; one dropped",
                            delivery.webhook.where, QUEUE_LIMIT)  # fmt: skip
                return
            self._pending += 1

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued delivery is done (sent or given up); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def _run(self, q: queue.Queue[Delivery]) -> None:
        while True:
            delivery = q.get()
            try:
                self._deliver(delivery)
            except Exception:  # a bug here must not end the destination's thread
                log.exception("webhook %s: delivery failed", delivery.webhook.where)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def _deliver(self, delivery: Delivery) -> None:
        hook = delivery.webhook
        for attempt in range(1, self.retry.max_attempts + 1):
            problem, retry = self._post(delivery)
            if problem is None:
                return
            if not retry or attempt == self.retry.max_attempts:
                log.warning("webhook %s: %s; not delivered (try %d of %d)",
                            hook.where, problem, attempt, self.retry.max_attempts)  # fmt: skip
                return
            delay = self.retry.delay_s(attempt, self._rand.random())
            log.info("webhook %s: %s; retry %d in %.1fs", hook.where, problem, attempt, delay)
            time.sleep(delay)

    def _post(self, delivery: Delivery) -> tuple[str | None, bool]:
        """(what went wrong or None, whether trying again may help)."""
        hook = delivery.webhook
        url = hook.resolved_url()
        if url is None:
            return f"{hook.url_from} is not set to an http(s) URL where the controller runs", False
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "spotwise-webhook",
            DELIVERY_HEADER: delivery.id,
        }
        if hook.secret_from is not None:
            name = hook.secret_from.removeprefix("env:")
            secret = os.environ.get(name)
            if not secret:
                return f"{hook.secret_from} is not set in the controller's environment", False
            timestamp = str(int(time.time()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = signature(secret, timestamp, delivery.body)
        request = urllib.request.Request(url, delivery.body, headers, method="POST")
        try:
            with _OPENER.open(request, timeout=hook.timeout_s) as response:
                response.read(65536)
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code}", exc.code >= 500 or exc.code in (408, 429)
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out, DNS
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            return f"{type(reason).__name__}: {reason}", True
        return None, False


_sender: WebhookSender | None = None
_sender_lock = threading.Lock()
_last_state: dict[str, str] = {}  # job id -> the state last sent (a repeated one is not sent)


def default_sender() -> WebhookSender:
    """The process's sender, started at first use; its deliveries get EXIT_DRAIN_S at exit."""
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = WebhookSender()
            atexit.register(_sender.drain, EXIT_DRAIN_S)
        return _sender


def notify_state(
    store: Store,
    job_id: str,
    job_name: str,
    owner: str | None,
    notify: Notify | None,
    state: str,
    message: str,
) -> None:
    """Queue the job's new state for each webhook of the job (``notify``) and of its ``owner``
    that wants it; returns at once and never raises (the job's state is already recorded).
    The caller knows the owner (it never changes), so a state change reads no job row."""
    if _last_state.get(job_id) == state:
        return
    if state in _TERMINAL:
        _last_state.pop(job_id, None)
    else:
        _last_state[job_id] = state
    hooks = list(notify.webhooks) if notify is not None else []
    try:
        hooks += owner_webhooks(store, owner)
    except Exception as exc:  # the store, or a user's document from a newer spotwise
        log.warning("webhooks of job %s's owner not read: %s", job_id, type(exc).__name__)
    body = json.dumps(state_body(job_id, job_name, state, message, time.time())).encode()
    for hook in dict.fromkeys(hooks):  # (one given for the job and its owner is posted once)
        if state in hook.states:
            default_sender().send(Delivery(hook, body, uuid.uuid4().hex))


def owner_webhooks(store: Store, owner: str | None) -> list[Webhook]:
    """The webhooks a job's owner set for all their jobs (``spotwise users notify``)."""
    if owner is None:  # embedded: no users
        return []
    notify = store.accounts.user(owner).notify
    return [] if notify is None else Notify.model_validate(notify).webhooks
