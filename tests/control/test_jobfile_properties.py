"""Generated job files (hundreds per run): each is a JobSpec or one bounded ConfigError, quickly.

No traceback (any other exception fails the test), no hang (hypothesis' deadline per file), and
no error message that echoes a long value or a control character.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spotwise.control.spec import _ALIASES, JobSpec, load_spec
from spotwise.errors import ConfigError

FIELDS = sorted({*JobSpec.model_fields, *_ALIASES})
SETTINGS = settings(
    max_examples=200,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["python train.py", "2h", ".", "spot", "local", "sim", "uniform-progress", "1e400", "-1"]
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**30, max_value=10**80)
    | st.floats()  # nan and inf included
    | text
    | st.datetimes()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
documents = st.dictionaries(st.sampled_from(FIELDS) | text, values, max_size=8) | values


def _check(path: Path) -> None:
    try:
        load_spec(path)
    except ConfigError as err:
        message = str(err)
        assert len(message) < 4000, message[:4000]
        assert "\x00" not in message and "\x1b" not in message


@SETTINGS
@given(doc=documents, encoding=st.sampled_from(["utf-8", "utf-16", "utf-8-sig", "latin-1"]))
def test_generated_documents_load_or_fail_clearly(doc: Any, encoding: str):
    body = yaml.safe_dump(doc, allow_unicode=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_bytes(body.encode(encoding, errors="replace"))
        _check(path)


@SETTINGS
@given(data=st.binary(max_size=300), prefix=st.sampled_from([b"", b"command: x\n", b"env:\n  A: "]))
def test_arbitrary_bytes_fail_clearly(data: bytes, prefix: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_bytes(prefix + data)
        _check(path)


@settings(max_examples=50, deadline=timedelta(seconds=5))
@given(
    anchors=st.integers(min_value=1, max_value=12),
    width=st.integers(min_value=1, max_value=12),
    depth=st.integers(min_value=1, max_value=80),
)
def test_aliases_and_nesting_are_bounded(anchors: int, width: int, depth: int):
    """Alias chains of any width and flow nesting of any depth end within the deadline."""
    lines = ["a0: &a0 [x]"]
    for i in range(1, anchors):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    lines.append("command: " + "[" * depth + "x" + "]" * depth)
    lines.append(f"name: *a{anchors - 1}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text("\n".join(lines) + "\n")
        _check(path)
