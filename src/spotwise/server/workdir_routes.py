"""The routes for a remote client's packed workdir (:mod:`spotwise.server.uploads`): whether
the server has an archive, its upload, and the digest a submit names."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from spotwise.control.store import Store
from spotwise.control.workdir import ARCHIVES, split_workdir
from spotwise.errors import SpotwiseError
from spotwise.server.access import API, Access, Authenticate, Denied, error, spotwise_error
from spotwise.server.uploads import TooLarge, receive, stored
from spotwise.telemetry.dashboard.app import FiniteJSONResponse


class WorkdirRoutes(Access):
    """``GET`` and ``PUT /api/v1/workdirs/{sha256}``, into ``$SPOTWISE_HOME/workdirs``."""

    def __init__(self, store: Store, authenticate: Authenticate) -> None:
        super().__init__(store, authenticate)
        self.uploads = store.home / ARCHIVES

    async def status(self, request: Request) -> Response:
        """Whether the server has this archive already (a client then skips its upload)."""
        self.submitter(request)
        sha256 = request.path_params["sha256"]
        try:
            found = stored(self.uploads, sha256)
        except SpotwiseError as exc:
            return spotwise_error(400, exc)
        if found is None:
            return error(404, f"no workdir archive {sha256}", f"upload it: PUT {API}/workdirs/SHA")
        return FiniteJSONResponse({"sha256": sha256, "bytes": found.stat().st_size})

    async def upload(self, request: Request) -> Response:
        self.submitter(request)
        sha256 = request.path_params["sha256"]
        try:
            size, new = await receive(request.stream(), sha256, self.uploads)
        except TooLarge as exc:
            return spotwise_error(413, exc)
        except SpotwiseError as exc:
            return spotwise_error(422, exc)
        return FiniteJSONResponse(
            {"sha256": sha256, "bytes": size}, status_code=201 if new else 200
        )

    def uploaded(self, request: Request, doc: Any) -> str | None:
        """The digest a submit names in ``?workdir_sha256=``, once its archive is here."""
        sha256 = request.query_params.get("workdir_sha256")
        if sha256 is None:
            return None
        written = doc.get("workdir") if isinstance(doc, dict) else None
        if not isinstance(written, str) or split_workdir(written)[0] != "pack":
            raise Denied(
                error(
                    422,
                    "workdir_sha256 is given but the job file's workdir is not pack:PATH",
                    "send workdir_sha256 only with a workdir: pack:PATH",
                )
            )
        try:
            found = stored(self.uploads, sha256)
        except SpotwiseError as exc:
            raise Denied(spotwise_error(400, exc)) from None
        if found is None:
            raise Denied(
                error(
                    422,
                    f"workdir: {written}: no uploaded archive {sha256}",
                    f"upload it first: PUT {API}/workdirs/{sha256}",
                )
            )
        return sha256
