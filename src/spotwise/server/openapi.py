"""The API's OpenAPI 3.1 description (``GET /api/v1/openapi.json``), written by hand: the API
is small, and the document says in words what each route answers."""

from __future__ import annotations

from typing import Any

from spotwise.control.ids import MAX_ID_CHARS
from spotwise.server.paging import MAX_PAGE, PAGE

_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "description": "the job's full id (no prefixes)",
    "schema": {"type": "string"},
}
_SHA256 = {
    "name": "sha256",
    "in": "path",
    "required": True,
    "description": "the archive's sha256 (64 lowercase hex digits)",
    "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
}
_ERROR = {
    "description": "error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_SUMMARY = {
    "description": "the job, as `spotwise status --json` prints it",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}},
}
_DENIED = {"401": _ERROR, "404": _ERROR}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "spotwise server",
            "version": "1",
            "description": "Submit and follow spotwise jobs; the server drives them to the end.",
        },
        "components": _components(),
        "security": [{"token": []}],
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "liveness (no token needed)",
                    "security": [],
                    "responses": {"200": {"description": "serving; `driving`: jobs driven"}},
                }
            },
            "/api/v1/openapi.json": {
                "get": {
                    "summary": "this document",
                    "responses": {"200": {"description": "OpenAPI 3.1"}, "401": _ERROR},
                }
            },
            "/api/v1/jobs": {"get": _list_jobs(), "post": _submit_job()},
            **_job_paths(),
            "/api/v1/workdirs/{sha256}": _workdir_path(),
            "/api/v1/jobs/{job_id}/resume": {
                "post": {
                    "summary": "drive the job now (a job another controller let go)",
                    "parameters": [_JOB_ID],
                    "responses": {
                        "202": _SUMMARY,
                        "403": {**_ERROR, "description": "the caller may not change the job"},
                        **_DENIED,
                    },
                }
            },
        },
    }


def _components() -> dict[str, Any]:
    """The bearer-token scheme and the schemas the routes answer with."""
    return {
        "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["error"],
                "properties": {
                    "error": {"type": "string", "description": "what is wrong"},
                    "hint": {"type": "string", "description": "what to do about it"},
                },
            },
            "Job": {
                "type": "object",
                "description": "the `spotwise status --json` document",
                "required": ["id", "name", "state", "attempts"],
                "properties": {
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                    "state": {
                        "enum": [
                            "PENDING",
                            "LAUNCHING",
                            "RUNNING",
                            "PREEMPTED",
                            "RECOVERING",
                            "SUCCEEDED",
                            "FAILED",
                            "CANCELLED",
                        ]
                    },
                    "attempts": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
    }


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """One query parameter of a route (a string unless ``schema`` says otherwise)."""
    return {
        "name": name,
        "in": "query",
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _list_jobs() -> dict[str, Any]:
    """``GET /api/v1/jobs``: a page of the jobs the caller may read."""
    return {
        "summary": "the jobs the caller may read, newest first, a page at a time",
        "parameters": [
            _query(
                "limit",
                "jobs in the page",
                {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": PAGE},
            ),
            _query(
                "cursor",
                "where the page starts: the cursor in the previous page's `Link` header "
                "(none: the newest jobs). Stable while jobs are added or change state.",
            ),
            _query(
                "state",
                "only jobs in these states (comma-separated, e.g. `RUNNING,RECOVERING`)",
            ),
            _query(
                "id_prefix",
                "only jobs whose ids start with this text (compared as text, never as a "
                "pattern): how the CLI resolves an id typed in part",
                {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS},
            ),
        ],
        "responses": {
            "200": {
                "description": "a page of `status --json` documents; when more "
                'follow, a `Link: <URL>; rel="next"` header gives the next page\'s URL',
                "headers": {
                    "Link": {
                        "description": 'the next page: `<URL>; rel="next"`',
                        "schema": {"type": "string"},
                    }
                },
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Job"},
                        }
                    }
                },
            },
            "400": {**_ERROR, "description": "a wrong limit, state, id_prefix or cursor"},
            "401": _ERROR,
        },
    }


