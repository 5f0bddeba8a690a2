"""A tiny proxy-free HTTP client for metadata services.

``http.client`` directly, so ``HTTP_PROXY``/``HTTPS_PROXY`` can never route a metadata call
through a proxy (a classic cause of broken or leaked metadata requests), and every call has a
short timeout. Network trouble becomes :class:`NetworkTrouble`, which detectors catch.
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from urllib.parse import urlsplit


class NetworkTrouble(Exception):
    """Connection refused, timeout, reset, bad URL: the endpoint did not answer properly."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace").strip()


def request(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout_s: float,
) -> Reply:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "") or not parts.hostname:
        raise NetworkTrouble(f"unsupported metadata URL {url!r} (only plain http)")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return Reply(
            status=response.status,
            headers={k.lower(): v for k, v in response.getheaders()},
            body=data,
        )
    except (OSError, http.client.HTTPException, ValueError) as exc:  # timeouts are OSError
        raise NetworkTrouble(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def normalize_base(url: str) -> str:
    """``"http://127.0.0.1:1338/"`` -> ``"http://127.0.0.1:1338"``; a bare host gets http://."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/")
