"""The CLI's way to a ``spotwise server``: where it is, the caller's token, and its JSON API.

``SPOTWISE_SERVER`` (with ``SPOTWISE_TOKEN``) wins; else what ``spotwise login URL`` stored in
``$SPOTWISE_HOME/login.json`` (0600); else there is no server and the CLI drives jobs itself
(the embedded mode, the default). Standard library only: the client must work in the smallest
install, and its requests are few and small. Errors name the URL and the fix; a token is never
part of one.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from spotwise import settings
from spotwise.control.ids import CANDIDATES_SHOWN, could_name_a_job, one_id, quoted
from spotwise.control.store.models import spotwise_home
from spotwise.control.workdir import pack, split_workdir
from spotwise.errors import ConfigError, JobNotFoundError, ServerError

LOGIN_FILE = "login.json"
API = "/api/v1"
PAGE = 1000  # jobs a listing asks for at once (the server's largest page)
_NEXT = re.compile(r'<([^>]*)>\s*;\s*rel="next"')
TIMEOUT_S = 30.0  # one request; a followed log stream waits between chunks, never this long


@dataclass(frozen=True)
class Server:
    """A server to talk to and the token to show it."""

    url: str
    token: str
    origin: str  # where these came from, for messages: "SPOTWISE_SERVER" or the login file


def login_path() -> Path:
    return spotwise_home() / LOGIN_FILE


def configured_server() -> Server | None:
    """The server the CLI should use, or None for the embedded mode."""
    url = settings.SERVER.raw()
    if url:
        url = base_url(url)
        token = settings.TOKEN.raw()
        if not token:
            stored = _stored()
            token = stored.token if stored is not None and stored.url == url else ""
        if not token:
            raise ConfigError(
                f"{settings.SERVER.name}={url} is set but no token is",
                hint=f"set {settings.TOKEN.name}, or run: spotwise login {url}",
            )
        return Server(url, token, settings.SERVER.name)
    return _stored()


def refuse_group(command: str, why: str) -> None:
    """``sweep`` and ``infer`` run their workers under one group controller in the CLI's own
    process (the shared budget, the workload's progress), which a server does not run: with a
    server configured they stop here, before anything is submitted anywhere."""
    server = configured_server()
    if server is None:
        return
    here = (
        f"unset {settings.SERVER.name}"
        if server.origin == settings.SERVER.name
        else "run `spotwise logout`"
    ) + f" to run it on this machine (the embedded mode), then: spotwise {command} FILE"
    raise ConfigError(
        f"spotwise {command} does not run through a server ({server.url}, from "
        f"{server.origin}): {why}",
        hint=here,
    )


def _stored() -> Server | None:
    path = login_path()
    try:
        doc = json.loads(path.read_text())
        return Server(base_url(str(doc["url"])), str(doc["token"]), str(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"the login file {path} is unreadable: {type(exc).__name__}",
            hint="log in again with: spotwise login URL (or delete the file)",
        ) from None


def save_login(url: str, token: str) -> Path:
    """Store the server and token for later commands: a file only its owner can read."""
    from spotwise.checkpoint.durable import write_atomic

    path = login_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"url": base_url(url), "token": token}).encode(), mode=0o600)
    return path


def next_cursor(link: str | None) -> str | None:
    """The ``cursor`` of a listing's ``Link: <URL>; rel="next"`` header (None: last page)."""
    found = _NEXT.search(link or "")
    if found is None:
        return None
    cursors = urllib.parse.parse_qs(urllib.parse.urlsplit(found.group(1)).query).get("cursor")
    return cursors[0] if cursors else None


def base_url(url: str) -> str:
    """``url`` as the API's base: scheme and host checked, no trailing slash."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"server URL {url!r} is not an http(s) URL",
            hint="e.g. http://127.0.0.1:8642 (what `spotwise server` prints)",
        )
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


class Client:
    """The API calls the CLI makes; each answer is the server's JSON document."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def jobs(self) -> list[dict[str, Any]]:
        """Every job the caller may read, oldest first (as the embedded ``spotwise jobs`` lists
        them), read page by page (the API's pages are newest first)."""
        found: list[dict[str, Any]] = []
        query = {"limit": str(PAGE)}
        while True:
            with self._open("GET", f"/jobs?{urllib.parse.urlencode(query)}", None, None) as r:
                found += json.loads(r.read())
                after = next_cursor(r.headers.get("Link"))
            if after is None:
                return found[::-1]
            query["cursor"] = after

    def job(self, job_id: str) -> dict[str, Any]:
        """One job by its id or a unique prefix of it (as the embedded CLI accepts)."""
        found = self._typed(job_id)
        if isinstance(found, dict):
            return found
        return dict(self._json("GET", f"/jobs/{found}"))

    def resolve(self, job_id: str) -> str:
        """The id of the job ``job_id`` names: the whole id or the start of exactly one."""
        found = self._typed(job_id)
        return str(found["id"]) if isinstance(found, dict) else found

    def _typed(self, job_id: str) -> dict[str, Any] | str:
        """The job a typed id names: its document when the text is its whole id, else the id
        of the one job whose id starts with it. The server is asked for the job, then for the
        few whose ids start with the text, never for every job (with 10,000 stored, listing
        them all took 1.05-1.20 s per id resolved)."""
        if not could_name_a_job(job_id):
            raise self._no_job(job_id)
        # ids are a job name's letters, digits, "_", "." and "-": a text a path would have to
        # escape (or a bare "." or "..", which a path resolves) is no whole id
        if job_id.strip(".") and urllib.parse.quote(job_id, safe="") == job_id:
            with contextlib.suppress(JobNotFoundError):
                return dict(self._json("GET", f"/jobs/{job_id}"))
        query = {"id_prefix": job_id, "limit": str(CANDIDATES_SHOWN + 1)}
        ids = [j["id"] for j in self._json("GET", f"/jobs?{urllib.parse.urlencode(query)}")]
        if not all(i.startswith(job_id) for i in ids):  # a server older than id_prefix
            ids = [j["id"] for j in self.jobs()]
        found = one_id(job_id, ids)
        if found is None:
            raise self._no_job(job_id)
        return found

    def _no_job(self, job_id: str) -> JobNotFoundError:
        return JobNotFoundError(
            f"no job {quoted(job_id)} on {self.server.url}", hint="spotwise jobs"
        )

    def submit(self, job_file: Path, workdir: str) -> dict[str, Any]:
        """Submit the job file; ``workdir`` is its spec's, resolved here: a ``pack:`` folder
        is packed here and uploaded first (the server cannot read this machine's disk)."""
        query = {"base_dir": str(job_file.resolve().parent)}
        kind, folder = split_workdir(workdir)
        if kind == "pack":
            query["workdir_sha256"] = self.upload_workdir(Path(folder))
        path = f"/jobs?{urllib.parse.urlencode(query)}"
        return dict(self._json("POST", path, job_file.read_bytes(), "application/yaml"))

    def upload_workdir(self, root: Path) -> str:
        """Pack ``root`` (its ignore files, the size limit: refused here with its size) and
        upload it unless the server has that digest already; its sha256."""
        with tempfile.TemporaryDirectory(prefix="spotwise-pack-") as tmp:
            packed = Path(tmp) / "workdir.tar.gz"
            sha256 = pack(root, packed)
            try:
                self._json("GET", f"/workdirs/{sha256}")
                return sha256  # the same tree was uploaded before
            except JobNotFoundError:  # (404: not yet)
                pass
            with open(packed, "rb") as body:  # streamed from the file, in blocks
                headers = {"Content-Length": str(packed.stat().st_size)}
                with self._open("PUT", f"/workdirs/{sha256}", body, "application/gzip", headers):
                    pass
        return sha256

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self._json("POST", f"/jobs/{self.resolve(job_id)}/cancel", b""))

    def resume(self, job_id: str) -> dict[str, Any]:
        return dict(self._json("POST", f"/jobs/{self.resolve(job_id)}/resume", b""))

    def logs(self, job_id: str, follow: bool) -> Iterator[bytes]:
        """The job's output; with ``follow``, until the job ends (a stream quiet for longer
        than a request's timeout is asked for again from where it stopped)."""
        job_id, offset = self.resolve(job_id), 0
        while True:
            query = urllib.parse.urlencode({"follow": int(follow), "offset": offset})
            try:
                with self._open("GET", f"/jobs/{job_id}/logs?{query}", None, None) as r:
                    while chunk := r.read1(65536):
                        offset += len(chunk)
                        yield chunk
                return
            except TimeoutError:
                if not follow:
                    raise ServerError(
                        f"{self.server.url} stopped sending the logs of {job_id}",
                        hint="try again",
                    ) from None

    def _json(
        self, method: str, path: str, body: bytes | None = None, content_type: str | None = None
    ) -> Any:
        with self._open(method, path, body, content_type or "application/json") as r:
            return json.loads(r.read())

    def _open(
        self,
        method: str,
        path: str,
        body: bytes | BinaryIO | None,
        content_type: str | None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        url = self.server.url + API + path
        request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
        request.add_header("Authorization", f"Bearer {self.server.token}")
        request.add_header("Accept", "application/json")
        if content_type and body is not None:
            request.add_header("Content-Type", content_type)
        try:
            # no proxy for a server the user named: a loopback one must stay on loopback
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            return opener.open(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            raise self._refusal(exc) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ServerError(
                f"the spotwise server at {self.server.url} does not answer: {reason}",
                hint=f"check the URL ({self.server.origin}) and that `spotwise server` runs there",
            ) from None

    def _refusal(self, exc: urllib.error.HTTPError) -> Exception:
        try:
            doc = json.loads(exc.read() or b"{}")
        except ValueError:
            doc = {}
        message = str(doc.get("error") or exc.reason)
        hint = doc.get("hint")
        if exc.code == 401:
            return ServerError(
                f"{self.server.url} refused the token ({self.server.origin}): {message}",
                hint=f"log in again with: spotwise login {self.server.url}",
            )
        if exc.code == 404:
            return JobNotFoundError(message, hint=hint)
        if exc.code in (400, 422):
            return ConfigError(message, hint=hint)
        return ServerError(f"{self.server.url}: {exc.code} {message}", hint=hint)
