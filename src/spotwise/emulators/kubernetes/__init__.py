"""A Kubernetes cluster on loopback, one module per role:

- ``api.py``: the object store and the API server the official client talks to;
- ``cluster.py``: the loop behind it, one pass of every role below at a time;
- ``jobs.py``: the Job controller; ``scheduler.py``: binds pods to nodes;
- ``kubelet.py``: runs bound pods as local processes and evicts them like spot nodes;
- ``kueue.py``: Kueue's Workloads and quota admission;
- ``status.py``: the conditions and Events every role writes;
- ``emulator.py``: all of it with spot and on-demand node pools and a kubeconfig.
"""

from spotwise.emulators.kubernetes.emulator import FLAVOURS, KubernetesEmulator, pool_nodes
from spotwise.emulators.kubernetes.kubelet import NodeSpec

__all__ = ["FLAVOURS", "KubernetesEmulator", "NodeSpec", "pool_nodes"]
