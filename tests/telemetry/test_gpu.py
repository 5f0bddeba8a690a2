"""The NVML sampler through the real nvidia-ml-py bindings, against a gcc-built fake driver
library (two devices, chosen readings, one unsupported reading), and with nothing to sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SAMPLE = """
import json, logging, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
from spotwise.telemetry.gpu import start_sampler
got = []
done = threading.Event()
def on_sample(devices):
    got.append(devices)
    if len(got) == 3:
        done.set()
sampler = start_sampler(0.02, on_sample)
if sampler is not None:
    assert done.wait(10), "the sampler did not sample three times"
    sampler.close()
print(json.dumps({"on": sampler is not None, "samples": got}))
"""


def _sample(env_extra: dict[str, str], prelude: str = "") -> tuple[dict, str]:
    env = {**os.environ, **env_extra}
    proc = subprocess.run(
        [sys.executable, "-c", prelude + SAMPLE],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_samples_every_device_through_the_real_bindings(fake_nvml_dir: Path) -> None:
    out, _ = _sample({"LD_LIBRARY_PATH": str(fake_nvml_dir)})
    assert out["on"] and len(out["samples"]) == 3
    first, second = out["samples"][0]
    assert first == {
        "index": 0,
        "name": "Fake H100 80GB",
        "util_pct": 87.0,
        "mem_used_bytes": 42949672960,
        "mem_total_bytes": 85899345920,
        "temp_c": 71.0,
        "power_w": 312.5,
    }
    # power unsupported (NVML_ERROR_NOT_SUPPORTED): None, the other readings still there
    assert second["name"] == "Fake T4" and second["power_w"] is None
    assert second["util_pct"] == 12.0 and second["temp_c"] == 44.0
    assert second["mem_used_bytes"] == 1073741824


def test_no_driver_library_turns_sampling_off_with_one_info_line(tmp_path: Path) -> None:
    out, err = _sample({"LD_LIBRARY_PATH": str(tmp_path)})
    assert out == {"on": False, "samples": []}
    lines = [line for line in err.splitlines() if "GPU sampling off" in line]
    assert len(lines) == 1 and lines[0].startswith("INFO ") and "NVML" in lines[0]


def test_no_bindings_turns_sampling_off_with_the_install_hint(fake_nvml_dir: Path) -> None:
    hide = "import sys; sys.modules['pynvml'] = None\n"  # as if nvidia-ml-py were not installed
    out, err = _sample({"LD_LIBRARY_PATH": str(fake_nvml_dir)}, prelude=hide)
    assert out["on"] is False
    assert "pip install 'spotwise[gpu]'" in err and "Traceback" not in err
