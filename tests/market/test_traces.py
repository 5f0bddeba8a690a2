"""Trace loading: the published JSON format, the step-function CSV, errors, shipped data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from spotwise.errors import ConfigError, TraceError
from spotwise.market.traces import (
    Trace,
    load_shipped_trace,
    load_trace,
    shipped_trace_path,
    shipped_traces,
)

SHARED_TRACES = Path(__file__).resolve().parents[2] / "data/public/traces"


def test_json_trace_reads_gap_counts_zone(tmp_path: Path) -> None:
    p = tmp_path / "us-east-1a_v100_1.json"
    p.write_text(json.dumps({"metadata": {"gap_seconds": 195}, "data": [1, 0, 2, 1]}))
    t = load_trace(p)
    assert t.gap_s == 195.0
    assert t.counts.tolist() == [1, 0, 2, 1]
    assert t.zone == "us-east-1a" and t.name == "us-east-1a_v100_1"
    assert t.available(1).tolist() == [True, False, True, True]
    assert t.available(2).tolist() == [False, False, True, False]
    assert t.duration_h == pytest.approx(4 * 195 / 3600)


def test_trace_is_immutable() -> None:
    t = Trace(gap_s=60, counts=np.array([1, 0]))
    with pytest.raises(ValueError):
        t.counts[0] = 5
    with pytest.raises(AttributeError):
        t.gap_s = 1  # type: ignore[misc]


def test_csv_step_function_is_sampled_per_tick(tmp_path: Path) -> None:
    # bamboo style: repeated times mark a step; the last value at a time wins
    p = tmp_path / "zone-x.csv"
    p.write_text("seconds,count\n0,0\n20,0\n20,4\n40,4\n40,1\n60,1\n")
    t = load_trace(p)
    assert t.gap_s == 20
    assert t.counts.tolist() == [0, 4, 1, 1]


def test_csv_in_hours_with_given_gap(tmp_path: Path) -> None:
    p = tmp_path / "z.csv"
    p.write_text("hours,count\n0,1\n0.5,0\n1.0,1\n")
    t = load_trace(p, gap_s=900)
    assert t.counts.tolist() == [1, 1, 0, 0, 1]


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("a.json", "{not json", "not valid JSON"),
        ("b.json", json.dumps({"data": [1, 0]}), "gap_seconds"),
        ("c.json", json.dumps({"metadata": {"gap_seconds": 60}, "data": []}), "no ticks"),
        ("d.json", json.dumps({"metadata": {"gap_seconds": 0}, "data": [1]}), "must be > 0"),
        ("e.json", json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, -1]}), "negative"),
        ("f.json", json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, "x"]}), "numeric"),
        ("g.csv", "0,1\n10,x\n", "not numeric"),
        ("h.csv", "10,1\n0,1\n", "backwards"),
        ("i.yaml", "x", "neither .json nor .csv"),
    ],
)
def test_bad_files_raise_clear_errors(tmp_path: Path, name: str, text: str, needle: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TraceError, match=needle) as info:
        load_trace(p)
    assert isinstance(info.value, ConfigError)
    assert info.value.hint


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.json")


def test_shipped_traces_match_shared_originals() -> None:
    names = shipped_traces()
    assert "aws-10-26-2022/us-west-2a_v100_1.json" in names
    assert len(names) >= 5
    for name in names:
        shipped = load_trace(shipped_trace_path(name))
        original = SHARED_TRACES / "availability/1-node" / name
        if original.exists():
            ref = load_trace(original)
            assert shipped.gap_s == ref.gap_s
            assert np.array_equal(shipped.counts, ref.counts)
    assert (shipped_trace_path(names[0]).parent.parent / "README.md").read_text().count("221da1ab")


def test_shipped_lookup_by_stem_and_ambiguity() -> None:
    t = load_shipped_trace("us-east-1a_v100_1")
    assert t.zone == "us-east-1a" and t.gap_s == 195
    with pytest.raises(TraceError, match="no unique"):
        load_shipped_trace("us-west-2a_v100_1")  # in two groups
