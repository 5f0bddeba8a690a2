"""The Kubernetes ``Job`` one attempt runs as: a pure function of the provider's options and the
attempt, so ``launch --dry-run`` prints exactly what ``launch`` creates.

Why each part is there:

- ``backoffLimit: 0`` + ``podFailurePolicy`` FailJob on exit 75 and on ``DisruptionTarget``: a
  preempted or interrupted attempt ends the Job at once, so Kubernetes never retries behind the
  controller's back (the controller decides where the next attempt goes and what it costs).
  ``podReplacementPolicy: Failed`` keeps a second pod from starting while the first still saves.
  Several nodes: ``backoffLimitPerIndex: 0`` and FailIndex instead, so a pod's end fails its index
  only and the other pods, saving through the runtime's agreement, end by themselves (the
  provider stops any still up after the grace).
- ``nvidia.com/gpu`` in requests and limits (extended resources must be equal in both), plus a
  toleration of the ``nvidia.com/gpu`` taint GPU node pools carry.
- Spot placement per managed-cluster flavour: the label the service puts on spot nodes, and for
  AKS the toleration of the taint it puts on spot pools; on-demand attempts keep off spot nodes.
- ``terminationGracePeriodSeconds`` = the notice budget, the time SIGTERM -> SIGKILL the
  training process gets to save (``SPOTWISE_GRACE_S`` tells the runtime the same number).
- Checkpoints on a PVC mounted at ``checkpoint_mount`` (one sub-directory per job), or an
  ``s3://`` run directory; credentials only as ``secretKeyRef`` references, never values.
- ``automountServiceAccountToken: false``: the training process needs no Kubernetes API access.
- Several nodes: an Indexed Job (``completionMode: Indexed``, ``parallelism = completions =
  nodes``) whose pods are ``<job>-<index>`` in the ``subdomain`` of a headless Service of the
  same name, so rank 0 is ``<job>-0.<job>`` in DNS; each pod runs torch's launcher with its
  completion index as node rank (static rendezvous at rank 0: no rank depends on start order).
- Kueue: the LocalQueue's ``kueue.x-k8s.io/queue-name`` label and ``suspend: true``; Kueue
  unsuspends the Job when it admits the workload, and suspends it again to evict it.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from spotwise.control.providers.base import Options
from spotwise.exitcode import EXIT_INTERRUPTED

GPU = "nvidia.com/gpu"
CONTAINER = "train"
LABEL_JOB = "spotwise.dev/job"
LABEL_ATTEMPT = "spotwise.dev/attempt"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by the Job controller in each pod of an Indexed Job
Flavour = Literal["gke", "eks", "aks"]

# flavour -> (spot node label, its value, whether spot pools carry a taint of that label)
SPOT_LABELS: dict[str, tuple[str, str, bool]] = {
    "gke": ("cloud.google.com/gke-spot", "true", False),
    "eks": ("eks.amazonaws.com/capacityType", "SPOT", False),
    "aks": ("kubernetes.azure.com/scalesetpriority", "spot", True),
}
# seconds from notice to SIGKILL a pod can count on: GKE gives non-system pods 15 s of the
# 30 s Spot shutdown; EKS has the 2-minute spot notice (drained by the node termination
# handler or Karpenter); AKS Scheduled Events announce spot eviction 30 s ahead.
DEFAULT_GRACE_S = {"gke": 15.0, "eks": 110.0, "aks": 25.0, None: 30.0}


class KueueOptions(Options):
    """``provider.options.kueue``: submit through a Kueue LocalQueue of the namespace."""

    queue: str = Field(min_length=1, max_length=63)

    @field_validator("queue")
    @classmethod
    def _queue(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", v):
            raise ValueError(
                f"{v!r} is not a LocalQueue name (lower case letters, digits and '-'); "
                "`kubectl get localqueues` lists the namespace's queues"
            )
        return v


class KubernetesOptions(Options):
    """``provider.options`` of a Kubernetes job (docs/control.md lists them)."""

    image: str = Field(min_length=1)
    flavour: Flavour | None = None  # where spot nodes are labelled the managed service's way
    namespace: str | None = None  # default: the kubeconfig context's, else "default"
    kubeconfig: str | None = None  # default: $KUBECONFIG, ~/.kube/config, or in-cluster
    context: str | None = None
    working_dir: str | None = None  # in the image; default: the job's workdir
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    checkpoint_pvc: str | None = None  # PVC holding the checkpoints (or an s3:// checkpoint_dir)
    checkpoint_mount: str = "/checkpoints"
    secret_env: dict[str, str] = Field(default_factory=dict)  # NAME: secret-name/key
    service_account: str | None = None
    image_pull_secrets: list[str] = Field(default_factory=list)
    memory: str | None = None  # e.g. 16Gi
    grace_s: float | None = Field(default=None, gt=0, le=3600)
    usd_per_hour: float = Field(default=0.0, ge=0)  # spot price of one node (for the budget)
    ondemand_usd_per_hour: float | None = Field(default=None, ge=0)
    poll_s: float = Field(default=1.0, gt=0, le=60)
    check_nodes: bool = True  # refuse before launch if no node can run the job
    kueue: KueueOptions | None = None  # queue attempts through Kueue (admission = queueing)
    rendezvous_port: int = Field(default=29500, ge=1024, le=65535)  # rank 0's c10d store
    # how long a multi-node attempt may wait for all its pods to be placed before it is "no
    # capacity" (all or nothing: pods of a half-placed attempt would hold nodes and do nothing)
    capacity_wait_s: float = Field(default=60.0, ge=0, le=3600)

    @field_validator("secret_env")
    @classmethod
    def _refs(cls, v: dict[str, str]) -> dict[str, str]:
        for name, ref in v.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if not re.fullmatch(r"[a-z0-9][-a-z0-9.]*/[-._a-zA-Z0-9]+", ref):
                raise ValueError(
                    f"{name}: {ref!r} is not a secret reference; write "
                    "secret-name/key (the value stays in the cluster's Secret)"
                )
        return v

    @field_validator("kueue", mode="before")
    @classmethod
    def _kueue(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, dict):
            raise ValueError(f"write kueue: {{queue: NAME}} with the LocalQueue's name, not {v!r}")
        return v

    @field_validator("checkpoint_mount")
    @classmethod
    def _mount(cls, v: str) -> str:
        if not v.startswith("/") or v.rstrip("/") == "":
            raise ValueError("checkpoint_mount must be an absolute path other than /")
        return v.rstrip("/")

    @property
    def grace(self) -> float:
        return self.grace_s if self.grace_s is not None else DEFAULT_GRACE_S[self.flavour]


def dns_name(text: str, nodes: int = 1) -> str:
    """A Kubernetes object name (RFC 1123 label) from a spotwise key: <= 63 characters, and
    short enough that ``<name>-<index>`` of each of ``nodes`` pods is a host name too."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    room = 63 - (len(f"-{nodes - 1}") if nodes > 1 else 0)
    return name[:room].rstrip("-") or "spotwise"


