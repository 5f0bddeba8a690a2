"""``spotwise emulate kubernetes``: a loopback Kubernetes cluster to rehearse a job file on.

It writes a kubeconfig (0600, a random token) for the official client and the ``kubernetes``
provider, runs pods as local processes and evicts them on a schedule the way a spot node is
reclaimed, so ``spotwise launch job-k8s.yaml`` can be tried before paying for a node; with
``--kueue-quota`` it also runs a minimal Kueue (one ClusterQueue, one LocalQueue).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from spotwise.errors import ConfigError

if TYPE_CHECKING:
    from spotwise.emulators.kubernetes import KubernetesEmulator


_EVICT_AFTER_OPTION = typer.Option(
    [],
    "--evict-after",
    help="Evict the k-th pod to start after this many seconds of "
    "running (repeat for the next pods).",
)
_EVICT_MODE_OPTION = typer.Option(
    "shutdown",
    help="shutdown (graceful node shutdown, the pod stays Failed) or delete "
    "(the node vanishes, the pod object is removed).",
)
_KUEUE_QUOTA_OPTION = typer.Option(
    [],
    "--kueue-quota",
    help="Install Kueue with this ClusterQueue quota, RESOURCE=QUANTITY (repeatable, e.g. "
    "cpu=4 nvidia.com/gpu=2).",
)


def kubernetes(
    state_dir: Path = typer.Option(
        Path("spotwise-k8s"), "--dir", help="Where the kubeconfig, pod logs and volumes go."
    ),
    flavour: str = typer.Option("gke", help="Node labels of: gke, eks, aks or plain (no spot)."),
    spot_nodes: int = typer.Option(1, min=0, help="Spot GPU nodes."),
    on_demand_nodes: int = typer.Option(1, min=0, help="On-demand GPU nodes."),
    gpus: int = typer.Option(1, min=0, help="nvidia.com/gpu per node (0: a cluster without GPUs)."),
    evict_after: list[float] = _EVICT_AFTER_OPTION,
    evict_mode: str = _EVICT_MODE_OPTION,
    shutdown_grace: float = typer.Option(
        None, help="Cap on the grace an evicted pod gets (default: its own grace period)."
    ),
    namespace: str = typer.Option("default", help="Namespace to create besides default."),
    pvc: list[str] = typer.Option(
        ["spotwise-checkpoints"], "--pvc", help="PersistentVolumeClaims to create (repeatable)."
    ),
    kueue_quota: list[str] = _KUEUE_QUOTA_OPTION,
    kueue_queue: str = typer.Option("spotwise", help="The Kueue LocalQueue's name."),
    port: int = typer.Option(0, help="Port to listen on (0: any free port)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    duration: float = typer.Option(None, help="Stop after this many seconds."),
) -> None:
    """Emulate a Kubernetes cluster with a spot GPU pool (API subset, pods as processes)."""
    from spotwise.cli._emulate_serve import listen
    from spotwise.emulators.kubernetes import KubernetesEmulator, pool_nodes

    quota = _quota(kueue_quota)
    try:
        nodes = pool_nodes(flavour, spot=spot_nodes, on_demand=on_demand_nodes, gpus_per_node=gpus)
        emu = KubernetesEmulator(
            state_dir,
            nodes=nodes,
            evict_after_s=evict_after,
            evict_mode=evict_mode,
            shutdown_grace_s=shutdown_grace,
            namespace=namespace,
            volumes=tuple(pvc),
            host=host,
            port=port,
            kueue_queue=kueue_queue,
            kueue_quota=quota or None,
        )
    except ValueError as exc:
        raise ConfigError(str(exc), hint="see spotwise emulate kubernetes --help") from None
    url = listen(emu, host, port)
    typer.echo(f"kubernetes API emulator listening on {url}")
    typer.echo(f"export KUBECONFIG={emu.kubeconfig.resolve()}")
    if quota:
        typer.echo(f"kueue: LocalQueue {kueue_queue} -> ClusterQueue cluster-queue {quota}")
    _report_evictions(emu, duration)


def _quota(items: list[str]) -> dict[str, str]:
    """``--kueue-quota RESOURCE=QUANTITY`` options as the ClusterQueue's quota."""
    from spotwise.emulators.kubernetes.kueue import quantity

    quota: dict[str, str] = {}
    for item in items:
        resource, _, amount = item.partition("=")
        try:
            quantity(amount)
        except ValueError:
            raise ConfigError(
                f"--kueue-quota {item!r}: expected RESOURCE=QUANTITY",
                hint="e.g. --kueue-quota cpu=4 --kueue-quota nvidia.com/gpu=2",
            ) from None
        quota[resource] = amount
    return quota


def _report_evictions(emu: KubernetesEmulator, duration: float | None) -> None:
    """Print each eviction as it happens until ``duration`` (or Ctrl-C); then stop the cluster."""
    reported = 0
    started = time.monotonic()
    try:
        while duration is None or time.monotonic() - started < duration:
            for name in emu.cluster.evictions[reported:]:
                typer.echo(f"evicted pod {name} at t+{time.monotonic() - started:.1f}s")
            reported = len(emu.cluster.evictions)
            time.sleep(0.2)
    except KeyboardInterrupt:
        typer.echo("stopping")
    finally:
        emu.stop()
