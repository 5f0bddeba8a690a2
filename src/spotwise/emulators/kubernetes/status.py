"""How the emulated control plane reports: conditions on an object's status and Events
about it (what ``kubectl describe`` shows); every role of the cluster writes both."""

from __future__ import annotations

from spotwise.emulators.kubernetes.api import Obj, ObjectStore, rfc3339


def set_condition(obj: Obj, ctype: str, status: str, reason: str, message: str = "") -> None:
    conds = [c for c in obj.setdefault("status", {}).get("conditions") or [] if c["type"] != ctype]
    conds.append(
        {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": rfc3339(),
        }
    )
    obj["status"]["conditions"] = conds


def has_condition(obj: Obj, ctype: str) -> bool:
    return any(
        c["type"] == ctype and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def record_event(
    store: ObjectStore,
    obj: Obj,
    reason: str,
    message: str,
    warning: bool = False,
    *,
    component: str = "spotwise-emulated-cluster",
) -> None:
    meta = obj["metadata"]
    ns = meta.get("namespace", "default")
    now = rfc3339()
    store.create(
        "events",
        ns,
        {
            "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {
                "kind": obj.get("kind", "Pod"),
                "name": meta["name"],
                "namespace": ns,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": component},
        },
    )
