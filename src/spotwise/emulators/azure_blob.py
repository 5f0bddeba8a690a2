"""A loopback Azure Blob Storage: the Blob REST subset the official ``azure-storage-blob``
client uses for checkpoints, so ``az://`` run dirs are tested (and rehearsed) over real HTTP with
the real client, reached Azurite-style (path-style URLs ``/ACCOUNT/container/blob`` and the
well-known development account ``devstoreaccount1``).

Served: Create/Get Properties of a container; Put Blob, Put Block, Put Block List; Get Blob
(``x-ms-range``/``Range``, 206/416 as the service answers); Get Blob Properties; List Blobs
(``prefix``, ``marker``, ``maxresults``); Delete Blob. Every request must carry a valid
``SharedKey`` signature of the development account (403 ``AuthenticationFailed`` otherwise,
computed from the documented string-to-sign, not from the SDK's code); ``If-Match`` /
``If-None-Match`` answer 412 ``ConditionNotMet``; a ``Content-MD5`` that does not match the body
is refused (400 ``Md5Mismatch``); metadata names must be C# identifiers (400 ``InvalidMetadata``).

Hostile hooks for tests: :meth:`corrupt` flips a stored byte, :meth:`truncate` cuts a stored
blob short (both keep the metadata recorded at upload).
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import itertools
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from spotwise.emulators._server import LoopbackEmulator, Request, Response

ACCOUNT = "devstoreaccount1"
# The development account's key, published in Microsoft's Azurite and storage-emulator docs.
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
API_VERSION = "2025-11-05"
_PAGE = 5000  # List Blobs' default and maximum maxresults
_CONTAINER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIGNED_HEADERS = (
    "Content-Encoding", "Content-Language", "Content-Length", "Content-MD5", "Content-Type",
    "Date", "If-Modified-Since", "If-Match", "If-None-Match", "If-Unmodified-Since", "Range",
)  # fmt: skip


@dataclass
class _Blob:
    data: bytes
    etag: str
    metadata: dict[str, str]
    content_type: str
    modified: float
    blocks: dict[str, bytes] = field(default_factory=dict)  # staged, not yet committed


class AzureBlobEmulator(LoopbackEmulator):
    """``AzureBlobEmulator().start()`` -> base URL; :meth:`connection_string` is what a client
    sets as ``AZURE_STORAGE_CONNECTION_STRING``."""

    platform = "azure-blob"

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *, hang_s: float = 60.0) -> None:
        super().__init__(port, host, hang_s=hang_s)
        self.containers: dict[str, dict[str, _Blob]] = {}
        self._staged: dict[tuple[str, str], dict[str, bytes]] = {}
        self._etags = itertools.count(0x8DC0000000000000)
        self._data_lock = threading.Lock()

    @property
    def account_url(self) -> str:
        return f"{self.url}/{ACCOUNT}"

    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint={self.account_url};"
        )

    NAME_RULE = (
        "container names are 3-63 lowercase letters, digits and single hyphens, starting and "
        "ending with a letter or digit"
    )

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def add_bucket(self, name: str) -> None:
        """Create a container (as Create Container does); ValueError for a name Azure refuses."""
        if not _CONTAINER_NAME.match(name) or "--" in name:
            raise ValueError(f"invalid container name {name!r}")
        with self._data_lock:
            self.containers.setdefault(name, {})

    # --- hostile hooks ------------------------------------------------------------------------
    def corrupt(self, container: str, name: str) -> None:
        with self._data_lock:
            blob = self.containers[container][name]
            blob.data = blob.data[:-1] + bytes([blob.data[-1] ^ 0xFF])

    def truncate(self, container: str, name: str, cut: int) -> None:
        with self._data_lock:
            blob = self.containers[container][name]
            blob.data = blob.data[:-cut]

    # --- protocol -----------------------------------------------------------------------------
    def handle(self, request: Request) -> Response:
        segments = request.path.split("/", 3)  # "", account, container, blob (still quoted)
        if len(segments) < 3 or segments[1] != ACCOUNT or not segments[2]:
            return _error(400, "InvalidUri", "The requested URI does not represent any resource.")
        if not self._signed(request):
            return _error(403, "AuthenticationFailed", "Server failed to authenticate the "
                          "request. Make sure the value of the Authorization header is formed "
                          "correctly including the signature.")  # fmt: skip
        container = unquote(segments[2])
        name = unquote(segments[3]) if len(segments) == 4 and segments[3] else ""
        with self._data_lock:
            if not name:
                return self._container(request, container)
            if container not in self.containers:
                return _error(404, "ContainerNotFound", "The specified container does not exist.")
            return self._blob(request, container, name)

    def _signed(self, request: Request) -> bool:
        """Check the SharedKey signature (Authorize with Shared Key, Blob service)."""
        header = request.header("Authorization") or ""
        scheme, _, credential = header.partition(" ")
        account, _, signature = credential.partition(":")
        if scheme != "SharedKey" or account != ACCOUNT:
            return False
        values = []
        for name in _SIGNED_HEADERS:
            value = request.header(name) or ""
            values.append("" if name == "Content-Length" and value == "0" else value)
        x_ms = sorted(
            (k.lower(), v.strip())
            for k, v in request.headers.items()
            if k.lower().startswith("x-ms-")
        )
        resource = f"/{ACCOUNT}{request.path}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(request.query.items())
        )
        to_sign = "\n".join([request.method, *values]) + "\n"
        to_sign += "".join(f"{k}:{v}\n" for k, v in x_ms) + resource
        digest = hmac.new(base64.b64decode(ACCOUNT_KEY), to_sign.encode(), hashlib.sha256)
        return hmac.compare_digest(base64.b64encode(digest.digest()).decode(), signature)

    def _container(self, request: Request, container: str) -> Response:
        if request.query.get("restype") != "container":
            return _error(400, "InvalidQueryParameterValue", "restype=container required")
        exists = container in self.containers
        comp = request.query.get("comp")
        if request.method == "PUT" and comp is None:
            if not _CONTAINER_NAME.match(container) or "--" in container:
                return _error(400, "InvalidResourceName", "The specified resource name contains "
                              "invalid characters.")  # fmt: skip
            if exists:
                return _error(409, "ContainerAlreadyExists", "The specified container already "
                              "exists.")  # fmt: skip
            self.containers[container] = {}
            return Response(201, b"", _headers({"ETag": self._etag()}))
        if not exists:
            return _error(404, "ContainerNotFound", "The specified container does not exist.")
        if request.method in ("GET", "HEAD") and comp is None:
            return Response(200, b"", _headers({"ETag": self._etag()}))
        if request.method == "GET" and comp == "list":
            return self._list(request, container)
        if request.method == "DELETE" and comp is None:
            del self.containers[container]
            return Response(202, b"", _headers())
        return _error(400, "UnsupportedHttpVerb", f"{request.method} {comp} is not served here")

    def _list(self, request: Request, container: str) -> Response:
        prefix = request.query.get("prefix", "")
        marker = request.query.get("marker", "")
        page = min(int(request.query.get("maxresults") or _PAGE), _PAGE)
        names = sorted(n for n in self.containers[container] if n.startswith(prefix) and n > marker)
        shown = names[:page]
        items = "".join(_blob_xml(n, self.containers[container][n]) for n in shown)
        next_marker = escape(shown[-1]) if len(names) > page else ""
        body = (
            '<?xml version="1.0" encoding="utf-8"?>'
            f'<EnumerationResults ServiceEndpoint="{escape(self.account_url)}/" '
            f'ContainerName="{escape(container)}"><Prefix>{escape(prefix)}</Prefix>'
            f"<Marker>{escape(marker)}</Marker><MaxResults>{page}</MaxResults>"
            f"<Blobs>{items}</Blobs><NextMarker>{next_marker}</NextMarker></EnumerationResults>"
        )
        return Response(200, body.encode(), _headers({"Content-Type": "application/xml"}))

    def _blob(self, request: Request, container: str, name: str) -> Response:
        blobs = self.containers[container]
        existing = blobs.get(name)
        comp = request.query.get("comp")
        if request.method == "PUT" and comp == "block":
            return self._put_block(request, container, name)
        if request.method == "PUT" and comp in (None, "blocklist"):
            failed = _condition(request, existing)
            if failed is not None:
                return failed
            if not _md5_ok(request):
                return _error(400, "Md5Mismatch", "The MD5 value specified in the request did "
                              "not match with the MD5 value calculated by the server.")  # fmt: skip
            metadata = {k[len("x-ms-meta-") :]: v for k, v in request.headers.items()
                        if k.lower().startswith("x-ms-meta-")}  # fmt: skip
            if not all(_IDENTIFIER.match(k) for k in metadata):
                return _error(400, "InvalidMetadata", "The metadata specified is invalid. It has "
                              "characters that are not permitted.")  # fmt: skip
            if comp == "blocklist":
                data = self._commit(request, container, name)
                if data is None:
                    return _error(400, "InvalidBlockList", "The specified block list is invalid.")
            elif request.header("x-ms-blob-type") != "BlockBlob":
                return _error(400, "MissingRequiredHeader", "x-ms-blob-type: BlockBlob required")
            else:
                data = request.body
            content_type = (
                request.header("x-ms-blob-content-type")
                or (request.header("Content-Type") if comp is None else None)
                or "application/octet-stream"
            )
            blob = _Blob(data, self._etag(), metadata, content_type, time.time())
            blobs[name] = blob
            headers = {"ETag": blob.etag, "Last-Modified": _http_date(blob.modified),
                       "Content-MD5": _md5(request.body),  # of the request, as the service says
                       "x-ms-request-server-encrypted": "true"}  # fmt: skip
            return Response(201, b"", _headers(headers))
        if existing is None:
            return _error(404, "BlobNotFound", "The specified blob does not exist.")
        if request.method in ("GET", "HEAD"):
            failed = _condition(request, existing)
            if failed is not None:
                return failed
            return _read(request, existing)
        if request.method == "DELETE":
            failed = _condition(request, existing)
            if failed is not None:
                return failed
            del blobs[name]
            return Response(202, b"", _headers({"x-ms-delete-type-permanent": "true"}))
        return _error(400, "UnsupportedHttpVerb", f"{request.method} is not served here")

    def _put_block(self, request: Request, container: str, name: str) -> Response:
        block_id = request.query.get("blockid", "")
        if not block_id:
            return _error(400, "InvalidQueryParameterValue", "blockid is required")
        if not _md5_ok(request):
            return _error(400, "Md5Mismatch", "The MD5 value specified in the request did not "
                          "match with the MD5 value calculated by the server.")  # fmt: skip
        self._staged.setdefault((container, name), {})[block_id] = request.body
        return Response(201, b"", _headers({"Content-MD5": _md5(request.body)}))

    def _commit(self, request: Request, container: str, name: str) -> bytes | None:
        staged = self._staged.pop((container, name), {})
        try:
            root = ElementTree.fromstring(request.body)
        except ElementTree.ParseError:
            return None
        pieces = [staged.get(item.text or "") for item in root]  # blocks of this upload only
        if any(piece is None for piece in pieces):
            return None
        return b"".join(p for p in pieces if p is not None)

    def _etag(self) -> str:
        return f'"0x{next(self._etags):X}"'


def _read(request: Request, blob: _Blob) -> Response:
    size = len(blob.data)
    headers = _headers({
        "ETag": blob.etag, "Last-Modified": _http_date(blob.modified),
        "Content-Type": blob.content_type, "x-ms-blob-type": "BlockBlob",
        "x-ms-creation-time": _http_date(blob.modified), "x-ms-lease-status": "unlocked",
        "x-ms-lease-state": "available", "x-ms-server-encrypted": "true", "Accept-Ranges": "bytes",
    })  # fmt: skip
    headers.update({f"x-ms-meta-{k}": v for k, v in blob.metadata.items()})
    spec = request.header("x-ms-range") or request.header("Range") or ""
    if request.method == "HEAD" or not spec.startswith("bytes="):
        headers["Content-MD5"] = _md5(blob.data)
        if request.method == "HEAD":
            headers["Content-Length"] = str(size)
            return Response(200, b"", headers)
        return Response(200, blob.data, headers)
    first, _, last = spec[len("bytes=") :].partition("-")
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size:
        return _error(416, "InvalidRange", "The range specified is invalid for the current "
                      "size of the resource.", {"Content-Range": f"bytes */{size}"})  # fmt: skip
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return Response(206, blob.data[start : end + 1], headers)


def _condition(request: Request, blob: _Blob | None) -> Response | None:
    """If-Match / If-None-Match as the Blob service applies them (412 ConditionNotMet)."""
    match = request.header("If-Match")
    none_match = request.header("If-None-Match")
    etag = blob.etag if blob is not None else None
    failed = (match is not None and (etag is None or match not in ("*", etag))) or (
        none_match is not None and etag is not None and none_match in ("*", etag)
    )
    if not failed:
        return None
    if request.method == "PUT" and none_match == "*":  # create-only on an existing blob
        return _error(409, "BlobAlreadyExists", "The specified blob already exists.")
    if request.method in ("GET", "HEAD") and none_match is not None and match is None:
        return Response(304, b"", _headers())
    return _error(412, "ConditionNotMet", "The condition specified using HTTP conditional "
                  "header(s) is not met.")  # fmt: skip


def _md5_ok(request: Request) -> bool:
    declared = request.header("Content-MD5")
    return declared is None or declared == _md5(request.body)


def _blob_xml(name: str, blob: _Blob) -> str:
    return (
        f"<Blob><Name>{escape(name)}</Name><Properties>"
        f"<Creation-Time>{_http_date(blob.modified)}</Creation-Time>"
        f"<Last-Modified>{_http_date(blob.modified)}</Last-Modified>"
        f"<Etag>{escape(blob.etag)}</Etag><Content-Length>{len(blob.data)}</Content-Length>"
        f"<Content-Type>{escape(blob.content_type)}</Content-Type>"
        f"<Content-MD5>{_md5(blob.data)}</Content-MD5><BlobType>BlockBlob</BlobType>"
        "<AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>"
        "<LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState>"
        "<ServerEncrypted>true</ServerEncrypted></Properties></Blob>"
    )


def _headers(extra: dict[str, Any] | None = None) -> dict[str, str]:
    headers = {
        "x-ms-request-id": str(uuid.uuid4()),
        "x-ms-version": API_VERSION,
        "Date": _http_date(time.time()),
    }
    headers.update({k: str(v) for k, v in (extra or {}).items()})
    return headers


def _error(status: int, code: str, message: str, extra: dict[str, str] | None = None) -> Response:
    body = (
        '<?xml version="1.0" encoding="utf-8"?>'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
    )
    headers = _headers({"x-ms-error-code": code, "Content-Type": "application/xml"})
    headers.update(extra or {})
    return Response(status, body.encode(), headers)


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _http_date(stamp: float) -> str:
    return email.utils.formatdate(stamp, usegmt=True)
