"""A loopback Google Cloud Storage: the JSON API subset the official ``google-cloud-storage``
client uses for checkpoints, so ``gs://`` run dirs are tested (and rehearsed) over real HTTP with
the real client pointed at it by ``STORAGE_EMULATOR_HOST``.

Served: bucket insert/get; object upload (``uploadType=media``, ``multipart``, and
``resumable`` sessions with ``Content-Range`` chunks and 308 ``Range`` answers); get metadata;
download (``alt=media``, ``Range``, ``x-goog-hash``); list (``prefix``, ``maxResults``,
``pageToken``); delete. Preconditions (``ifGenerationMatch`` incl. 0 = "does not exist",
``ifGenerationNotMatch``, ``ifMetagenerationMatch``) answer 412 as GCS does; an upload whose
declared CRC32C or MD5 does not match its bytes is refused (400), as GCS does. Only the newest
generation of an object is kept (a bucket without versioning). Errors carry GCS's JSON error
shape and messages ("No such object: b/o", "The specified bucket does not exist.").

Hostile hooks for tests: :meth:`corrupt` flips a stored byte behind the recorded checksums (bit
rot), :meth:`truncate` cuts a stored object short the same way.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import crc32c

from spotwise.emulators._server import LoopbackEmulator, Request, Response, json_body

_PAGE = 1000  # GCS's default and maximum maxResults
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


@dataclass
class _Object:
    data: bytes
    generation: int
    content_type: str
    metadata: dict[str, str]
    created: float
    crc32c: str = ""  # base64 big-endian, computed at upload (corrupt() leaves it stale)
    md5: str = ""

    def __post_init__(self) -> None:
        if not self.crc32c:
            self.crc32c = _b64_crc(self.data)
            self.md5 = _b64_md5(self.data)


@dataclass
class _Session:
    bucket: str
    name: str
    resource: dict[str, Any]
    query: dict[str, str]
    data: bytearray = field(default_factory=bytearray)


class GcsEmulator(LoopbackEmulator):
    """``GcsEmulator().start()`` -> base URL; clients find it through
    ``STORAGE_EMULATOR_HOST=<url>`` (:meth:`env`)."""

    platform = "gcs"

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *, hang_s: float = 60.0) -> None:
        super().__init__(port, host, hang_s=hang_s)
        self.buckets: dict[str, dict[str, _Object]] = {}
        self._sessions: dict[str, _Session] = {}
        self._generations = itertools.count(int(time.time() * 1e6))
        self._data_lock = threading.Lock()

    NAME_RULE = (
        "bucket names are 3-63 lowercase letters, digits, '-', '_' and '.', starting and "
        "ending with a letter or digit"
    )

    def env(self) -> dict[str, str]:
        """What a client needs: the SDK's own emulator variable (no credentials are used)."""
        return {"STORAGE_EMULATOR_HOST": self.url}

    def add_bucket(self, name: str) -> None:
        """Create a bucket (as ``buckets.insert`` does); ValueError for a name GCS refuses."""
        if not _BUCKET_NAME.match(name):
            raise ValueError(f"invalid bucket name {name!r}")
        with self._data_lock:
            self.buckets.setdefault(name, {})

    # --- hostile hooks ------------------------------------------------------------------------
    def corrupt(self, bucket: str, name: str) -> None:
        """Flip the last stored byte; the recorded CRC32C/MD5 stay those of the upload."""
        with self._data_lock:
            obj = self.buckets[bucket][name]
            obj.data = obj.data[:-1] + bytes([obj.data[-1] ^ 0xFF])

    def truncate(self, bucket: str, name: str, cut: int) -> None:
        """Drop the last ``cut`` stored bytes (size and checksums follow the stored bytes, as an
        object rewritten short by another tool)."""
        with self._data_lock:
            obj = self.buckets[bucket][name]
            obj.data = obj.data[:-cut]
            obj.crc32c, obj.md5 = _b64_crc(obj.data), _b64_md5(obj.data)

    # --- protocol -----------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        parts = [unquote(p) for p in request.path.split("/")]
        base = f"http://{request.header('Host') or f'{self.host}:{self.port}'}"
        with self._data_lock:
            if parts[1:4] == ["storage", "v1", "b"]:
                return self._json_api(request, parts[4:], base)
            if parts[1:5] == ["download", "storage", "v1", "b"] and len(parts) == 8:
                return self._download(request, parts[5], parts[7])
            if parts[1:5] == ["upload", "storage", "v1", "b"] and parts[6:] == ["o"]:
                return self._upload(request, parts[5], base)
        return _error(404, "Not Found", "notFound")

    def _json_api(self, request: Request, rest: list[str], base: str) -> Response:
        method = request.method
        if not rest and method == "POST":
            return self._insert_bucket(request)
        if not rest:
            return _error(405, "method not allowed", "invalid")
        bucket = rest[0]
        if bucket not in self.buckets:
            return _error(404, "The specified bucket does not exist.", "notFound")
        if len(rest) == 1 and method == "GET":
            return Response(200, json_body(_bucket_resource(bucket)), _JSON)
        if rest[1:] == ["o"] and method == "GET":
            return self._list(request, bucket, base)
        if len(rest) == 3 and rest[1] == "o":
            name = rest[2]
            obj = self.buckets[bucket].get(name)
            failed = _precondition(obj, request.query, name, bucket)
            if failed is not None:
                return failed
            assert obj is not None
            if method == "GET" and request.query.get("alt") == "media":
                return self._media(request, obj)
            if method == "GET":
                return Response(200, json_body(_resource(base, bucket, name, obj)), _JSON)
            if method == "DELETE":
                del self.buckets[bucket][name]
                return Response(204)
        return _error(405, "method not allowed", "invalid")

    def _insert_bucket(self, request: Request) -> Response:
        name = str(_json(request.body).get("name", ""))
        if not name:
            return _error(400, "Required", "required")
        if not _BUCKET_NAME.match(name):
            return _error(400, f"Invalid bucket name: '{name}'", "invalid")
        if name in self.buckets:
            return _error(409, "Your previous request to create the named bucket succeeded "
                          "and you already own it.", "conflict")  # fmt: skip
        self.buckets[name] = {}
        return Response(200, json_body(_bucket_resource(name)), _JSON)

    def _list(self, request: Request, bucket: str, base: str) -> Response:
        prefix = request.query.get("prefix", "")
        start = _decode_token(request.query.get("pageToken", ""))
        page = min(int(request.query.get("maxResults") or _PAGE), _PAGE)
        names = sorted(n for n in self.buckets[bucket] if n.startswith(prefix) and n > start)
        doc: dict[str, Any] = {"kind": "storage#objects"}
        shown = names[:page]
        if shown:
            doc["items"] = [_resource(base, bucket, n, self.buckets[bucket][n]) for n in shown]
        if len(names) > page:
            doc["nextPageToken"] = base64.urlsafe_b64encode(shown[-1].encode()).decode()
        return Response(200, json_body(doc), _JSON)

    def _download(self, request: Request, bucket: str, name: str) -> Response:
        if request.method != "GET" or request.query.get("alt") != "media":
            return _error(400, "alt=media required", "invalid")
        if bucket not in self.buckets:
            return _error(404, "The specified bucket does not exist.", "notFound")
        obj = self.buckets[bucket].get(name)
        failed = _precondition(obj, request.query, name, bucket)
        if failed is not None:
            return failed
        assert obj is not None
        return self._media(request, obj)

    def _media(self, request: Request, obj: _Object) -> Response:
        headers = {
            "Content-Type": obj.content_type,
            "x-goog-hash": f"crc32c={obj.crc32c},md5={obj.md5}",
            "x-goog-generation": str(obj.generation),
            "x-goog-metageneration": "1",
            "x-goog-stored-content-length": str(len(obj.data)),
            "x-goog-stored-content-encoding": "identity",
            "ETag": _etag(obj),
        }
        size = len(obj.data)
        spec = (request.header("Range") or "").strip()
        if not spec.startswith("bytes="):
            return Response(200, obj.data, headers)
        first, _, last = spec[len("bytes=") :].partition("-")
        start = int(first) if first else max(size - int(last), 0)
        end = min(int(last), size - 1) if first and last else size - 1
        if start >= size:
            headers["Content-Range"] = f"bytes */{size}"
            return Response(416, b"", headers)
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        return Response(206, obj.data[start : end + 1], headers)

    def _upload(self, request: Request, bucket: str, base: str) -> Response:
        if bucket not in self.buckets:
            return _error(404, "The specified bucket does not exist.", "notFound")
        kind = request.query.get("uploadType", "")
        if request.method == "POST" and kind == "media":
            name = request.query.get("name", "")
            resource = {"name": name, "contentType": request.header("Content-Type")}
            return self._store(base, bucket, resource, request.query, request.body)
        if request.method == "POST" and kind == "multipart":
            parsed = _multipart(request)
            if parsed is None:
                return _error(400, "Invalid multipart request", "invalid")
            resource, data = parsed
            resource.setdefault("name", request.query.get("name", ""))
            return self._store(base, bucket, resource, request.query, data)
        if request.method == "POST" and kind == "resumable":
            resource = _json(request.body)
            resource.setdefault("name", request.query.get("name", ""))
            name = str(resource.get("name", ""))
            failed = _precondition(self.buckets[bucket].get(name), request.query, name, bucket,
                                   writing=True)  # fmt: skip
            if failed is not None:
                return failed
            upload_id = secrets.token_urlsafe(24)
            self._sessions[upload_id] = _Session(bucket, name, resource, dict(request.query))
            location = (
                f"{base}/upload/storage/v1/b/{quote(bucket)}/o"
                f"?uploadType=resumable&upload_id={upload_id}"
            )
            return Response(200, b"", {"Location": location, "X-GUploader-UploadID": upload_id})
        if request.method == "PUT" and kind == "resumable":
            return self._chunk(request, base)
        return _error(400, f"unsupported upload {request.method} uploadType={kind!r}", "invalid")

    def _chunk(self, request: Request, base: str) -> Response:
        session = self._sessions.get(request.query.get("upload_id", ""))
        if session is None:
            return _error(404, "No such upload session", "notFound")
        span, _, total_text = (
            (request.header("Content-Range") or "").removeprefix("bytes ").partition("/")
        )
        total = None if total_text in ("", "*") else int(total_text)
        if span != "*" and span:
            start = int(span.split("-", 1)[0])
            if start != len(session.data):  # the client must resend from what we have
                return self._progress(session)
            session.data.extend(request.body)
        if total is None or len(session.data) < total:
            return self._progress(session)
        if len(session.data) != total:
            return _error(400, f"upload has {len(session.data)} bytes, declared {total}",
                          "invalid")  # fmt: skip
        del self._sessions[request.query["upload_id"]]
        return self._store(base, session.bucket, session.resource, session.query,
                           bytes(session.data))  # fmt: skip

    @staticmethod
    def _progress(session: _Session) -> Response:
        headers = {"Range": f"bytes=0-{len(session.data) - 1}"} if session.data else {}
        return Response(308, b"", headers)

    def _store(
        self,
        base: str,
        bucket: str,
        resource: dict[str, Any],
        query: dict[str, str],
        data: bytes,
    ) -> Response:
        name = str(resource.get("name") or "")
        if not name:
            return _error(400, "Required: object name", "required")
        failed = _precondition(self.buckets[bucket].get(name), query, name, bucket, writing=True)
        if failed is not None:
            return failed
        for field_name, actual in (("crc32c", _b64_crc(data)), ("md5Hash", _b64_md5(data))):
            declared = resource.get(field_name)
            if declared and declared != actual:
                label = "CRC32C" if field_name == "crc32c" else "MD5"
                return _error(400, f'Provided {label} "{declared}" doesn\'t match calculated '
                              f'{label} "{actual}".', "invalid")  # fmt: skip
        obj = _Object(
            data,
            next(self._generations),
            str(resource.get("contentType") or "application/octet-stream"),
            {str(k): str(v) for k, v in (resource.get("metadata") or {}).items()},
            time.time(),
        )
        self.buckets[bucket][name] = obj
        return Response(200, json_body(_resource(base, bucket, name, obj)), _JSON)


