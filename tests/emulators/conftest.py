"""Raw HTTP helpers: emulator tests speak the protocol by hand, never through the detectors."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

Raw = Callable[..., tuple[int, dict[str, str], bytes]]


def _raw(
    url: str, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.fixture()
def raw() -> Raw:
    return _raw


def as_json(body: bytes) -> Any:
    return json.loads(body)
