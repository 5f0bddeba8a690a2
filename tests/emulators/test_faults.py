"""The emulators' one fault model: counting, matching and the rate limit on an injected clock."""

from spotwise.emulators._faults import Fault, RateLimit, take


def test_a_fault_answers_its_count_of_matching_requests_in_order():
    faults = [Fault("503", 2, {"path": "/latest/meta-data"}), Fault("hang", None)]
    paths = ("/latest/meta-data/x", "/other", "/latest/meta-data/y", "/latest/meta-data/z")
    picked = [take(faults, {"path": p}) for p in paths]
    assert [f.what if f else None for f in picked] == ["503", "hang", "503", "hang"]
    assert [f.hits for f in faults] == [2, 2]


def test_a_missing_field_only_matches_an_empty_pattern():
    faults = [Fault("QUOTA_EXCEEDED", 1, {"operation": "insert", "zone": ""})]
    assert take(faults, {"zone": "us-central1-a"}) is None  # no operation named
    assert take(faults, {"operation": "insert"}) is faults[0]
    assert take(faults, {"operation": "insert"}) is None  # used up
    assert take([Fault("x", 0)], {}) is None  # zero times: never


def test_the_rate_limit_admits_per_window_on_the_callers_clock():
    limit = RateLimit(2)
    assert [limit.admit(t) for t in (0.0, 0.1, 0.2, 0.9)] == [True, True, False, False]
    assert limit.admit(1.05) is True  # the request at 0.0 left the window
    assert limit.admit(1.06) is False
    assert all(RateLimit(0).admit(0.0) for _ in range(100))
