"""The listing of a real server process, a page at a time, on SQLite and PostgreSQL: the owner
and state filters are the query's own (a user's page never holds another's job, however the
pages fall), the cursor keeps its place while jobs are added, and bad paging input is refused
by name."""

from __future__ import annotations

import re
import urllib.parse

import pytest

from spotwise.client import next_cursor
from spotwise.control.store import JobState, Store

from .conftest import Server

pytestmark = pytest.mark.usefixtures("store_db")


def _walk(s: Server, token: str, query: str, between=None) -> list[str]:
    """Every page's ids in order, following the ``Link: rel="next"`` headers."""
    return [i for page in _pages(s, token, query, between) for i in page]


def _pages(s: Server, token: str, query: str, between=None) -> list[list[str]]:
    """Each page's ids, following the ``Link: rel="next"`` header from the first page."""
    pages: list[list[str]] = []
    path = f"/api/v1/jobs?{query}"
    while True:
        answer = s.call("GET", path, token)
        assert answer.status == 200
        pages.append([j["id"] for j in answer.json()])
        link = answer.headers.get("link")
        if link is None:
            return pages
        assert next_cursor(link) is not None
        path = re.fullmatch(r'<([^>]*)>; rel="next"', link).group(1)  # type: ignore[union-attr]
        if between is not None:
            between()


def test_a_users_pages_hold_only_their_jobs_and_keep_their_place(server):
    store = Store()
    mine, theirs = [], []
    for n in range(9):  # finished jobs: nothing for the server to drive
        job = store.create_job(f"j{n}", {}, None, now=1000.0 + n, owner="uma" if n % 3 else "bob")
        store.update_job(job.id, state=JobState.FAILED if n % 2 else JobState.SUCCEEDED)
        (mine if n % 3 else theirs).append(job.id)
    s: Server = server()

    pages = _pages(s, "user-token", "limit=2")
    assert [len(p) for p in pages] == [2, 2, 2]
    # newest first, every one of uma's once, none of bob's
    assert [i for p in pages for i in p] == mine[::-1]
    assert _walk(s, "other-user-token", "limit=2") == theirs[::-1]
    failed = [i for i in mine if store.job(i).state is JobState.FAILED]
    assert _walk(s, "user-token", "limit=1&state=failed") == failed[::-1]
    everyone = _walk(s, "viewer-token", "limit=4")
    assert sorted(everyone) == sorted(mine + theirs)

    # new jobs come before the cursor: a listing under way neither repeats nor skips
    added = iter(range(100))
    walked = _walk(
        s,
        "user-token",
        "limit=2",
        between=lambda: store.create_job(f"new{next(added)}", {}, None, owner="uma"),
    )
    assert walked == mine[::-1]

    for query, named in (
        ("limit=0", "limit '0'"),
        ("limit=5000", "limit '5000'"),
        ("state=DONE", "state 'DONE'"),
        ("cursor=" + urllib.parse.quote("x" * 20), "cursor 'xxxx"),
    ):
        refused = s.call("GET", f"/api/v1/jobs?{query}", "user-token")
        assert refused.status == 400 and named in refused.json()["error"], query


def test_ids_that_start_with_a_text_are_listed_as_text_and_only_the_callers(server):
    store = Store()
    made = {
        (name, owner): store.create_job(name, {}, None, now=2000.0 + n, owner=owner).id
        for n, (name, owner) in enumerate(
            [("a_b", "uma"), ("axb", "uma"), ("abc", "uma"), ("abc", "bob"), ("zz", "uma")]
        )
    }
    for job_id in made.values():
        store.update_job(job_id, state=JobState.SUCCEEDED)
    s: Server = server()

    def listed(token: str, prefix: str) -> list[str]:
        return _walk(s, token, urllib.parse.urlencode({"id_prefix": prefix, "limit": 1}))

    assert listed("user-token", "a_") == [made["a_b", "uma"]]  # "_" is no wildcard
    assert listed("user-token", "a") == [made[k, "uma"] for k in ("abc", "axb", "a_b")]
    assert listed("user-token", "abc") == [made["abc", "uma"]]  # not bob's
    assert listed("viewer-token", "abc") == [made["abc", "bob"], made["abc", "uma"]]
    assert listed("user-token", made["zz", "uma"]) == [made["zz", "uma"]]
    for typed in ("%", "a%", "*", "[a]", ".*"):
        assert listed("viewer-token", typed) == [], typed
    for value in ("", "x" * 129, "a\x00"):
        query = urllib.parse.urlencode({"id_prefix": value})
        refused = s.call("GET", f"/api/v1/jobs?{query}", "user-token")
        assert refused.status == 400 and "id_prefix" in refused.json()["error"], value


def test_the_client_resolves_a_typed_id_from_the_jobs_that_start_with_it(server):
    """The whole id, the start of one, the start of several (named, newest first), and texts
    that name nothing, among them some a URL path would read otherwise."""
    from spotwise.client import Client
    from spotwise.client import Server as Configured
    from spotwise.errors import JobNotFoundError

    store = Store()
    ids = [store.create_job("twin", {}, None, now=3000.0 + n, owner="uma").id for n in range(3)]
    lone = store.create_job("lone", {}, None, now=3100.0, owner="uma").id
    theirs = store.create_job("theirs", {}, None, now=3200.0, owner="bob").id
    for job_id in [*ids, lone, theirs]:
        store.update_job(job_id, state=JobState.SUCCEEDED)
    s: Server = server()
    client = Client(Configured(s.url, "user-token", "test"))
    assert client.resolve(ids[1]) == ids[1]
    assert client.job(ids[1])["id"] == ids[1]
    assert client.resolve("lo") == lone and client.job("lo")["id"] == lone
    with pytest.raises(JobNotFoundError, match="give more of the id") as err:
        client.resolve("twin")
    assert f"it starts {ids[2]}, {ids[1]}, {ids[0]}" in str(err.value)
    for typed in ("the", theirs, "%", "", "t" * 500, "lo\x00", "../lone", "lone/x", "..", "."):
        with pytest.raises(JobNotFoundError, match=r"no job .* on http"):
            client.resolve(typed)