_JSON = {"Content-Type": "application/json; charset=UTF-8"}


def _precondition(
    obj: _Object | None, query: dict[str, str], name: str, bucket: str, *, writing: bool = False
) -> Response | None:
    """GCS's generation preconditions; a missing object is 404 unless the write may create it."""
    match = query.get("ifGenerationMatch")
    if obj is None:
        if writing and match in (None, "0"):
            return None
        if writing:
            return _error(412, "At least one of the pre-conditions you specified did not hold.",
                          "conditionNotMet")  # fmt: skip
        return _error(404, f"No such object: {bucket}/{name}", "notFound")
    generation = query.get("generation")
    if generation is not None and not writing and generation != str(obj.generation):
        return _error(404, f"No such object: {bucket}/{name}", "notFound")
    failed = (
        (match is not None and match != str(obj.generation))
        or query.get("ifGenerationNotMatch") == str(obj.generation)
        or query.get("ifMetagenerationMatch", "1") != "1"
    )
    if failed:
        return _error(412, "At least one of the pre-conditions you specified did not hold.",
                      "conditionNotMet")  # fmt: skip
    return None


def _resource(base: str, bucket: str, name: str, obj: _Object) -> dict[str, Any]:
    quoted = quote(name, safe="")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(obj.created))
    stamp += f".{int(obj.created * 1000) % 1000:03d}Z"
    doc: dict[str, Any] = {
        "kind": "storage#object",
        "id": f"{bucket}/{name}/{obj.generation}",
        "selfLink": f"{base}/storage/v1/b/{bucket}/o/{quoted}",
        "mediaLink": f"{base}/download/storage/v1/b/{bucket}/o/{quoted}"
        f"?generation={obj.generation}&alt=media",
        "name": name,
        "bucket": bucket,
        "generation": str(obj.generation),
        "metageneration": "1",
        "contentType": obj.content_type,
        "storageClass": "STANDARD",
        "size": str(len(obj.data)),
        "md5Hash": obj.md5,
        "crc32c": obj.crc32c,
        "etag": _etag(obj),
        "timeCreated": stamp,
        "updated": stamp,
        "timeStorageClassUpdated": stamp,
    }
    if obj.metadata:
        doc["metadata"] = dict(obj.metadata)
    return doc


