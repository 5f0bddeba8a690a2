"""Ids as typed: the whole id wins, a start of exactly one id names it, text is never a pattern.

The store's own resolution is covered in test_store.py; here the rule itself and the worker
groups of sweeps, which resolve their ids from the files they keep."""

from __future__ import annotations

import os

import pytest

from spotwise.control.ids import CANDIDATES_SHOWN, MAX_ID_CHARS, one_id
from spotwise.control.workers import Group, load_group
from spotwise.errors import JobNotFoundError


def test_the_whole_id_wins_over_a_longer_id_it_starts():
    assert one_id("run-a1", ["run-a1b2", "run-a1", "run-a1c3"]) == "run-a1"


def test_the_start_of_exactly_one_id_names_it_and_of_none_names_nothing():
    ids = ["train-abc123", "eval-abc124"]
    assert one_id("tr", ids) == "train-abc123"
    assert one_id("abc", ids) is None  # the start, not anywhere in it
    assert one_id("", ids) is None  # nothing typed names nothing, even with one id
    assert one_id("", ["only-one"]) is None


@pytest.mark.parametrize("typed", ["*", "t*", "?rain", "[t]rain", "%", "train.*", ".*"])
def test_wildcards_of_every_kind_match_only_themselves(typed: str):
    expected = "t*x" if "t*x".startswith(typed) else None  # only "t*" starts it, as text
    assert one_id(typed, ["train-abc123", "t*x"]) == expected
    assert one_id(typed, [f"{typed}-abc"]) == f"{typed}-abc"


def test_an_ambiguous_start_names_a_bounded_list_of_candidates_in_the_order_given():
    ids = [f"twin-{i:02d}" for i in range(CANDIDATES_SHOWN + 3)]
    with pytest.raises(JobNotFoundError, match="give more of the id") as err:
        one_id("twin", ids, "sweep")
    text = str(err.value)
    assert text.startswith("sweep id 'twin' is ambiguous: it starts twin-00, twin-01")
    assert "twin-09, ..." in text and "twin-10" not in text
    with pytest.raises(JobNotFoundError) as err:
        one_id("t" * 100, ["t" * 101, "t" * 102])
    head = str(err.value).split(" is ambiguous")[0]
    assert head == "job id '" + "t" * 40 + "...'"  # what was typed, shown bounded


def test_a_text_no_id_could_start_with_names_nothing():
    long = "t" * (MAX_ID_CHARS + 1)
    assert one_id("t" * MAX_ID_CHARS, ["t" * MAX_ID_CHARS]) == "t" * MAX_ID_CHARS
    assert one_id(long, [long, long + "x"]) is None  # longer than any id: not even compared
    assert one_id("tw\x00", ["tw\x00in"]) is None and one_id("", ["x"]) is None


def _group(group_id: str, mtime: float) -> Group:
    group = Group(group_id, "sweep", [f"{group_id}-job"], {}, None, mtime)
    group.save()
    os.utime(group.path, (mtime, mtime))
    return group


def test_a_sweep_is_found_by_its_whole_id_by_a_unique_start_or_as_the_newest():
    short = _group("sweep-ab", 100.0)
    longer = _group("sweep-abcd", 200.0)
    other = _group("sweep-ff01", 300.0)
    assert load_group("sweep-ab", "sweep").id == short.id  # whole id beats "starts sweep-abcd"
    assert load_group("sweep-abc", "sweep").id == longer.id
    assert load_group("sweep-f", "sweep").id == other.id
    assert load_group(None, "sweep").id == other.id  # the newest by time, not by name
    os.utime(short.path, (400.0, 400.0))
    assert load_group(None, "sweep").id == short.id


def test_a_sweep_id_that_names_none_or_several_says_so_and_how_to_go_on():
    with pytest.raises(JobNotFoundError, match="no sweep has been started here") as err:
        load_group(None, "sweep")
    assert "spotwise sweep FILE.yaml" in str(err.value)
    _group("sweep-ab12", 100.0)
    _group("sweep-ab34", 200.0)
    with pytest.raises(JobNotFoundError, match=r"ambiguous: it starts sweep-ab34, sweep-ab12"):
        load_group("sweep-ab", "sweep")
    for typed in ("sweep-*", "sweep-ab?2", "", "sweep-ab12.json", "../groups/sweep-ab12"):
        with pytest.raises(JobNotFoundError, match="no sweep") as err:
            load_group(typed, "sweep")
        assert "without an id, spotwise sweep status shows the newest" in str(err.value)
