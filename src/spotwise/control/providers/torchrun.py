"""The command line of one node of a multi-process attempt: torchrun through spotwise's launcher.

Providers that run an attempt on several processes or machines start, on each node,
``python -m spotwise.runtime.launch`` (torch's own launcher, keeping exit code 75) with the
user's command after ``--no-python``, so any command line works, not only a Python script.
One node alone rendezvouses by itself (``--standalone``); several meet through a c10d store
that exactly one of them (``host``) serves, so none depends on torch guessing from host names;
or, where each node knows its rank from its platform (an Indexed Job's completion index), through
torch's static rendezvous at rank 0 (``node_rank``).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence


def launcher_argv(
    argv: Sequence[str],
    *,
    python: str,
    nodes: int,
    procs_per_node: int,
    endpoint: str = "",
    rdzv_id: str = "",
    host: bool | None = None,
    node_rank: str | None = None,
) -> tuple[str, ...]:
    """``python -m spotwise.runtime.launch ... --no-python ARGV`` for one node of ``nodes``.

    ``host``: whether this node serves the rendezvous store (None: torch decides by host name,
    as on a SLURM allocation where every node runs the same line). ``node_rank``: this node's
    rank as the command line gets it (e.g. ``$(JOB_COMPLETION_INDEX)``): static rendezvous,
    rank 0 serves the store at ``endpoint``."""
    head = [python, "-m", "spotwise.runtime.launch", f"--nproc-per-node={procs_per_node}"]
    if nodes == 1:
        head.append("--standalone")
    elif node_rank is not None:
        head += [
            f"--nnodes={nodes}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={endpoint}",
            f"--node-rank={node_rank}",
        ]
    else:
        head += [f"--nnodes={nodes}", "--rdzv-backend=c10d"]
        # (left out, torchrun reads them from PET_RDZV_ENDPOINT / PET_RDZV_ID: a batch script
        # that learns them only on the allocation)
        head += [f"--rdzv-endpoint={endpoint}"] if endpoint else []
        head += [f"--rdzv-id={rdzv_id}"] if rdzv_id else []
        if host is not None:
            head.append(f"--rdzv-conf=is_host={'true' if host else 'false'}")
    return (*head, "--max-restarts=0", "--no-python", *argv)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for the rendezvous store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
