"""What moto's EC2 lacks for multi-node attempts, added to the moto of this process.

- **Placement groups.** moto 5 has none: ``CreatePlacementGroup``, ``DescribePlacementGroups``
  (``GroupNames``, ``group-name`` and ``tag:`` filters) and ``DeletePlacementGroup`` answer as
  EC2 does (``InvalidPlacementGroup.Duplicate`` / ``.Unknown`` / ``.InUse`` while an instance
  not yet terminated is in it), and ``RunInstances`` with ``Placement.GroupName`` refuses an
  unknown group and records it on the instance (``DescribeInstances`` shows it).
- **The loopback network.** Every instance's machine is a process of this host and shares its
  network, so every instance's private address is 127.0.0.1: a node that connects to another
  node's private address reaches it. Unlike a VPC, two machines cannot listen on one port, so a
  multi-node attempt's rendezvous port must differ per attempt (the aws provider picks a free
  one).

``install()`` patches moto's EC2 request handler in this process (the data plane runs in the
moto server's process); it is idempotent and changes nothing else of moto.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

LOOPBACK = "127.0.0.1"
STRATEGIES = ("cluster", "spread", "partition")
_groups: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}  # (account, region) -> name -> group
_lock = threading.Lock()
_installed: list[bool] = []


def install() -> None:
    """Add placement groups and the loopback network to moto's EC2 (once per process)."""
    with _lock:
        if _installed:
            return
        from moto.ec2.responses import EC2Response

        run_instances = EC2Response.run_instances

        def run_in_group(self: Any) -> Any:
            name = self._get_param("Placement.GroupName") or ""
            if name:
                _group(self, name)  # an unknown group: refused before anything runs
            result = run_instances(self)
            reservation: Any = result._result  # (before it is sent)
            for instance in reservation.instances:
                instance.placement.group_name = name
                instance.nics[0].private_ip_address = LOOPBACK
            return result

        EC2Response.run_instances = run_in_group  # type: ignore[method-assign]
        EC2Response.create_placement_group = _create  # type: ignore[attr-defined]
        EC2Response.describe_placement_groups = _describe  # type: ignore[attr-defined]
        EC2Response.delete_placement_group = _delete  # type: ignore[attr-defined]
        _installed.append(True)


def _error(code: str, message: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(code, message)


def _books(self: Any) -> dict[str, dict[str, Any]]:
    return _groups.setdefault((self.current_account, self.region), {})


def _group(self: Any, name: str) -> dict[str, Any]:
    group = _books(self).get(name)
    if group is None:
        raise _error("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
    return group


def _create(self: Any) -> Any:
    from moto.core.responses import ActionResult

    name = self._get_param("GroupName")
    strategy = self._get_param("Strategy") or "cluster"
    if not name:
        raise _error("MissingParameter", "The request must contain the parameter groupName")
    if strategy not in STRATEGIES:
        raise _error("InvalidParameterValue", f"Invalid value '{strategy}' for strategy")
    tags = self._parse_tag_specification("placement-group").get("placement-group", {})
    self.error_on_dryrun()
    with _lock:
        books = _books(self)
        if name in books:
            raise _error(
                "InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists."
            )
        books[name] = group = {
            "GroupName": name,
            "GroupId": f"pg-{uuid.uuid4().hex[:17]}",
            "Strategy": strategy,
            "State": "available",
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        }
    return ActionResult({"PlacementGroup": group})


def _describe(self: Any) -> Any:
    from moto.core.responses import ActionResult

    names = self._get_param("GroupNames", [])
    filters: dict[str, list[str]] = self._filters_from_querystring() or {}
    books = _books(self)
    for name in names:
        _group(self, name)
    found = [g for n, g in sorted(books.items()) if not names or n in names]
    for key, values in filters.items():
        if key == "group-name":
            found = [g for g in found if g["GroupName"] in values]
        elif key == "strategy":
            found = [g for g in found if g["Strategy"] in values]
        elif key.startswith("tag:"):
            found = [
                g
                for g in found
                if any(t["Key"] == key[4:] and t["Value"] in values for t in g["Tags"])
            ]
        else:
            raise _error("InvalidParameterValue", f"The filter '{key}' is invalid")
    return ActionResult({"PlacementGroups": found})


def _delete(self: Any) -> Any:
    from moto.core.responses import ActionResult

    name = self._get_param("GroupName")
    self.error_on_dryrun()
    with _lock:
        _group(self, name)
        used = [
            i.id
            for i in self.ec2_backend.all_instances()
            if i.placement.group_name == name and i.state != "terminated"
        ]
        if used:
            raise _error(
                "InvalidPlacementGroup.InUse",
                f"The placement group '{name}' is in use by {', '.join(used)} "
                "and may not be deleted.",
            )
        del _books(self)[name]
    return ActionResult({})
