"""``spotwise server``'s serve() with three fixed tokens: a test double of the authenticate hook
(the server's own users and tokens are tested with their module)."""

from __future__ import annotations

from starlette.requests import Request

from spotwise.server.principal import Principal
from spotwise.server.serve import serve

TOKENS = {
    "admin-token": Principal("ada", "admin"),
    "user-token": Principal("uma", "user"),
    "other-user-token": Principal("bob", "user"),
    "viewer-token": Principal("vic", "viewer"),
}


def authenticate(request: Request) -> Principal | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return TOKENS.get(token) if scheme.lower() == "bearer" else None


if __name__ == "__main__":
    # a short lease: a test's server restarted after a SIGKILL adopts its jobs within 3 s
    serve(host="127.0.0.1", port=0, authenticate=authenticate, lease_s=3.0)
