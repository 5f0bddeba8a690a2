"""Telemetry inside the training process: a ``/metrics`` endpoint, GPU samples and the user's
``run.log(...)`` values, recorded for the dashboard and the report, and (when configured) every
event shipped to CloudWatch Logs.

Off, it costs the loop nothing: no thread, no server; ``run.log`` then only appends an event at
most once a second. Under ``torch.distributed`` one process per machine serves ``/metrics``: the
one of node-local rank 0 (``LOCAL_RANK``, as torchrun sets it), so the same port works on every
machine of the job and one scrape target per machine sees its GPUs once. The ranks run in
lockstep, so its step and save figures are the job's. The Prometheus figures are read from the
``Run`` when scraped (a custom collector), so the training loop never updates a metric object
per step. GPU samples arrive from :mod:`spotwise.telemetry.gpu`'s thread and are also written
as ``gpu`` events.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from spotwise import settings
from spotwise.errors import ConfigError
from spotwise.registry import require
from spotwise.telemetry import gpu
from spotwise.telemetry.cloudwatch import CloudWatchSink
from spotwise.telemetry.events import EventLog

log = logging.getLogger(__name__)

LOG_EVERY_S = 1.0  # at most one ``metrics`` event a second from run.log(...)


class RunLike(Protocol):
    step: int
    step_s: float | None
    events: EventLog

    @property
    def save_cost_s(self) -> float | None: ...

    @property
    def write_s(self) -> float | None: ...


def _number_from_env(name: str, value: Any, *, integer: bool) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or (integer and number > 65535):
        want = "a TCP port (0-65535; 0 picks a free one)" if integer else "seconds (0 turns it off)"
        raise ConfigError(f"{name}={value!r} is not {want}", hint=f"set {name} to {want}")
    return number


class RunTelemetry:
    """Created by ``Run``; ``logged`` is its per-``run.log`` hook, ``close`` stops it."""

    def __init__(
        self, run: RunLike, *, metrics_port: int | None, gpu_sample_s: float | None
    ) -> None:
        self.run = run
        self.user_metrics: dict[str, float] = {}
        self.checkpoints = 0
        self.notices = 0
        self.last_checkpoint_time: float | None = None
        self._last_logged = -LOG_EVERY_S
        port = _number_from_env(
            "metrics_port" if metrics_port is not None else settings.METRICS_PORT.name,
            metrics_port if metrics_port is not None else settings.METRICS_PORT.text(),
            integer=True,
        )
        interval = _number_from_env(
            "gpu_sample_s" if gpu_sample_s is not None else settings.GPU_SAMPLE_S.name,
            gpu_sample_s if gpu_sample_s is not None else settings.GPU_SAMPLE_S.text(),
            integer=False,
        )
        self.port: int | None = None
        self._server: Any = None
        self.sampler: gpu.GpuSampler | None = None
        self.sink: CloudWatchSink | None = None
        try:  # what started is stopped again if a later part cannot start
            if port is not None and _node_local_rank() == 0:
                self._serve(int(port))
            self.sampler = gpu.start_sampler(
                gpu.DEFAULT_INTERVAL_S if interval is None else interval, self._gpu_sample
            )
            self.sink = CloudWatchSink.from_environment(default_stream=_stream_name(run))
        except BaseException:
            self.close()
            raise
        if self.sink is not None:
            run.events.subscribe(self.sink)

    def _serve(self, port: int) -> None:
        prometheus = require("prometheus_client", "metrics", "the training metrics endpoint")
        registry = prometheus.CollectorRegistry(auto_describe=False)
        registry.register(_RunCollector(self))
        try:
            self._server, _ = prometheus.start_http_server(
                port, addr="127.0.0.1", registry=registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve training metrics on 127.0.0.1:{port}: {exc.strerror}",
                hint=f"choose another {settings.METRICS_PORT.name}",
            ) from exc
        self.port = int(self._server.server_port)
        self.run.events.subscribe(self._observe)
        self.run.events.emit("metrics-endpoint", port=self.port)
        log.info("training metrics on http://127.0.0.1:%d/metrics", self.port)

    def _observe(self, event: dict[str, Any]) -> None:
        if event["kind"] == "checkpoint":
            self.checkpoints += 1
            self.last_checkpoint_time = float(event["time"])
        elif event["kind"] == "notice":
            self.notices += 1

    def _gpu_sample(self, devices: list[dict[str, Any]]) -> None:
        self.run.events.emit("gpu", devices=devices)

    def logged(self, step: int, metrics: Mapping[str, float]) -> None:
        """``run.log`` was called: keep the values, and record them once a second."""
        self.user_metrics = dict(metrics)
        now = time.monotonic()
        if now - self._last_logged >= LOG_EVERY_S:
            self._last_logged = now
            self.run.events.emit("metrics", step=step, values=self.user_metrics)

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
            self.sink = None
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _node_local_rank() -> int:
    """This process's rank on its machine: 0 outside ``torch.distributed``; under it torch's
    own reading of ``LOCAL_RANK``, or the global rank when the launcher set none (then only
    rank 0 serves, which cannot collide on any machine)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return int(dist.get_node_local_rank(fallback_rank=dist.get_rank()))


