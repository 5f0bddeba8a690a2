"""GPU samples through NVML (``nvidia-ml-py``, the ``spotwise[gpu]`` extra), every few seconds.

Utilisation, memory used/total, temperature and power per device, the figures ``nvidia-smi``
shows, read through the same library it uses. Without the package, without the driver's
``libnvidia-ml.so.1`` or without a GPU the sampler is off, said in one info line and never an
error: a training job must not fail because monitoring cannot start. A reading that one device
does not support (power on some boards) is ``None``; a device that stops answering is reported
with its NVML error instead of its figures, and the other devices keep being sampled.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0


class Nvml:
    """An initialised NVML session; ``open()`` returns None where there is nothing to sample."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self.count = count

    @classmethod
    def open(cls) -> Nvml | None:
        try:
            import pynvml
        except ImportError:
            log.info(
                "GPU sampling off: nvidia-ml-py is not installed (pip install 'spotwise[gpu]')"
            )
            return None
        try:
            pynvml.nvmlInit()
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            log.info("GPU sampling off: NVML is unavailable (%s)", exc)
            return None
        if count == 0:
            log.info("GPU sampling off: NVML sees no GPU")
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, count)

    def sample(self) -> list[dict[str, Any]]:
        """One reading of every device."""
        return [self._device(i) for i in range(self.count)]

    def _device(self, index: int) -> dict[str, Any]:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            return {"index": index, "error": str(exc)}

        def read(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except nvml.NVMLError:
                return None

        name = read(lambda: nvml.nvmlDeviceGetName(handle))
        util = read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = read(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = read(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return {
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else name,
            "util_pct": None if util is None else float(util.gpu),
            "mem_used_bytes": None if memory is None else int(memory.used),
            "mem_total_bytes": None if memory is None else int(memory.total),
            "temp_c": read(
                lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            ),
            "power_w": None if power_mw is None else power_mw / 1000.0,
        }

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)


class GpuSampler:
    """A daemon thread that hands one sample of every device to ``on_sample`` per interval."""

    def __init__(
        self, nvml: Nvml, interval_s: float, on_sample: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        self.nvml = nvml
        self.interval_s = interval_s
        self.on_sample = on_sample
        self.latest: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spotwise-gpu", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self.latest = self.nvml.sample()
            self.on_sample(self.latest)
            if self._stop.wait(self.interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.nvml.close()


def start_sampler(
    interval_s: float, on_sample: Callable[[list[dict[str, Any]]], None]
) -> GpuSampler | None:
    """A running sampler, or None (sampling off: interval 0, or nothing to sample)."""
    if interval_s <= 0:
        return None
    nvml = Nvml.open()
    return None if nvml is None else GpuSampler(nvml, interval_s, on_sample)
