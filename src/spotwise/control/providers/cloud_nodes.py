"""Multi-node attempts on cloud VMs (``aws``, ``gcp``, ``azure``): what they do the same way.

An attempt of ``nodes: N`` is N machines started as one *launch* (a fresh id, in each machine's
tag or label, in its name and in where it reports: ``attempts/<n>/<launch>/node-<k>``), so the
record of a node rolled back by all-or-nothing is never read as the next launch's. Rank 0 is
started first and its private address goes into the others' rendezvous endpoint; a failure to
start any node (no capacity) stops the ones already up. The attempt's handle lists its nodes;
their statuses fold as on ``sim`` (:func:`~spotwise.control.providers.process.group_status`):
the loss of any node ends the attempt and the others are stopped (their ranks save, exit 75).
A restarted controller finds the machines by tag and groups them back into launches here;
a launch whose every node is shutting down is never adopted (a rollback, or an attempt over).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from spotwise.control.providers.base import (
    AttemptStatus,
    Handle,
    LaunchRequest,
    Phase,
    attempt_key,
)
from spotwise.control.providers.process import group_status
from spotwise.control.providers.torchrun import free_port, launcher_argv

# a node's entry in its attempt's handle: the provider's id of the machine, or its own keys
Node = str | Mapping[str, Any]


def node_uri(attempt_uri: str, node: tuple[str, int] | None) -> str:
    """Where the node ``(launch, rank)`` of an attempt reports (the attempt's own without one)."""
    return attempt_uri if node is None else f"{attempt_uri}/{node[0]}/node-{node[1]}"


def node_of(handle: Handle) -> tuple[str, int] | None:
    """``(launch, rank)`` of a node's handle, None for a single machine's."""
    return (handle["launch"], handle["node"]) if "node" in handle else None


def node_request(req: LaunchRequest, python: str, node: int, endpoint: str) -> LaunchRequest:
    """The request one machine runs: the command under torch's launcher (its rank ``node``,
    serving the rendezvous store if it is rank 0) when the attempt has several processes."""
    if req.nodes * req.procs_per_node == 1:
        return req
    first, *rest = req.argv
    command = (python if first in ("python", "python3") else first, *rest)
    argv = launcher_argv(
        command,
        python=python,
        nodes=req.nodes,
        procs_per_node=req.procs_per_node,
        endpoint=endpoint,
        rdzv_id=req.key,
        host=node == 0 if req.nodes > 1 else None,
    )
    return replace(req, argv=argv)


def start_nodes(
    req: LaunchRequest,
    start: Callable[[int, str, str], tuple[Node, str]],
    stop: Callable[[Handle], None],
) -> Handle:
    """Start the attempt's ``req.nodes`` machines as one launch: ``start(rank, endpoint,
    launch)`` -> (the node's entry, its private address). Rank 0 first (its address is the
    others' endpoint); all or none: any failure stops the nodes already started (``stop`` of
    each one's keys), then raises.
    -> the handle's multi-node part (``id``, ``nodes``, ``port``, ``launch``)."""
    # the rendezvous port: any works on a fresh machine (the job's network rule allows TCP
    # between its nodes); one free here keeps attempts apart on a double's shared loopback
    port, rank0 = free_port(), "localhost"  # (rank 0 serves the store: itself)
    launch = secrets.token_hex(4)
    started: list[Node] = []
    try:
        for k in range(req.nodes):
            entry, address = start(k, f"{rank0}:{port}", launch)
            started.append(entry)
            if k == 0:
                rank0 = address
    except BaseException:
        for entry in started:
            stop(_keys(entry))
        raise
    return {"id": f"{req.key}-{launch}", "nodes": started, "port": port, "launch": launch}


def node_handles(handle: Handle) -> list[Handle | None]:
    """One single-machine handle per node of a multi-node attempt (None: never started)."""
    rest = {k: v for k, v in handle.items() if k not in ("nodes", "id")}
    return [
        None if entry is None else {**rest, **_keys(entry), "node": k}
        for k, entry in enumerate(handle["nodes"])
    ]


def _keys(entry: Node) -> dict[str, Any]:
    return {"id": entry} if isinstance(entry, str) else dict(entry)


def nodes_status(
    handle: Handle,
    status: Callable[[Handle], AttemptStatus],
    terminate: Callable[[Handle], None],
    settle_s: float,
) -> AttemptStatus:
    """The nodes' statuses folded as on ``sim``: one lost or failed ends the attempt and the
    others are stopped (their ranks save on the shutdown's SIGTERM, exit 75)."""
    nodes = node_handles(handle)
    statuses = [
        AttemptStatus(Phase.LOST, detail=f"node {k} was never launched") if h is None else status(h)
        for k, h in enumerate(nodes)
    ]
    folded, stop_rest = group_status(statuses, now=time.time(), settle_s=settle_s)
    if stop_rest:
        for h, st in zip(nodes, statuses, strict=True):
            if h is not None and st.phase in (Phase.STARTING, Phase.RUNNING):
                terminate(h)
    return folded


def terminate_nodes(handle: Handle, terminate: Callable[[Handle], None]) -> None:
    for node in node_handles(handle):
        if node is not None:
            terminate(node)


@dataclass(frozen=True)
class FoundNode:
    """A machine of a multi-node launch as ``find`` lists it (from its tags or labels)."""

    handle: Handle  # as a single machine's (``n``, ``job``, zone, log ...)
    entry: Node  # its entry in the attempt's ``nodes``
    rank: int
    nodes: int
    launch: str
    ending: bool  # being shut down or deleted


def launches(found: Iterable[FoundNode]) -> list[Handle]:
    """Found nodes grouped into their launches' handles (as ``start_nodes`` made them), less
    those whose every node is ending: an all-or-nothing rollback (the attempt's next launch is
    elsewhere) or an attempt already over, neither to adopt nor to sweep."""
    groups: dict[tuple[int, str], Handle] = {}
    up: set[tuple[int, str]] = set()
    for f in found:
        key = (int(f.handle["n"]), f.launch)
        group = groups.setdefault(
            key,
            {
                **f.handle,
                "id": f"{attempt_key(f.handle['job'], key[0])}-{f.launch}",
                "nodes": [None] * f.nodes,
                "launch": f.launch,
            },
        )
        group["nodes"][f.rank] = f.entry
        if not f.ending:
            up.add(key)
    return [group for key, group in groups.items() if key in up]
