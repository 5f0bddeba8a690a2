"""A loopback Kubernetes API server for the subset spotwise's provider uses.

Namespaces, nodes, secrets, persistent volume claims, services, pods (with ``/log``), events,
batch/v1 jobs and Kueue's workloads, local queues and cluster queues: create, get, list (label
and field selectors), delete, and list+watch from a
``resourceVersion`` as a chunked stream of JSON lines, the way the real API server answers
``?watch=true``. A watch from a version older than the retained history gets the real
``410 Expired`` ERROR event. Deletion is graceful: an object whose owner must stop first (a
running pod) gets ``deletionTimestamp`` and is removed once the cluster side (``cluster.py``)
reports it stopped. Errors are ``kind: Status`` documents with the real codes and reasons, so
the official ``kubernetes`` client raises its own ``ApiException`` with them.

It shares no code with the provider it exercises: it parses selectors, paths and bodies itself.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from spotwise.emulators._server import Hangup, LoopbackServer, Request, Response

Obj = dict[str, Any]

KUEUE = "/apis/kueue.x-k8s.io/v1beta1"
# resource -> (api prefix, kind, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "namespaces": ("/api/v1", "Namespace", False),
    "nodes": ("/api/v1", "Node", False),
    "pods": ("/api/v1", "Pod", True),
    "events": ("/api/v1", "Event", True),
    "secrets": ("/api/v1", "Secret", True),
    "persistentvolumeclaims": ("/api/v1", "PersistentVolumeClaim", True),
    "services": ("/api/v1", "Service", True),
    "jobs": ("/apis/batch/v1", "Job", True),
    "workloads": (KUEUE, "Workload", True),
    "localqueues": (KUEUE, "LocalQueue", True),
    "clusterqueues": (KUEUE, "ClusterQueue", False),
}
_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/batch/v1|/apis/kueue\.x-k8s\.io/v1beta1)/"
    r"(?:namespaces/(?P<ns>[^/]+)/)?"
    r"(?P<res>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>log|status))?$"
)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def rfc3339(when: float | None = None) -> str:
    """Kubernetes timestamps: UTC, second precision, ``Z`` suffix."""
    moment = datetime.fromtimestamp(time.time() if when is None else when, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An answer other than success, as a ``Status`` document."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


class Expired(ApiError):
    def __init__(self, asked: int, oldest: int) -> None:
        super().__init__(410, "Expired", f"too old resource version: {asked} ({oldest})")


def parse_label_selector(text: str) -> list[tuple[str, str, str]]:
    """``a=b,c!=d,e,!f`` -> [(key, op, value)] with op in ``=``, ``!=``, ``exists``, ``!``."""
    terms: list[tuple[str, str, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in raw:
            key, value = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            terms.append((key.strip(), "=", value.strip()))
        elif raw.startswith("!"):
            terms.append((raw[1:].strip(), "!", ""))
        else:
            terms.append((raw, "exists", ""))
    return terms


def _label_match(labels: dict[str, str], terms: list[tuple[str, str, str]]) -> bool:
    for key, op, value in terms:
        have = labels.get(key)
        if (
            (op == "=" and have != value)
            or (op == "!=" and have == value)
            or (op == "exists" and have is None)
            or (op == "!" and have is not None)
        ):
            return False
    return True


def _field_match(obj: Obj, selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        path, sep, value = term.partition("=")
        negate = path.endswith("!")
        path = path.rstrip("!").strip()
        node: Any = obj
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if not sep or ((str(node) if node is not None else "") == value) == negate:
            return False
    return True


class ObjectStore:
    """Objects by resource, namespace and name, with one resourceVersion counter and a bounded
    history of changes for watches. Every method returns copies."""

    def __init__(self, history: int = 5000) -> None:
        self.changed = threading.Condition()
        self._rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {r: {} for r in RESOURCES}
        self._history: deque[tuple[int, str, str, Obj]] = deque(maxlen=history)

    # --- writes -------------------------------------------------------------------------------
    def _record(self, resource: str, kind: str, obj: Obj) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, resource, kind, copy.deepcopy(obj)))
        self.changed.notify_all()
        return copy.deepcopy(obj)

    def create(self, resource: str, namespace: str, obj: Obj) -> Obj:
        _, kind, namespaced = RESOURCES[resource]
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        with self.changed:
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            name = meta.get("name", "")
            if not _NAME.match(name) or len(name) > 253:
                raise ApiError(
                    422,
                    "Invalid",
                    f'{kind} "{name}" is invalid: metadata.name: '
                    "Invalid value: a lowercase RFC 1123 subdomain must consist of "
                    "lower case alphanumeric characters, '-' or '.'",
                )
            if namespaced and ("", namespace) not in self._objects["namespaces"]:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
            key = (namespace if namespaced else "", name)
            if key in self._objects[resource]:
                raise ApiError(
                    409, "AlreadyExists", f'{_qualified(resource)} "{name}" already exists'
                )
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=rfc3339(), generation=1)
            if namespaced:
                meta["namespace"] = namespace
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version(resource))
            self._objects[resource][key] = obj
            return self._record(resource, "ADDED", obj)

    def update(
        self, resource: str, namespace: str, name: str, mutate: Callable[[Obj], None]
    ) -> Obj | None:
        """Apply ``mutate`` to the stored object and publish MODIFIED (None if it is gone)."""
        with self.changed:
            obj = self._objects[resource].get((namespace, name))
            if obj is None:
                return None
            before = copy.deepcopy(obj)
            mutate(obj)
            if obj == before:
                return copy.deepcopy(obj)
            return self._record(resource, "MODIFIED", obj)

    def remove(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.changed:
            obj = self._objects[resource].pop((namespace, name), None)
            return None if obj is None else self._record(resource, "DELETED", obj)

    # --- reads --------------------------------------------------------------------------------
    def get(self, resource: str, namespace: str, name: str) -> Obj | None:
        with self.changed:
            obj = self._objects[resource].get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def select(
        self, resource: str, namespace: str | None = None, labels: str = "", fields: str = ""
    ) -> tuple[list[Obj], int]:
        """Matching objects and the resourceVersion the list is consistent with."""
        terms = parse_label_selector(labels)
        with self.changed:
            items = [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._objects[resource].items())
                if (namespace is None or ns == namespace)
                and _label_match(o["metadata"].get("labels") or {}, terms)
                and _field_match(o, fields)
            ]
            return items, self._rv

    def changes_since(
        self, resource: str, rv: int, namespace: str | None, labels: str, fields: str
    ) -> list[tuple[int, str, Obj]]:
        """Changes after ``rv`` (caller holds ``changed``); ``Expired`` if history is gone."""
        oldest = self._history[0][0] if self._history else self._rv + 1
        if rv + 1 < oldest and rv < self._rv:
            raise Expired(rv, oldest - 1)
        terms = parse_label_selector(labels)
        return [
            (v, kind, copy.deepcopy(o))
            for v, res, kind, o in self._history
            if v > rv
            and res == resource
            and (namespace is None or o["metadata"].get("namespace") == namespace)
            and _label_match(o["metadata"].get("labels") or {}, terms)
            and _field_match(o, fields)
        ]


def api_version(resource: str) -> str:
    """``v1``, ``batch/v1``, ``kueue.x-k8s.io/v1beta1``: the group/version of a resource."""
    prefix = RESOURCES[resource][0]
    return "v1" if prefix == "/api/v1" else prefix.removeprefix("/apis/")


def _qualified(resource: str) -> str:
    """How the API server names a resource in messages: ``pods``, ``jobs.batch``."""
    group = api_version(resource).rpartition("/")[0]
    return f"{resource}.{group}" if group else resource


class KubeApiServer(LoopbackServer):
    """HTTP front of an :class:`ObjectStore`. ``on_delete`` lets the cluster side decide how a
    deletion proceeds (graceful stop of a running pod, dependants of a job)."""

    server_name = "spotwise-kube-api"

    def __init__(
        self,
        store: ObjectStore,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        on_delete: Callable[[str, str, str, Obj], None] | None = None,
        read_log: Callable[[Obj], bytes] | None = None,
        max_watch_s: float = 300.0,
    ) -> None:
        super().__init__(port, host)
        self.store = store
        self.token = token
        self.on_delete = on_delete
        self.read_log = read_log
        self.max_watch_s = max_watch_s
        self.requests: list[tuple[str, str, int]] = []

    def stop(self) -> None:
        self._stopping.set()
        with self.store.changed:
            self.store.changed.notify_all()
        super().stop()

    def serve(self, request: Request) -> Response | Hangup:
        answer = self.answer(
            request.method,
            request.path,
            request.query,
            request.body,
            request.header("Authorization"),
        )
        if callable(answer):
            self.requests.append((request.method, request.target, 200))
            return Response(200, headers={"Content-Type": "application/json"}, stream=answer)
        code, ctype, payload = answer
        self.requests.append((request.method, request.target, code))
        return Response(code, payload, {"Content-Type": ctype})

    # --- request handling ---------------------------------------------------------------------
    def answer(
        self, method: str, path: str, query: dict[str, str], body: bytes, auth: str | None
    ) -> tuple[int, str, bytes] | Callable[[Callable[[bytes], None]], None]:
        """(status, content type, body), or a writer function for a watch stream."""
        try:
            if self.token is not None and auth != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if path.rstrip("/") == "/version" and method == "GET":
                return _ok(
                    {
                        "major": "1",
                        "minor": "31",
                        "gitVersion": "v1.31.0-spotwise",
                        "gitCommit": "0" * 40,
                        "gitTreeState": "clean",
                        "buildDate": "2026-01-01T00:00:00Z",
                        "goVersion": "none",
                        "compiler": "none",
                        "platform": "linux/amd64",
                    }
                )
            match = _PATH.match(path)
            if (
                not match
                or match["res"] not in RESOURCES
                or RESOURCES[match["res"]][0] != match["prefix"]
            ):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            resource, ns, name, sub = match["res"], match["ns"], match["name"], match["sub"]
            namespaced = RESOURCES[resource][2]
            if namespaced != (ns is not None) and not (
                ns is None and name is None and method == "GET"
            ):
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return self._route(method, resource, ns or "", name, sub, query, body)
        except ApiError as exc:
            return exc.code, "application/json", json.dumps(exc.status()).encode()

    def _route(
        self,
        method: str,
        resource: str,
        ns: str,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        body: bytes,
    ) -> Any:
        kind = RESOURCES[resource][1]
        if method == "POST" and name is None:
            doc = _created(resource, kind, body)
            if query.get("dryRun") == "All":
                return _ok(doc, 201)
            return _ok(self.store.create(resource, ns, doc), 201)
        if method == "GET" and name is None:
            if query.get("watch", "").lower() in ("true", "1"):
                return self._watch(resource, ns or None, query)
            items, rv = self.store.select(
                resource, ns or None, query.get("labelSelector", ""), query.get("fieldSelector", "")
            )
            return _ok(
                {
                    "kind": f"{kind}List",
                    "apiVersion": api_version(resource),
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                }
            )
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {resource}")
        obj = self.store.get(resource, ns, name)
        if obj is None:
            raise ApiError(404, "NotFound", f'{_qualified(resource)} "{name}" not found')
        if method == "GET" and sub == "log":
            if self.read_log is None:
                raise ApiError(404, "NotFound", "logs are not kept")
            return 200, "text/plain", self.read_log(obj)
        if method == "GET":
            return _ok(obj)
        if method == "DELETE":
            return self._delete(resource, ns, name, obj, query, body)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {resource}")

    def _delete(
        self, resource: str, ns: str, name: str, obj: Obj, query: dict[str, str], body: bytes
    ) -> Any:
        """A delete with its options (grace period, propagation) from the body or the query;
        the cluster's ``on_delete`` carries it out where one is set (a pod's graceful stop)."""
        options = json.loads(body) if body.strip() else {}
        for key in ("gracePeriodSeconds", "propagationPolicy"):
            if key in query:
                options[key] = int(query[key]) if key == "gracePeriodSeconds" else query[key]
        if self.on_delete is not None:
            self.on_delete(resource, ns, name, options)
        else:
            self.store.remove(resource, ns, name)
        return _ok(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "kind": resource, "uid": obj["metadata"]["uid"]},
            }
        )

    def _watch(
        self, resource: str, ns: str | None, query: dict[str, str]
    ) -> Callable[[Callable[[bytes], None]], None]:
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        timeout = min(float(query.get("timeoutSeconds") or self.max_watch_s), self.max_watch_s)
        asked = query.get("resourceVersion", "")
        with self.store.changed:  # the starting point is fixed when the request arrives
            if asked in ("", "0"):
                items, rv = self.store.select(resource, ns, labels, fields)
                first = [("ADDED", o) for o in items]
            else:  # too old: a 200 stream whose first event is ERROR 410, as the server does
                rv, first = int(asked), []

        def stream(write: Callable[[bytes], None]) -> None:
            nonlocal rv
            for kind, obj in first:
                write(_event(kind, obj))
            deadline = time.monotonic() + timeout
            while not self._stopping.is_set() and time.monotonic() < deadline:
                with self.store.changed:
                    try:
                        changes = self.store.changes_since(resource, rv, ns, labels, fields)
                    except Expired as exc:
                        write(
                            json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n"
                        )
                        return
                    if not changes:
                        self.store.changed.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                        continue
                for version, kind, obj in changes:
                    rv = version
                    write(_event(kind, obj))

        return stream


def _event(kind: str, obj: Obj) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _ok(doc: Obj, code: int = 200) -> tuple[int, str, bytes]:
    return code, "application/json", json.dumps(doc).encode()


def _created(resource: str, kind: str, body: bytes) -> Obj:
    """A create's body as the object to store: JSON of the resource's kind, a Secret's
    write-only ``stringData`` stored base64 in ``data``."""
    try:
        doc = json.loads(body or b"{}")
    except json.JSONDecodeError as exc:
        raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind", kind) != kind:
        raise ApiError(400, "BadRequest", f"the body is not a {kind}")
    if resource == "secrets":
        data = doc.setdefault("data", {})
        for key, value in (doc.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    return doc