def _submit_job() -> dict[str, Any]:
    """``POST /api/v1/jobs``: a job file in, the job as accepted out."""
    return {
        "summary": "submit a job file (checked as `spotwise launch` checks it)",
        "parameters": [
            _query(
                "base_dir",
                "absolute directory (on the server's host) that relative paths in the job "
                "file are resolved against",
            ),
            _query(
                "workdir_sha256",
                "the job's `workdir: pack:PATH`, packed by the client and uploaded first "
                "(PUT /api/v1/workdirs/{sha256}): PATH is then not read on the server's host",
                {"type": "string", "pattern": "^[0-9a-f]{64}$"},
            ),
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
            },
        },
        "responses": {
            "201": {**_SUMMARY, "description": "accepted; the server drives it"},
            "400": {**_ERROR, "description": "not a readable job file"},
            "401": _ERROR,
            "403": {**_ERROR, "description": "the caller may not submit"},
            "422": {**_ERROR, "description": "an invalid job (the field, the fix)"},
        },
    }


def _job_paths() -> dict[str, Any]:
    """One job: its status, logs, metrics and cancel."""
    return {
        "/api/v1/jobs/{job_id}": {
            "get": {
                "summary": "one job",
                "parameters": [_JOB_ID],
                "responses": {"200": _SUMMARY, **_DENIED},
            }
        },
        "/api/v1/jobs/{job_id}/logs": {
            "get": {
                "summary": "the job's output, every attempt in order",
                "parameters": [
                    _JOB_ID,
                    _query("offset", "start at this byte", {"type": "integer", "minimum": 0}),
                    _query(
                        "follow",
                        "1: keep streaming until the job has ended",
                        {"type": "integer", "enum": [0, 1]},
                    ),
                ],
                "responses": {
                    "200": {
                        "description": "text",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    },
                    **_DENIED,
                },
            }
        },
        "/api/v1/jobs/{job_id}/metrics": {
            "get": {
                "summary": "the training's metrics, the goodput ledger and checkpoints",
                "parameters": [_JOB_ID],
                "responses": {"200": {"description": "the dashboard's series"}, **_DENIED},
            }
        },
        "/api/v1/jobs/{job_id}/cancel": {
            "post": {
                "summary": "stop the job (its attempt gets a notice and saves first)",
                "parameters": [_JOB_ID],
                "responses": {
                    "202": {"description": "cancel recorded; the server carries it out"},
                    "403": {**_ERROR, "description": "the caller may not change the job"},
                    **_DENIED,
                },
            }
        },
    }


def _workdir_path() -> dict[str, Any]:
    """A packed workdir: whether the server has it, and its upload."""
    return {
        "get": {
            "summary": "whether the server has this packed workdir (then skip the upload)",
            "parameters": [_SHA256],
            "responses": {
                "200": {"description": "`{sha256, bytes}`: stored"},
                "401": _ERROR,
                "403": {**_ERROR, "description": "the caller may not submit"},
                "404": {**_ERROR, "description": "not uploaded yet"},
            },
        },
        "put": {
            "summary": "upload a packed workdir (the .tar.gz `spotwise launch` packs); "
            "kept only when its sha256 is the URL's and every member would unpack",
            "parameters": [_SHA256],
            "requestBody": {
                "required": True,
                "content": {"application/gzip": {"schema": {"type": "string"}}},
            },
            "responses": {
                "201": {"description": "`{sha256, bytes}`: stored"},
                "200": {"description": "`{sha256, bytes}`: already stored (idempotent)"},
                "401": _ERROR,
                "403": {**_ERROR, "description": "the caller may not submit"},
                "413": {**_ERROR, "description": "over the upload limit"},
                "422": {
                    **_ERROR,
                    "description": "another digest, or not an archive a machine would unpack",
                },
            },
        },
    }