def placement(opts: KubernetesOptions, market: str) -> dict[str, Any]:
    """nodeSelector / affinity / tolerations of the pod for ``market`` ("spot"|"on-demand")."""
    selector = dict(opts.node_selector)
    tolerations = [dict(t) for t in opts.tolerations]
    spec: dict[str, Any] = {}
    if opts.flavour is not None:
        key, value, tainted = SPOT_LABELS[opts.flavour]
        if market == "spot":
            selector[key] = value
            if tainted:
                tolerations.append(
                    {"key": key, "operator": "Equal", "value": value, "effect": "NoSchedule"}
                )
        else:
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": key, "operator": "NotIn", "values": [value]}
                                ]
                            }
                        ]
                    }
                }
            }
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    return spec


def job_manifest(
    opts: KubernetesOptions,
    *,
    name: str,
    namespace: str,
    job_id: str,
    n: int,
    argv: list[str],
    env: dict[str, str],
    workdir: str | None,
    market: str,
    gpu_count: int,
    cpus: int,
    nodes: int = 1,
) -> dict[str, Any]:
    """The ``batch/v1`` Job of attempt ``n`` (plain data, kubectl-compatible). ``workdir``:
    the container's working directory, unless ``working_dir`` says; None for none. With
    ``nodes`` > 1 an Indexed Job of that many pods in the subdomain of :func:`service`."""
    labels = attempt_labels(job_id, n)
    pod = _pod(
        opts,
        market,
        gpu_count,
        _container(opts, argv, env, workdir, _resources(opts, cpus, gpu_count)),
    )
    spec: dict[str, Any] = {}
    # no retry by Kubernetes; one pod: its end is the Job's. Several: a pod's end fails its
    # index only, never retried, and the Job ends when every index has: the other pods are
    # saving (the runtime's agreement) and must not be killed by the Job failing at once
    limits: dict[str, int] = {"backoffLimit": 0}
    action = "FailJob"
    if nodes > 1:
        spec.update(completionMode="Indexed", completions=nodes, parallelism=nodes)
        pod["subdomain"] = name  # the headless Service: <name>-<index>.<name> in DNS
        limits, action = {"backoffLimitPerIndex": 0}, "FailIndex"
    job_labels = dict(labels)
    if opts.kueue is not None:
        job_labels[LABEL_QUEUE] = opts.kueue.queue
        spec["suspend"] = True  # until Kueue admits the workload
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": job_labels},
        "spec": {
            **spec,
            **limits,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": _failure_policy(action),
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
        },
    }


