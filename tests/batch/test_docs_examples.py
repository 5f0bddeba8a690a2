"""The Python examples in docs/batch.md and docs/hpo.md run as written (the batch example runs
itself twice and checks that the second pass computes nothing)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page", ["batch.md", "hpo.md"])
def test_doc_example_runs(page, tmp_path):
    [code] = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "sha256:" in done.stdout.strip().splitlines()[-1]
