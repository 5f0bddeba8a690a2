"""The watcher: every detector merged into one cheap ``current()`` for the training loop.

Signal-based detectors do no I/O, so they are read synchronously in ``current()``; every network
detector gets its own daemon thread, so a hanging metadata server can delay only itself and
never a training step. Platform auto-detection (short probes) also runs on a background thread,
so starting a run costs nothing even when the probes take their whole budget.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from spotwise.errors import ConfigError
from spotwise.notices.base import Detector, LogOnce, Notice, NoticeSource, most_urgent

log = logging.getLogger("spotwise.notices")


class Watcher:
    """Implements :class:`~spotwise.notices.base.NoticeSource`.

    ``local`` detectors are polled inline (no I/O). ``remote`` detectors are polled on their own
    daemon threads every ``poll_interval_s``. ``discover`` (optional) runs once on a background
    thread and returns more remote detectors: that is where auto-detection probes live.

    A terminate notice, once seen, stays (an endpoint that later answers 404 does not cancel a
    termination). An advisory notice stays until the detector clears it or it is acknowledged,
    so the runtime can acknowledge it after the early save to avoid saving again and again.
    """

    def __init__(
        self,
        local: Iterable[Detector] = (),
        remote: Iterable[Detector] = (),
        *,
        discover: Callable[[], list[Detector]] | None = None,
    ) -> None:
        self._local = list(local)
        self._remote: list[Detector] = []
        self._latest: dict[int, Notice] = {}
        self._acked: set[Notice] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._log = LogOnce(log)
        self.discovered = threading.Event()  # set once discovery is done (tests, benchmarks)
        for detector in remote:
            self._add_remote(detector)
        if discover is None:
            self.discovered.set()
        else:
            self._spawn(lambda: self._discover(discover), "spotwise-notices-discover")

    # --- NoticeSource ------------------------------------------------------------------------
    def current(self) -> Notice | None:
        """The most urgent pending notice; a cached value, never waits on the network."""
        notices: list[Notice | None] = [self._poll_local(d) for d in self._local]
        with self._lock:
            notices.extend(self._latest.values())
            acked = set(self._acked)
        return most_urgent(n for n in notices if n is not None and n not in acked)

    def acknowledge(self, notice: Notice) -> None:
        """Pass the acknowledgement to the detector that raised it (Azure starts the event)."""
        if not notice.is_terminate:
            with self._lock:
                self._acked.add(notice)
        for detector in [*self._local, *self._remote]:
            if detector.name == notice.source:
                try:
                    detector.acknowledge(notice)
                except Exception:  # a detector bug must not break the exit path
                    log.exception("spotwise: %s detector failed to acknowledge", detector.name)

    def close(self) -> None:
        self._stop.set()
        for detector in [*self._local, *self._remote]:
            try:
                detector.close()
            except Exception as exc:  # closing the others matters more than this one
                log.exception("spotwise: closing the %s detector failed: %r", detector.name, exc)
        for thread in self._threads:
            thread.join(timeout=0.2)  # long-polls are daemon threads; do not wait for them

    # --- introspection -----------------------------------------------------------------------
    @property
    def detectors(self) -> list[str]:
        return [d.name for d in [*self._local, *self._remote]]

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ---------------------------------------------------------------------------
    def _poll_local(self, detector: Detector) -> Notice | None:
        try:
            return detector.poll()
        except Exception as exc:  # a detector bug must never stop training: say what broke
            self._log(
                f"bug-{detector.name}", "spotwise: %s detector failed: %r", detector.name, exc
            )
            return None

    def _discover(self, discover: Callable[[], list[Detector]]) -> None:
        try:
            found = discover()
        except Exception as exc:  # detection must not stop training: fall back to signals
            log.exception("spotwise: platform detection failed (%r); only signals are watched", exc)
            found = []
        for detector in found:
            if self._stop.is_set():
                detector.close()
                continue
            self._add_remote(detector)
        self.discovered.set()

    def _add_remote(self, detector: Detector) -> None:
        with self._lock:
            self._remote.append(detector)
        self._spawn(lambda: self._run(detector), f"spotwise-notices-{detector.name}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self, detector: Detector) -> None:
        key = id(detector)
        while not self._stop.is_set():
            try:
                notice = detector.poll()
            except Exception as exc:  # a detector bug must never stop training: say what broke
                self._log(
                    f"bug-{detector.name}", "spotwise: %s detector failed: %r", detector.name, exc
                )
                notice = None
            self._store(key, notice)
            self._stop.wait(detector.poll_interval_s)

    def _store(self, key: int, notice: Notice | None) -> None:
        with self._lock:
            previous = self._latest.get(key)
            latched = previous is not None and previous.is_terminate
            if latched and (notice is None or not notice.is_terminate):
                return
            if notice is None:
                self._latest.pop(key, None)
            else:
                self._latest[key] = notice


def watch_from_environment(env: Mapping[str, str] | None = None) -> NoticeSource:
    """The notice source ``spotwise.Run(notices="auto")`` uses.

    Signals are always watched (SIGTERM, SIGINT; more with ``SPOTWISE_SIGNALS``). Cloud
    detectors follow ``SPOTWISE_PLATFORM`` (aws|gcp|azure|slurm|kubernetes|none), the endpoint
    overrides, or auto-detection; see :mod:`spotwise.notices.platform`.
    """
    from spotwise.notices.platform import plan_from_environment

    plan = plan_from_environment(env)
    return Watcher(local=[plan.signals], remote=plan.remote, discover=plan.discover)


def open_notices(spec: NoticeSource | str | None) -> NoticeSource | None:
    """The notice source a ``notices=`` argument names (``"auto"``, ``None`` or a source), so
    ``spotwise.Run`` and the batch runner accept the same spellings."""
    if spec is None:
        return None
    if spec == "auto":
        return watch_from_environment()
    if isinstance(spec, NoticeSource):
        return spec
    raise ConfigError(
        f"notices={spec!r} is not a notice source",
        hint="use 'auto', None, or an object with current()/acknowledge()/close()",
    )
