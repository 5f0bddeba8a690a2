"""A Kubernetes cluster on loopback: the API double (``api.py``) plus the cluster behind it
(``cluster.py``), with nodes that look like a managed cluster's spot and on-demand GPU pools and
a kubeconfig the official client (and ``kubectl``) can use.

    emu = KubernetesEmulator(tmp_path, flavour="gke", evict_after_s=[20])
    emu.start()           # writes tmp_path/kubeconfig
    ...                   # KUBECONFIG=tmp_path/kubeconfig spotwise launch job-k8s.yaml
    emu.stop()            # kills every container it started

Node pools per flavour (what the managed services label their nodes with):

- ``gke``: spot nodes ``cloud.google.com/gke-spot=true``; GPU nodes carry GKE's
  ``nvidia.com/gpu=present:NoSchedule`` taint.
- ``eks``: ``eks.amazonaws.com/capacityType=SPOT`` / ``ON_DEMAND``.
- ``aks``: spot nodes ``kubernetes.azure.com/scalesetpriority=spot`` with the matching
  ``NoSchedule`` taint AKS puts on spot pools.
- ``plain``: nodes with no spot label at all (a cluster a spot job cannot use).

``kueue_quota`` installs Kueue (``kueue.py``): a ClusterQueue ``cluster-queue`` with that
quota and a LocalQueue ``kueue_queue`` in the namespace; ``emu.kueue.evict(ns, job)`` preempts
a Job's workload as a higher-priority one would.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import yaml

from spotwise.checkpoint.durable import write_atomic
from spotwise.emulators.kubernetes.api import KubeApiServer, ObjectStore
from spotwise.emulators.kubernetes.cluster import Cluster
from spotwise.emulators.kubernetes.kubelet import GPU, NodeSpec
from spotwise.emulators.kubernetes.kueue import Kueue, queues

FLAVOURS = ("gke", "eks", "aks", "plain")


def pool_nodes(
    flavour: str, *, spot: int = 1, on_demand: int = 1, gpus_per_node: int = 1
) -> list[NodeSpec]:
    """The nodes of a small cluster of ``flavour`` (see the module docstring)."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown flavour {flavour!r}; use one of {', '.join(FLAVOURS)}")
    gpu_taints = (
        [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
        if flavour == "gke" and gpus_per_node
        else []
    )
    nodes = []
    for i in range(spot):
        labels: dict[str, str] = {}
        taints = list(gpu_taints)
        if flavour == "gke":
            labels["cloud.google.com/gke-spot"] = "true"
        elif flavour == "eks":
            labels["eks.amazonaws.com/capacityType"] = "SPOT"
        elif flavour == "aks":
            labels["kubernetes.azure.com/scalesetpriority"] = "spot"
            taints.append(
                {
                    "key": "kubernetes.azure.com/scalesetpriority",
                    "value": "spot",
                    "effect": "NoSchedule",
                }
            )
        nodes.append(NodeSpec(f"{flavour}-spot-{i}", labels, taints, gpus_per_node))
    for i in range(on_demand):
        labels = {"eks.amazonaws.com/capacityType": "ON_DEMAND"} if flavour == "eks" else {}
        nodes.append(NodeSpec(f"{flavour}-ondemand-{i}", labels, list(gpu_taints), gpus_per_node))
    return nodes


class KubernetesEmulator:
    """API server + cluster + kubeconfig under ``state_dir``; bound to 127.0.0.1 by default.

    ``image``: the job's code in the pods' image (default: this process's working directory),
    beside this Python and spotwise; nothing else of this host is in a pod (``machine_root``)."""

    def __init__(
        self,
        state_dir: Path,
        *,
        flavour: str = "gke",
        nodes: list[NodeSpec] | None = None,
        evict_after_s: list[float] | tuple[float, ...] = (),
        evict_mode: str = "shutdown",
        shutdown_grace_s: float | None = None,
        namespace: str = "default",
        volumes: tuple[str, ...] = ("spotwise-checkpoints",),
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        history: int = 5000,
        image: list[Path] | None = None,
        kueue_queue: str = "spotwise",
        kueue_quota: dict[str, str] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.namespace = namespace
        self.volumes = volumes
        self.nodes = nodes if nodes is not None else pool_nodes(flavour)
        self.token = token or secrets.token_urlsafe(24)
        self.store = ObjectStore(history=history)
        self.kueue = Kueue(self.store) if kueue_quota is not None else None
        self._queues = (
            queues("cluster-queue", kueue_queue, namespace, kueue_quota)
            if kueue_quota is not None
            else []
        )
        self.cluster = Cluster(
            self.store,
            state_dir=self.state_dir,
            evict_after_s=list(evict_after_s),
            evict_mode=evict_mode,
            shutdown_grace_s=shutdown_grace_s,
            image=image,
            admission=self.kueue.tick if self.kueue is not None else None,
        )
        self.api = KubeApiServer(
            self.store,
            host=host,
            port=port,
            token=self.token,
            on_delete=self.cluster.delete,
            read_log=self.cluster.read_log,
        )

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def url(self) -> str:
        return self.api.url

    def start(self) -> str:
        """Create the namespace, nodes and volume claims, serve, write the kubeconfig."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for ns in dict.fromkeys(("default", self.namespace)):
            self.store.create(
                "namespaces", "", {"metadata": {"name": ns}, "status": {"phase": "Active"}}
            )
        for node in self.nodes:
            self.store.create("nodes", "", node.manifest())
        for claim in self.volumes:
            self.store.create(
                "persistentvolumeclaims",
                self.namespace,
                {
                    "metadata": {"name": claim},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "10Gi"}},
                    },
                    "status": {"phase": "Bound"},
                },
            )
        for resource, ns, obj in self._queues:
            self.store.create(resource, ns, obj)
        url = self.api.start()
        self.cluster.start()
        self._write_kubeconfig(url)
        return url

    def stop(self) -> None:
        self.cluster.stop()
        self.api.stop()

    def __enter__(self) -> KubernetesEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_kubeconfig(self, url: str) -> None:
        name = "spotwise-emulated"
        doc: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": name,
            "clusters": [{"name": name, "cluster": {"server": url}}],
            "users": [{"name": name, "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": name,
                    "context": {"cluster": name, "user": name, "namespace": self.namespace},
                }
            ],
        }
        write_atomic(self.kubeconfig, yaml.safe_dump(doc, sort_keys=False).encode(), mode=0o600)

    def leftovers(self) -> dict[str, list[str]]:
        """Jobs and pods still present, and containers still running (all empty when clean)."""
        jobs, _ = self.store.select("jobs")
        pods, _ = self.store.select("pods")
        return {
            "jobs": [j["metadata"]["name"] for j in jobs],
            "pods": [p["metadata"]["name"] for p in pods],
            "processes": self.cluster.running(),
        }


__all__ = ["FLAVOURS", "KubernetesEmulator", "NodeSpec", "pool_nodes"]
