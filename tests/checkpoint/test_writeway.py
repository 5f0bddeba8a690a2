"""The choice between writing a save's large files directly and through the page cache: the
rule alone, figures passed in as a saver passes its measurements."""

from __future__ import annotations

from spotwise.checkpoint.writeway import WriteWay

GiB = 1 << 30


def save(way: WriteWay, *, direct_s: float, cached_s: float, may_try: bool = True) -> bool:
    """One save of 1 GiB taking ``direct_s`` or ``cached_s`` the way chosen; returns the way."""
    direct = way.direct(may_try=may_try)
    way.record(direct, GiB, direct_s if direct else cached_s)
    return direct


def test_direct_until_a_save_may_try_the_page_cache() -> None:
    way = WriteWay()
    assert way.direct(may_try=True)  # nothing measured yet: the way that is never far off
    way.record(True, GiB, 2.0)
    assert way.direct(may_try=False)  # an emergency save is never the one to try
    assert not way.direct(may_try=True)  # the next one that may goes through the page cache


def test_the_faster_way_is_kept_and_the_other_tried_again_after_eight_saves() -> None:
    way = WriteWay()
    ways = [save(way, direct_s=3.0, cached_s=2.0) for _ in range(12)]
    # direct measured, the page cache tried and faster: kept; direct tried after 8 saves
    assert ways == [True, False] + [False] * 8 + [True] + [False]


def test_a_way_that_keeps_losing_is_tried_ever_more_rarely() -> None:
    way = WriteWay()
    ways = [save(way, direct_s=1.0, cached_s=5.0) for _ in range(2 + 8 + 1 + 16 + 1 + 32 + 1)]
    tried = [i for i, direct in enumerate(ways) if not direct]
    assert tried == [1, 10, 27, 60]  # after 8, 16, then 32 saves the usual way
    assert way.direct(may_try=False)


def test_a_change_of_the_machine_is_followed_at_the_next_try() -> None:
    """Direct was faster, then the page cache became so: the try after 8 saves finds it, judged
    by its own figure rather than by the page cache's old ones."""
    way = WriteWay()
    before = [save(way, direct_s=1.0, cached_s=5.0) for _ in range(4)]
    after = [save(way, direct_s=1.0, cached_s=0.5) for _ in range(12)]
    assert before == [True, False, True, True]
    assert after == [True] * 6 + [False] * 6  # 8 saves direct since the first try, then kept


def test_a_lucky_try_does_not_hold_against_what_follows() -> None:
    """One fast try through the page cache wins; the page cache's next saves are slow again,
    and its median of them hands the choice back to direct without waiting for a try."""
    way = WriteWay()
    for _ in range(10):  # direct, the first try, 8 direct
        save(way, direct_s=1.0, cached_s=5.0)
    assert not way.direct(may_try=True)  # the try after 8...
    way.record(False, GiB, 0.5)  # ... was lucky: kept
    assert not way.direct(may_try=False)
    way.record(False, GiB, 5.0)  # median of 0.5 and 5.0: slower than direct's 1.0
    assert way.direct(may_try=False)


def test_saves_too_small_to_tell_change_nothing() -> None:
    way = WriteWay()
    way.record(True, 1 << 20, 9.0)
    assert way.direct(may_try=True)  # still nothing measured: no trying yet
    way.record(True, GiB, 1.0)
    way.record(False, 1 << 20, 0.001)  # a small save through the page cache: ignored
    assert not way.direct(may_try=True)
