"""The README's Python examples run as written (in a scratch directory)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_runs(index, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", BLOCKS[index]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    if "spotwise.Run" in BLOCKS[index]:
        assert "done at step 200" in result.stdout
        # Run again: the finished run directory resumes at the end and trains nothing.
        again = subprocess.run(
            [sys.executable, "-c", BLOCKS[index]], cwd=tmp_path, capture_output=True, text=True
        )
        assert again.returncode == 0, again.stderr
        assert "done at step 200" in again.stdout