def _stream_name(run: RunLike) -> str:
    """``<job or run dir>/attempt-<n>/<pid>``: one stream per process, as the service wants."""
    job = settings.JOB_ID.text() or run.events.path.parent.name
    return f"{job}/attempt-{settings.ATTEMPT.text() or '0'}/{os.getpid()}"


class _RunCollector:
    """Reads the Run at scrape time (Prometheus naming: base units, ``_total`` counters)."""

    def __init__(self, telemetry: RunTelemetry) -> None:
        self.t = telemetry

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        run, t = self.t.run, self.t
        yield CounterMetricFamily("spotwise_run_steps", "Optimizer steps completed", value=run.step)
        for name, value, doc in (
            ("spotwise_run_step_seconds", run.step_s, "Smoothed time per step"),
            (
                "spotwise_run_save_stall_seconds",
                run.save_cost_s,
                "Smoothed time the loop is blocked by a save",
            ),
            (
                "spotwise_run_save_write_seconds",
                run.write_s,
                "Smoothed time to write and commit a checkpoint",
            ),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily(
            "spotwise_run_checkpoints", "Checkpoints committed", value=t.checkpoints
        )
        if t.last_checkpoint_time is not None:
            yield GaugeMetricFamily(
                "spotwise_run_checkpoint_age_seconds",
                "Seconds since the newest checkpoint was committed",
                value=time.time() - t.last_checkpoint_time,
            )
        yield CounterMetricFamily(
            "spotwise_run_notices", "Interruption notices received", value=t.notices
        )
        user = GaugeMetricFamily(
            "spotwise_run_metric", "Values passed to run.log()", labels=["name"]
        )
        for key, value in t.user_metrics.items():
            user.add_metric([key], value)
        yield user
        yield from _gpu_families(t.sampler.latest if t.sampler is not None else [])


def _gpu_families(devices: list[dict[str, Any]]) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    fields = (
        ("spotwise_gpu_utilization_ratio", "util_pct", 0.01, "GPU busy share (0-1)"),
        ("spotwise_gpu_memory_used_bytes", "mem_used_bytes", 1, "GPU memory in use"),
        ("spotwise_gpu_memory_total_bytes", "mem_total_bytes", 1, "GPU memory size"),
        ("spotwise_gpu_temperature_celsius", "temp_c", 1, "GPU temperature"),
        ("spotwise_gpu_power_watts", "power_w", 1, "GPU power draw"),
    )
    for name, key, scale, doc in fields:
        family = GaugeMetricFamily(name, doc, labels=["gpu", "model"])
        for d in devices:
            if d.get(key) is not None:
                family.add_metric([str(d["index"]), str(d.get("name") or "")], d[key] * scale)
        yield family