def _bucket_resource(name: str) -> dict[str, Any]:
    return {"kind": "storage#bucket", "id": name, "name": name, "location": "US",
            "storageClass": "STANDARD", "metageneration": "1"}  # fmt: skip


def _multipart(request: Request) -> tuple[dict[str, Any], bytes] | None:
    """The (metadata, media) parts of a ``multipart/related`` upload body."""
    content_type = request.header("Content-Type") or ""
    marker = "boundary="
    if marker not in content_type:
        return None
    boundary = content_type.split(marker, 1)[1].strip().strip('"').encode()
    pieces = request.body.split(b"--" + boundary)
    if len(pieces) < 4 or not pieces[-1].startswith(b"--"):
        return None
    parsed = []
    for piece in pieces[1:3]:
        head, sep, body = piece.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep or not body.endswith(b"\r\n"):
            return None
        parsed.append((head.decode("latin-1").lower(), body[:-2]))
    resource = _json(parsed[0][1])
    media_type = parsed[1][0].partition("content-type:")[2].strip()
    if media_type and "contentType" not in resource:
        resource["contentType"] = media_type
    return resource, parsed[1][1]


def _json(body: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode() if token else ""
    except ValueError:
        return ""


def _error(status: int, message: str, reason: str) -> Response:
    detail = {"message": message, "domain": "global", "reason": reason}
    doc = {"error": {"code": status, "message": message, "errors": [detail]}}
    return Response(status, json_body(doc), _JSON)


def _etag(obj: _Object) -> str:
    return base64.b64encode(f"{obj.generation}".encode()).decode()


def _b64_crc(data: bytes) -> str:
    return base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()


def _b64_md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
