from __future__ import annotations

from pathlib import Path

import pytest

from spotwise.control.spec import load_spec, parse_duration_s, parse_spec
from spotwise.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_example_job_file_is_valid():
    spec = load_spec(ROOT / "examples/digits/job.yaml")
    assert spec.provider.name == "sim"
    assert spec.market == "auto"
    assert spec.deadline_s == 600 and spec.expected_runtime_s == 50
    assert Path(spec.workdir) == ROOT / "examples/digits"
    assert spec.command[0] == "python"


@pytest.mark.parametrize(
    ("doc", "needles"),
    [
        ({"command": "x", "market": "cheap"}, ["market", "spot, on-demand, auto", "'cheap'"]),
        ({"command": "x", "provider": "gce"}, ["provider.name", "local, sim, slurm", "'gce'"]),
        ({"command": "x", "deadline": "soon"}, ["deadline_s", "duration", "'soon'"]),
        ({"command": "x", "budget_usd": -1}, ["budget_usd", "greater than 0"]),
        ({"command": "x", "max_restart": 3}, ["max_restart", "unknown field"]),
        ({"market": "spot"}, ["command", "required field is missing"]),
        ({"command": ""}, ["command", "empty"]),
        ({"command": "x", "env": {"1BAD": "v"}}, ["env", "1BAD"]),
    ],
)
def test_bad_fields_are_named_with_allowed_values(doc, needles):
    with pytest.raises(ConfigError) as err:
        parse_spec(doc)
    for needle in needles:
        assert needle in str(err.value)


def test_several_errors_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        parse_spec({"command": "x", "market": "nope", "max_restarts": -2})
    assert "market" in str(err.value) and "max_restarts" in str(err.value)


def test_invalid_yaml_and_missing_file(tmp_path: Path):
    bad = tmp_path / "job.yaml"
    bad.write_text("command: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_spec(bad)


def test_durations_and_paths(tmp_path: Path):
    assert parse_duration_s("90s") == 90 and parse_duration_s("2h") == 7200
    assert parse_duration_s(15) == 15 and parse_duration_s("1.5m") == 90
    spec = parse_spec({"command": ["python", "t.py", 3], "workdir": "sub", "checkpoint": "ck",
                       "provider": {"name": "sim", "time_compression": 10}}, base_dir=tmp_path)
    assert spec.command == ["python", "t.py", "3"]
    assert spec.workdir == str(tmp_path / "sub")
    assert spec.checkpoint_dir == str(tmp_path / "sub" / "ck")
    assert spec.provider.options == {"time_compression": 10}
