"""Child process for the fault tests: train until a save fails, report what happened as JSON.

argv: RUN_DIR MODE(sync|async) FAULT(none|fsize|readonly) [MOUNTPOINT]
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys

import torch

from spotwise.errors import SaveError
from spotwise.runtime import CheckpointConfig, Run

run_dir, mode, fault = sys.argv[1:4]
model = torch.nn.Linear(256, 300)  # ~300 KiB per checkpoint
run = Run(
    run_dir,
    state={"model": model},
    steps=12,
    checkpoint=CheckpointConfig(every=2, async_save=mode == "async"),
    notices=None,
)
report: dict[str, object] = {"error": None, "failed_at": None}
try:
    for step in run:
        with torch.no_grad():
            model.weight.add_(1.0)
        if step == 4:
            run.save()  # waits for the background write of step 4 before the fault starts
        if step == 4 and fault == "fsize":  # after checkpoints 2 and 4: files may not grow
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        if step == 4 and fault == "readonly":
            subprocess.run(["mount", "-o", "remount,ro", sys.argv[4]], check=True)
except SaveError as exc:
    report = {"error": str(exc), "failed_at": run.step}
    run._wait_writer(quiet=True)
print(json.dumps(report))
sys.stdout.flush()
os._exit(0)