def _pod(
    opts: KubernetesOptions, market: str, gpu_count: int, container: dict[str, Any]
) -> dict[str, Any]:
    """The attempt's pod: never restarted in place, placed on the market's nodes (and GPU
    nodes' taint tolerated), the checkpoint volume, the service account and pull secrets."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": round(opts.grace),
        "automountServiceAccountToken": False,
        **placement(opts, market),
    }
    if gpu_count:
        pod.setdefault("tolerations", []).append(
            {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
        )
    if opts.checkpoint_pvc:
        pod["volumes"] = [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": opts.checkpoint_pvc}}
        ]
    pod["containers"] = [container]
    if opts.service_account:
        pod["serviceAccountName"] = opts.service_account
    if opts.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    return pod


def _resources(opts: KubernetesOptions, cpus: int, gpu_count: int) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": str(cpus)}}
    if opts.memory:
        resources["requests"]["memory"] = opts.memory
        resources["limits"] = {"memory": opts.memory}
    if gpu_count:
        resources["requests"][GPU] = str(gpu_count)
        resources.setdefault("limits", {})[GPU] = str(gpu_count)
    return resources


def _container(
    opts: KubernetesOptions,
    argv: list[str],
    env: dict[str, str],
    workdir: str | None,
    resources: dict[str, Any],
) -> dict[str, Any]:
    """The attempt's one container: the command, its environment (values, then the secrets'
    references), resources, working directory and the checkpoint volume's mount."""
    env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    for var, ref in sorted(opts.secret_env.items()):
        secret, key = ref.split("/", 1)
        env_list.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": opts.image,
        "command": list(argv),
        "env": env_list,
        "resources": resources,
    }
    if workdir is not None:  # (None: the command unpacks the job's code and enters it)
        container["workingDir"] = opts.working_dir or workdir
    if opts.checkpoint_pvc:
        container["volumeMounts"] = [{"name": "checkpoints", "mountPath": opts.checkpoint_mount}]
    return container


def _failure_policy(action: str) -> dict[str, Any]:
    """``action`` (fail the Job, or one index) on exit 75 and on a disruption of the pod."""
    return {
        "rules": [
            {
                "action": action,
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [EXIT_INTERRUPTED],
                },
            },
            {
                "action": action,
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def attempt_labels(job_id: str, n: int) -> dict[str, str]:
    """What every object of attempt ``n`` carries: how ``find`` gets them back after a crash."""
    return {"app.kubernetes.io/managed-by": "spotwise", LABEL_JOB: job_id, LABEL_ATTEMPT: str(n)}


def rendezvous_host(name: str) -> str:
    """Rank 0's DNS name in a multi-node attempt: pod ``<name>-0`` in the subdomain of the
    Service ``<name>`` (the pod's DNS search path adds the namespace)."""
    return f"{name}-0.{name}"


def service(
    opts: KubernetesOptions, *, name: str, namespace: str, job_id: str, n: int
) -> dict[str, Any]:
    """The headless Service of a multi-node attempt: DNS records for its pods (ready or not, so
    the ranks find rank 0 while they start), no virtual IP, no load balancing."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": attempt_labels(job_id, n)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: job_id, LABEL_ATTEMPT: str(n)},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": opts.rendezvous_port,
                    "targetPort": opts.rendezvous_port,
                    "protocol": "TCP",
                }
            ],
        },
    }
