"""The training process stays lean: importing the runtime pulls in no cloud SDK."""

from __future__ import annotations

import subprocess
import sys

HEAVY = (
    "boto3",
    "botocore",
    "cryptography",
    "matplotlib",
    "pynvml",
    "sklearn",
    "moto",
    "kubernetes",
)


def test_runtime_imports_no_cloud_sdk() -> None:
    # torch itself imports pynvml (nvidia-ml-py, the spotwise[gpu] extra) when it is installed:
    # count only what spotwise adds on top of torch
    code = (
        "import sys, torch; before = set(sys.modules);"
        "import spotwise.runtime, spotwise.runtime.run;"
        f"print(sorted(m for m in {HEAVY!r} if m in set(sys.modules) - before))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
