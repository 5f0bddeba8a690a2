"""Machines' ends as events: one thread waits on every driven job's end descriptor at once.

A provider that can say when an attempt's machine ends (``end_fd``: the sim and local
providers' pidfd of the machine process) lets the driver tick a running job only when its
machine ends, instead of polling a thousand machines every fraction of a second; the job's
next launch then follows the end within one tick. Jobs whose provider has no such descriptor
are polled as before.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections.abc import Callable
from typing import Any

from spotwise.control.providers import Handle

log = logging.getLogger(__name__)


class Ends:
    """Calls ``on_end(job_id)`` once when the machine a job is :meth:`watch`\\ ing ends."""

    def __init__(self, on_end: Callable[[str], None]) -> None:
        self._on_end = on_end
        self._epoll = select.epoll()
        self._stop_r, self._stop_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._stop_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._jobs: dict[int, str] = {}  # descriptor -> job
        self._watched: dict[str, tuple[str, int]] = {}  # job -> (machine's id, descriptor)
        self._thread = threading.Thread(target=self._loop, name="spotwise-ends", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        os.write(self._stop_w, b"x")
        self._thread.join()
        with self._lock:
            for job_id in list(self._watched):
                self._forget(job_id)
        self._epoll.close()
        os.close(self._stop_r)
        os.close(self._stop_w)

    def watch(self, job_id: str, provider: Any, handle: Handle) -> bool:
        """Wait for the end of ``handle``'s machine (replacing what the job waited for);
        False when the provider cannot tell (then the job is polled)."""
        with self._lock:
            known = self._watched.get(job_id)
            if known is not None and known[0] == handle.get("id"):
                return True
        end_fd = getattr(provider, "end_fd", None)  # an optional capability of a provider
        fd = end_fd(handle) if end_fd is not None else None
        with self._lock:
            self._forget(job_id)
            if fd is None:
                return False
            self._jobs[fd] = job_id
            self._watched[job_id] = (str(handle.get("id")), fd)
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)
        return True

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._forget(job_id)

    def _forget(self, job_id: str) -> None:
        """(holding the lock)"""
        known = self._watched.pop(job_id, None)
        if known is not None:
            self._jobs.pop(known[1], None)
            self._epoll.unregister(known[1])
            os.close(known[1])

    def _loop(self) -> None:
        while True:
            for fd, _ in self._epoll.poll():
                if fd == self._stop_r:
                    return
                with self._lock:
                    job_id = self._jobs.get(fd)
                    if job_id is not None:
                        self._forget(job_id)
                if job_id is not None:
                    try:
                        self._on_end(job_id)
                    except Exception:  # (a wake never stops the watching of the others)
                        log.exception("cannot wake job %s", job_id)
