"""The cluster behind the loopback API server: one loop that runs, in each pass, Kueue's
admission (when installed), the Job controller (``jobs.py``), and for every pod the kubelet
(``kubelet.py``) or, while the pod has no node, the scheduler (``scheduler.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from spotwise.emulators import machine_root
from spotwise.emulators.kubernetes.api import Obj, ObjectStore
from spotwise.emulators.kubernetes.jobs import JobController
from spotwise.emulators.kubernetes.kubelet import Kubelet
from spotwise.emulators.kubernetes.scheduler import Scheduler


class Cluster:
    """Drives the objects in ``store`` the way the control plane and kubelets would."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        state_dir: Path,
        evict_after_s: list[float],
        evict_mode: str = "shutdown",
        shutdown_grace_s: float | None = None,
        tick_s: float = 0.05,
        image: list[Path] | None = None,
        admission: Callable[[], None] | None = None,
    ) -> None:
        if evict_mode not in ("shutdown", "delete"):
            raise ValueError(f"evict_mode must be 'shutdown' or 'delete', not {evict_mode!r}")
        self.store = store
        self.tick_s = tick_s
        self.admission = admission  # a queue's admission pass (Kueue), before the Job controller
        self.kubelet = Kubelet(
            store,
            state_dir=state_dir,
            evict_after_s=list(evict_after_s),
            evict_mode=evict_mode,
            shutdown_grace_s=shutdown_grace_s,
            # what every container has besides the system: this Python, spotwise, the job's code
            image=machine_root.machine_image(image),
        )
        self.scheduler = Scheduler(store)
        self.jobs = JobController(store, self.kubelet.delete_pod)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the kubelet counts, read (and the eviction schedule set) by tests and the CLI ---
    @property
    def evict_after_s(self) -> list[float]:
        return self.kubelet.evict_after_s

    @evict_after_s.setter
    def evict_after_s(self, value: list[float]) -> None:
        self.kubelet.evict_after_s = list(value)

    @property
    def evictions(self) -> list[str]:
        return self.kubelet.evictions

    @property
    def exits(self) -> dict[str, int]:
        return self.kubelet.exits

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="spotwise-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and every container (SIGKILL): nothing outlives the emulator."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self.kubelet.kill_all()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self.tick()

    def tick(self) -> None:
        """One pass of the admission controller, the Job controller, the scheduler and the
        kubelet."""
        if self.admission is not None:
            self.admission()
        self.jobs.sync()
        pods, _ = self.store.select("pods")
        for pod in pods:
            self.jobs.saw(pod)
            if not self.kubelet.sync(pod):
                self.scheduler.schedule(pod)

    # --- API-side hooks -----------------------------------------------------------------------
    def delete(self, resource: str, ns: str, name: str, options: Obj) -> None:
        """A DELETE from the API: graceful for pods, propagated for jobs."""
        with self._lock:
            if resource == "pods":
                self.kubelet.delete_pod(ns, name, options.get("gracePeriodSeconds"))
            elif resource == "jobs":
                self.jobs.delete_job(
                    ns,
                    name,
                    options.get("propagationPolicy") or "Orphan",
                    options.get("gracePeriodSeconds"),
                )
            else:
                self.store.remove(resource, ns, name)

    def read_log(self, pod: Obj) -> bytes:
        return self.kubelet.read_log(pod)

    def running(self) -> list[int]:
        """Pids of the containers still running."""
        with self._lock:
            return self.kubelet.running()

    def evict(self, ns: str, name: str) -> None:
        """Take the pod's node away now (see ``kubelet.py``)."""
        with self._lock:
            pod = self.store.get("pods", ns, name)
            if pod is not None:
                self.kubelet.evict(pod)
