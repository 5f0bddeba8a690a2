"""The cluster behind the loopback API server: scheduler, Job controller and a kubelet whose
containers are local processes.

- Scheduler: binds a pending pod to a node whose labels satisfy its ``nodeSelector`` and
  required node affinity, whose taints it tolerates, and whose free ``nvidia.com/gpu`` covers its
  limits; otherwise the pod stays Pending with ``PodScheduled=False/Unschedulable`` and a
  ``FailedScheduling`` event saying why, as the real scheduler does.
- Job controller: one pod per Job, or with ``completionMode: Indexed`` one pod per completion
  index (``parallelism`` at a time; ``backoffLimitPerIndex`` 0: a failed index is never retried,
  ``failedIndexes``, and the Job fails once every index has ended), each with its index in the
  ``batch.kubernetes.io/job-completion-index`` label and annotation, ``JOB_COMPLETION_INDEX`` in
  its env and ``<job>-<index>`` as host name), ``backoffLimit`` and ``podFailurePolicy``
  (``onExitCodes``, ``onPodConditions``; FailJob / FailIndex / Ignore / Count), Complete / Failed
  conditions (a failed Job's other pods are terminated with their grace period), ``suspend`` (a
  suspended Job's pods are terminated, not counted as failures; ``Suspended`` condition;
  resuming starts them again), and deletion with the batch API's propagation policies (the API
  default for Jobs is ``Orphan``: pods survive).
- Gang placement: the pods of an Indexed Job with ``parallelism`` > 1 are bound together or not
  at all (as Kueue's all-or-nothing admission or a gang scheduler places them; the default
  scheduler would place them one by one), with GPU and CPU capacity counted per node.
- Cluster DNS and network of a headless Service (``clusterIP: None``): every pod runs on this
  host's loopback, so a pod's name in the Service's subdomain (``<hostname>.<service>``, with
  or without ``.<namespace>.svc.cluster.local``) is 127.0.0.1, and each port the Service
  declares is given a free port of its own on 127.0.0.1 (two attempts' ``:29500`` would
  collide on one host). The kubelet writes both into the container's command and env values
  where the name appears (``<name>:<port>`` -> ``127.0.0.1:<its port>``): no resolver is
  involved, so a name the program builds itself from parts does not resolve.
- Kubelet: runs the container's ``command`` + ``args`` (``$(VAR)`` expanded) as a local process
  in its own process group and its own root directory (``machine_root``) with the container's
  ``env`` (values, secret and field references), ``workingDir`` and stdout/stderr kept for
  ``/log``. The image is not pulled: the "image" is this machine's Python, spotwise and the
  job's code (``image``), as copy-on-write layers; a PVC volume is a host directory mounted at
  its ``mountPath``; whatever else the pod writes is gone with it. Where no mount namespace can
  be made (not root), the pod gets a fresh HOME on the host and paths under a ``mountPath``
  are rewritten to the volume's host directory.
- Evictions on a schedule, the way a spot node is reclaimed: the pod gets the
  ``DisruptionTarget`` condition, SIGTERM to its process group, SIGKILL after its grace period,
  then phase Failed (``shutdown``: graceful node shutdown, the pod object stays) or, in
  ``delete`` mode, the pod object is removed too (the node vanished and PodGC deleted it).
"""

from __future__ import annotations

import base64
import copy
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spotwise.emulators import machine_root
from spotwise.emulators.kube_api import Obj, ObjectStore, rfc3339

GPU = "nvidia.com/gpu"
INDEX = "batch.kubernetes.io/job-completion-index"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")
_KEYED_FIELD = re.compile(r"metadata\.(annotations|labels)\['([^']+)'\]")
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."


@dataclass
class NodeSpec:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    gpus: int = 0
    cpus: int = 8

    def manifest(self) -> Obj:
        alloc = {"cpu": str(self.cpus), "memory": "64Gi", "pods": "110"}
        if self.gpus:
            alloc[GPU] = str(self.gpus)
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", **self.labels}
        return {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"taints": self.taints} if self.taints else {},
            "status": {
                "capacity": alloc,
                "allocatable": alloc,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        }


@dataclass
class _Container:
    proc: subprocess.Popen[bytes]
    log: Path
    started: float  # monotonic
    started_wall: float
    term_at: float | None = None  # monotonic time SIGTERM was sent
    kill_after_s: float = 30.0


def _tolerates(tolerations: list[Obj], taint: dict[str, str]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol["key"] == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _expr_match(labels: dict[str, str], expr: Obj) -> bool:
    have = labels.get(str(expr.get("key", "")))
    op, values = expr.get("operator"), expr.get("values") or []
    return {
        "In": have in values,
        "NotIn": have not in values,
        "Exists": have is not None,
        "DoesNotExist": have is None,
    }.get(str(op), False)


def _affinity_match(labels: dict[str, str], pod_spec: Obj) -> bool:
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(
        all(_expr_match(labels, e) for e in t.get("matchExpressions") or []) for t in terms
    )


def _gpus(pod_spec: Obj) -> int:
    return sum(
        int(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0))
        for c in pod_spec.get("containers") or []
    )


def _cpus(pod_spec: Obj) -> float:
    """CPU requests of a pod (``2``, ``500m``)."""
    total = 0.0
    for c in pod_spec.get("containers") or []:
        value = str(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        total += float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    return total


def _misfit(spec: Obj, node: Obj, held: list[float]) -> str | None:
    """Why ``node`` cannot take a pod of ``spec`` beside the GPUs and CPUs ``held`` there
    (the scheduler's words), or None when it can."""
    labels = node["metadata"].get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()) or not _affinity_match(labels, spec):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            spec.get("tolerations") or [], taint
        ):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    allocatable = node["status"]["allocatable"]
    if _gpus(spec) > int(allocatable.get(GPU, 0)) - held[0]:
        return f"Insufficient {GPU}"
    if _cpus(spec) > float(allocatable.get("cpu", 0)) - held[1]:
        return "Insufficient cpu"
    return None


def _failed_indexes(job: Obj) -> set[int]:
    text = (job.get("status") or {}).get("failedIndexes") or ""
    return {int(i) for i in text.split(",") if i}


def _index(pod: Obj) -> int:
    """A pod's completion index (0 for a pod of a Job that is not Indexed)."""
    return int((pod["metadata"].get("labels") or {}).get(INDEX, 0))


def _condition(obj: Obj, ctype: str, status: str, reason: str, message: str = "") -> None:
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


class Cluster:
    """Drives the objects in ``store`` the way the control plane and kubelets would."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        state_dir: Path,
        evict_after_s: list[float],
        evict_mode: str = "shutdown",
        shutdown_grace_s: float | None = None,
        tick_s: float = 0.05,
        image: list[Path] | None = None,
        admission: Callable[[], None] | None = None,
    ) -> None:
        if evict_mode not in ("shutdown", "delete"):
            raise ValueError(f"evict_mode must be 'shutdown' or 'delete', not {evict_mode!r}")
        self.store = store
        self.state_dir = state_dir
        self.evict_after_s = list(evict_after_s)  # the k-th pod to run is evicted after [k] s
        self.evict_mode = evict_mode
        self.shutdown_grace_s = shutdown_grace_s
        self.tick_s = tick_s
        self.admission = admission  # a queue's admission pass (Kueue), before the Job controller
        # what every container has besides the system: this Python, spotwise, the job's code
        self.image = machine_root.machine_image(image)
        self.evictions: list[str] = []  # names of the pods evicted, in order
        self.exits: dict[str, int] = {}  # pod name -> its container's exit code, once ended
        self._started = 0  # pods that reached Running
        self._evict_at: dict[str, float] = {}  # pod uid -> monotonic eviction time
        self._containers: dict[str, _Container] = {}  # pod uid -> its process
        self._counted: set[str] = set()  # pod uids the Job controller has accounted for
        self._last_seen: dict[str, Obj] = {}  # pod uid -> last state (for vanished pods)
        self._ports: dict[tuple[str, int], int] = {}  # (Service uid, its port) -> loopback port
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="spotwise-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and every container (SIGKILL): nothing outlives the emulator."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for c in self._containers.values():
                _signal_group(c.proc.pid, signal.SIGKILL)
                c.proc.wait(timeout=5)
            self._containers.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self.tick()

    def tick(self) -> None:
        """One pass of the admission controller, the Job controller, the scheduler and the
        kubelet."""
        if self.admission is not None:
            self.admission()
        self._jobs()
        pods, _ = self.store.select("pods")
        for pod in pods:
            self._pod(pod)

    # --- API-side hooks -----------------------------------------------------------------------
    def delete(self, resource: str, ns: str, name: str, options: Obj) -> None:
        """A DELETE from the API: graceful for pods, propagated for jobs."""
        with self._lock:
            if resource == "pods":
                self._delete_pod(ns, name, options.get("gracePeriodSeconds"))
            elif resource == "jobs":
                self._delete_job(
                    ns,
                    name,
                    options.get("propagationPolicy") or "Orphan",
                    options.get("gracePeriodSeconds"),
                )
            else:
                self.store.remove(resource, ns, name)

    def read_log(self, pod: Obj) -> bytes:
        path = self._log_path(pod)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return b""

    def running(self) -> list[int]:
        """Pids of the containers still running."""
        with self._lock:
            return [c.proc.pid for c in self._containers.values() if c.proc.poll() is None]

    def evict(self, ns: str, name: str) -> None:
        """Take the pod's node away now (see the module docstring)."""
        with self._lock:
            pod = self.store.get("pods", ns, name)
            if pod is not None:
                self._evict(pod)

    # --- the Job controller -------------------------------------------------------------------
    def _jobs(self) -> None:
        jobs, _ = self.store.select("jobs")
        for job in jobs:
            meta, ns = job["metadata"], job["metadata"]["namespace"]
            pods, _ = self.store.select("pods", ns, f"controller-uid={meta['uid']}")
            if meta.get("deletionTimestamp"):
                if not pods:
                    self.store.remove("jobs", ns, meta["name"])
                continue
            if has_condition(job, "Complete") or has_condition(job, "Failed"):
                continue
            live = {p["metadata"]["uid"] for p in pods}
            for uid, last in list(self._last_seen.items()):  # deleted before they finished
                if (
                    last["metadata"].get("labels", {}).get("controller-uid") == meta["uid"]
                    and uid not in live
                    and uid not in self._counted
                ):
                    self._account(job, last, vanished=True)
                    job = self.store.get("jobs", ns, meta["name"]) or job
            for pod in pods:
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed") and pod["metadata"]["uid"] not in self._counted:
                    self._account(job, pod)
                    job = self.store.get("jobs", ns, meta["name"]) or job
            if has_condition(job, "Complete") or has_condition(job, "Failed"):
                continue
            active = [
                p
                for p in pods
                if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            ]
            if job["spec"].get("suspend"):
                self._suspend(job, active)
            else:
                if has_condition(job, "Suspended"):
                    self._resume(job)
                self._create_missing(job, pods, active)

    def _job_status(self, job: Obj, **counts: int) -> None:
        def mutate(j: Obj) -> None:
            status = j.setdefault("status", {})
            status.setdefault("startTime", rfc3339())
            for key, value in counts.items():
                status[key] = value

        self.store.update("jobs", job["metadata"]["namespace"], job["metadata"]["name"], mutate)

    def _create_missing(self, job: Obj, pods: list[Obj], active: list[Obj]) -> None:
        """Start the pods the Job lacks: its one pod, or each unfinished completion index."""
        spec = job["spec"]
        if spec.get("completionMode") != "Indexed":
            if not active:
                self._create_pod(job)
            self._job_status(job, active=max(1, len(active)))
            return
        done = {_index(p) for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"}
        done |= _failed_indexes(job)  # never retried (backoffLimitPerIndex)
        running = {_index(p) for p in active}
        if _failed_indexes(job) and not running and len(done) >= int(spec.get("completions", 1)):
            self._finish(job, "Failed", "FailedIndexes", "Job has failed indexes", active=0)
            return
        for i in range(int(spec.get("completions", 1))):
            if len(running) >= int(spec.get("parallelism", 1)):
                break
            if i not in done and i not in running:
                self._create_pod(job, i)
                running.add(i)
        self._job_status(job, active=len(running))

    def _suspend(self, job: Obj, active: list[Obj]) -> None:
        """A suspended Job has no pods: the running ones are terminated with their grace
        period (SIGTERM first), and their ends are not counted as failures."""
        ns = job["metadata"]["namespace"]
        for pod in active:
            self._counted.add(pod["metadata"]["uid"])
            if not pod["metadata"].get("deletionTimestamp"):
                self._delete_pod(ns, pod["metadata"]["name"], None)
        if not has_condition(job, "Suspended"):

            def mutate(j: Obj) -> None:
                _condition(j, "Suspended", "True", "JobSuspended", "Job suspended")
                j["status"]["active"] = len(active)

            self.store.update("jobs", ns, job["metadata"]["name"], mutate)
            self._event(job, "Suspended", "Job suspended")
        else:
            self._job_status(job, active=len(active))

    def _resume(self, job: Obj) -> None:
        def mutate(j: Obj) -> None:
            _condition(j, "Suspended", "False", "JobResumed", "Job resumed")
            j["status"]["startTime"] = rfc3339()  # reset on resume, as the Job controller does

        self.store.update("jobs", job["metadata"]["namespace"], job["metadata"]["name"], mutate)
        self._event(job, "Resumed", "Job resumed")

    def _create_pod(self, job: Obj, index: int | None = None) -> None:
        meta = job["metadata"]
        template = job["spec"]["template"]
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            "controller-uid": meta["uid"],
            "batch.kubernetes.io/controller-uid": meta["uid"],
            "job-name": meta["name"],
            "batch.kubernetes.io/job-name": meta["name"],
        }
        annotations = dict((template.get("metadata") or {}).get("annotations", {}))
        spec = copy.deepcopy(template["spec"])
        prefix = f"{meta['name']}-"
        if index is not None:
            labels[INDEX] = annotations[INDEX] = str(index)
            spec["hostname"] = f"{meta['name']}-{index}"
            prefix = f"{meta['name']}-{index}-"
            for container in spec.get("containers") or []:
                container["env"] = [
                    {
                        "name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {
                            "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}
                        },
                    },
                    *(container.get("env") or []),
                ]
        pod = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "generateName": prefix,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        created = self.store.create("pods", meta["namespace"], pod)
        self._event(job, "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

    def _account(self, job: Obj, pod: Obj, vanished: bool = False) -> None:
        """A pod of ``job`` ended: apply podFailurePolicy and backoffLimit."""
        self._counted.add(pod["metadata"]["uid"])
        self._last_seen.pop(pod["metadata"]["uid"], None)
        status = job.get("status") or {}
        if not vanished and pod["status"].get("phase") == "Succeeded":
            succeeded = int(status.get("succeeded", 0)) + 1
            if succeeded >= int(job["spec"].get("completions", 1)):
                self._finish(job, "Complete", "Completed", "", succeeded=succeeded, active=0)
            else:
                self._job_status(job, succeeded=succeeded)
            return
        action, why = self._policy_action(job, pod)
        if action == "Ignore":
            return
        failed = int(status.get("failed", 0)) + 1
        if action == "FailJob":
            self._finish(job, "Failed", "PodFailurePolicy", why, failed=failed, active=0)
        elif job["spec"].get("backoffLimitPerIndex") is not None:
            # (the double keeps a per-index limit of 0: FailIndex and Count both fail the index)
            indexes = sorted({*_failed_indexes(job), _index(pod)})

            def mark(j: Obj) -> None:
                j.setdefault("status", {})["failed"] = failed
                j["status"]["failedIndexes"] = ",".join(map(str, indexes))

            self.store.update("jobs", job["metadata"]["namespace"], job["metadata"]["name"], mark)
        elif failed > int(job["spec"].get("backoffLimit", 6)):
            self._finish(
                job,
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
                failed=failed,
                active=0,
            )
        else:
            self._job_status(job, failed=failed, active=0)

    def _policy_action(self, job: Obj, pod: Obj) -> tuple[str, str]:
        rules = (job["spec"].get("podFailurePolicy") or {}).get("rules") or []
        name = f"{pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
        states = pod.get("status", {}).get("containerStatuses") or []
        for i, rule in enumerate(rules):
            on_codes = rule.get("onExitCodes")
            if on_codes:
                for cs in states:
                    code = (cs.get("state", {}).get("terminated") or {}).get("exitCode")
                    if (
                        code is None
                        or code == 0
                        or (
                            on_codes.get("containerName")
                            and on_codes["containerName"] != cs["name"]
                        )
                    ):
                        continue
                    inside = code in on_codes.get("values", [])
                    if inside == (on_codes.get("operator") == "In"):
                        return rule["action"], (
                            f"Container {cs['name']} for pod {name} failed with exit code "
                            f"{code} matching {rule['action']} rule at index {i}"
                        )
            for pattern in rule.get("onPodConditions") or []:
                for cond in pod.get("status", {}).get("conditions") or []:
                    if cond["type"] == pattern.get("type") and cond["status"] == pattern.get(
                        "status", "True"
                    ):
                        return rule["action"], (
                            f"Pod {name} has condition {cond['type']} matching "
                            f"{rule['action']} rule at index {i}"
                        )
        return "Count", ""

    def _finish(self, job: Obj, ctype: str, reason: str, message: str, **counts: int) -> None:
        def mutate(j: Obj) -> None:
            status = j.setdefault("status", {})
            status.update(counts)
            if ctype == "Failed":
                _condition(j, "FailureTarget", "True", reason, message)
            else:
                _condition(j, "SuccessCriteriaMet", "True", reason, message)
                status["completionTime"] = rfc3339()
            _condition(j, ctype, "True", reason, message)

        ns = job["metadata"]["namespace"]
        self.store.update("jobs", ns, job["metadata"]["name"], mutate)
        if ctype == "Failed":  # the Job controller terminates the pods still running
            pods, _ = self.store.select("pods", ns, f"controller-uid={job['metadata']['uid']}")
            for pod in pods:
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") and not (
                    pod["metadata"].get("deletionTimestamp")
                ):
                    self._counted.add(pod["metadata"]["uid"])
                    self._delete_pod(ns, pod["metadata"]["name"], None)
        self._event(
            job,
            "Completed" if ctype == "Complete" else reason,
            message or "Job completed",
            warning=ctype == "Failed",
        )

    def _delete_job(self, ns: str, name: str, policy: str, grace: int | None) -> None:
        job = self.store.get("jobs", ns, name)
        if job is None:
            return
        pods, _ = self.store.select("pods", ns, f"controller-uid={job['metadata']['uid']}")
        if policy == "Orphan":
            for pod in pods:
                self.store.update(
                    "pods",
                    ns,
                    pod["metadata"]["name"],
                    lambda p: p["metadata"].pop("ownerReferences", None),
                )
            self.store.remove("jobs", ns, name)
            return
        if policy == "Foreground":

            def mark(j: Obj) -> None:
                j["metadata"]["deletionTimestamp"] = rfc3339()
                j["metadata"]["finalizers"] = ["foregroundDeletion"]

            self.store.update("jobs", ns, name, mark)
        else:
            self.store.remove("jobs", ns, name)
        for pod in pods:
            self._delete_pod(ns, pod["metadata"]["name"], grace)

    # --- pods: scheduling, running, stopping --------------------------------------------------
    def _pod(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        uid = meta["uid"]
        phase = pod.get("status", {}).get("phase")
        if phase not in ("Succeeded", "Failed"):
            self._last_seen[uid] = pod
        container = self._containers.get(uid)
        if container is not None:
            self._watch_container(pod, container)
            return
        if phase in ("Succeeded", "Failed"):
            if meta.get("deletionTimestamp"):
                self.store.remove("pods", meta["namespace"], meta["name"])
            return
        if meta.get("deletionTimestamp"):  # never started: nothing to stop
            self._end_pod(pod, None, reason="Killing")
            self.store.remove("pods", meta["namespace"], meta["name"])
            return
        if not spec.get("nodeName"):
            self._schedule(pod)
            return
        self._start(pod)

    def _schedule(self, pod: Obj) -> None:
        current = self.store.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None or current["spec"].get("nodeName"):
            return  # (bound with its gang earlier in this pass)
        pod = current
        spec, meta = pod["spec"], pod["metadata"]
        ns = meta["namespace"]
        for vol in spec.get("volumes") or []:
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim and self.store.get("persistentvolumeclaims", ns, claim) is None:
                self._unschedulable(pod, f'persistentvolumeclaim "{claim}" not found')
                return
        gang = self._gang(pod)
        nodes, _ = self.store.select("nodes")
        pods, _ = self.store.select("pods")
        used: dict[str, list[float]] = {}  # node -> [GPUs, CPUs] held by its pods
        for p in pods:
            node_name = p["spec"].get("nodeName")
            if node_name and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                held = used.setdefault(node_name, [0.0, 0.0])
                held[0] += _gpus(p["spec"])
                held[1] += _cpus(p["spec"])
        chosen: list[tuple[Obj, str]] = []
        for member in gang:
            reasons: dict[str, int] = {}
            for node in nodes:
                why = _misfit(member["spec"], node, used.get(node["metadata"]["name"], [0.0, 0.0]))
                if why is None:
                    held = used.setdefault(node["metadata"]["name"], [0.0, 0.0])
                    held[0] += _gpus(member["spec"])
                    held[1] += _cpus(member["spec"])
                    chosen.append((member, node["metadata"]["name"]))
                    break
                reasons[why] = reasons.get(why, 0) + 1
            else:
                detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
                message = f"0/{len(nodes)} nodes are available: {detail}."
                if len(gang) > 1:
                    message += f" The Job's {len(gang)} pods are placed together or not at all."
                for m in gang:
                    self._unschedulable(m, message)
                return
        for member, node_name in chosen:
            self._bind(member, node_name)

    def _gang(self, pod: Obj) -> list[Obj]:
        """The pods bound together with ``pod``: the unplaced pods of its Indexed Job when that
        runs several at once, once all of them exist; else ``pod`` alone."""
        meta = pod["metadata"]
        owner = next((o for o in meta.get("ownerReferences") or [] if o["kind"] == "Job"), None)
        job = self.store.get("jobs", meta["namespace"], owner["name"]) if owner else None
        if job is None or job["spec"].get("completionMode") != "Indexed":
            return [pod]
        width = int(job["spec"].get("parallelism", 1))
        if width <= 1:
            return [pod]
        siblings, _ = self.store.select(
            "pods", meta["namespace"], f"controller-uid={job['metadata']['uid']}"
        )
        return sorted(
            (
                p
                for p in siblings
                if not p["spec"].get("nodeName")
                and not p["metadata"].get("deletionTimestamp")
                and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            ),
            key=_index,
        )

    def _unschedulable(self, pod: Obj, message: str) -> None:
        conds = pod.get("status", {}).get("conditions") or []
        if any(c["type"] == "PodScheduled" and c.get("message") == message for c in conds):
            return
        self.store.update(
            "pods",
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            lambda p: _condition(p, "PodScheduled", "False", "Unschedulable", message),
        )
        self._event(pod, "FailedScheduling", message, warning=True)

    def _bind(self, pod: Obj, node: str) -> None:
        def mutate(p: Obj) -> None:
            p["spec"]["nodeName"] = node
            _condition(p, "PodScheduled", "True", "")

        self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate)
        self._event(
            pod,
            "Scheduled",
            f"Successfully assigned {pod['metadata']['namespace']}/"
            f"{pod['metadata']['name']} to {node}",
        )

    def _machine_dir(self, pod: Obj) -> Path:
        return self.state_dir / "machines" / pod["metadata"]["uid"]

    def _log_path(self, pod: Obj) -> Path:
        meta = pod["metadata"]
        return self.state_dir / "logs" / f"{meta['namespace']}_{meta['name']}_{meta['uid']}.log"

    def _volumes(self, pod: Obj) -> dict[str, Path]:
        """mountPath -> host directory, for the PVC volumes the container mounts."""
        ns = pod["metadata"]["namespace"]
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["spec"].get("volumes") or []
            if v.get("persistentVolumeClaim")
        }
        mounts: dict[str, Path] = {}
        for m in pod["spec"]["containers"][0].get("volumeMounts") or []:
            if m["name"] in claims:
                host = self.state_dir / "volumes" / ns / claims[m["name"]]
                host.mkdir(parents=True, exist_ok=True)
                mounts[m["mountPath"].rstrip("/")] = host
        return mounts

    def _env(self, pod: Obj, container: Obj) -> tuple[dict[str, str], str | None]:
        """The container's environment, or (_, message) when a reference cannot be resolved."""
        ns = pod["metadata"]["namespace"]
        interpreter = str(Path(sys.executable).parent)
        env = {
            "PATH": f"{interpreter}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOSTNAME": pod["metadata"]["name"],
        }
        if "PYTHONPATH" in os.environ:  # the "image" is this environment, imports included
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        fields = {
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": ns,
            "spec.nodeName": pod["spec"].get("nodeName", ""),
            "metadata.uid": pod["metadata"]["uid"],
        }
        for var in container.get("env") or []:
            source = var.get("valueFrom")
            if source is None:
                env[var["name"]] = _expand(str(var.get("value", "")), env)
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                secret = self.store.get("secrets", ns, ref["name"])
                data = (secret or {}).get("data") or {}
                if secret is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    return (
                        env,
                        f'secret "{ref["name"]}" not found'
                        if secret is None
                        else f"couldn't find key {ref['key']} in Secret {ns}/{ref['name']}",
                    )
                env[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
            elif "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                keyed = _KEYED_FIELD.fullmatch(path)
                env[var["name"]] = (
                    str((pod["metadata"].get(keyed[1]) or {}).get(keyed[2], ""))
                    if keyed
                    else fields.get(path, "")
                )
        return env, None

    def _cluster_dns(self, ns: str) -> Callable[[str], str] | None:
        """What the cluster's DNS and network make of the names of pods in the subdomain of a
        headless Service of ``ns`` (see the module docstring), as a rewrite of text."""
        services, _ = self.store.select("services", ns)
        ports: dict[str, dict[str, str]] = {}  # Service -> its port -> the loopback port
        for svc in services:
            if (svc.get("spec") or {}).get("clusterIP") != "None":
                continue
            uid = svc["metadata"]["uid"]
            declared = [int(port["port"]) for port in svc["spec"].get("ports") or []]
            ports[svc["metadata"]["name"]] = {
                str(n): str(self._ports.setdefault((uid, n), _free_port())) for n in declared
            }
        if not ports:
            return None
        pods, _ = self.store.select("pods", ns)
        names: dict[str, str] = {}  # DNS name -> its Service
        for p in pods:
            host, sub = p["spec"].get("hostname"), p["spec"].get("subdomain")
            if host and sub in ports:
                for tail in ("", f".{ns}", f".{ns}.svc", f".{ns}.svc.cluster.local"):
                    names[f"{host}.{sub}{tail}"] = sub
        if not names:
            return None
        alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w.-])({alternatives})(?::(\d+))?(?![\w.-])")

        def loopback(m: re.Match[str]) -> str:
            port = m.group(2)
            return "127.0.0.1" + (f":{ports[names[m.group(1)]].get(port, port)}" if port else "")

        return lambda text: pattern.sub(loopback, text)

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        spec = pod["spec"]["containers"][0]
        env, missing = self._env(pod, spec)
        if missing is not None:

            def waiting(p: Obj) -> None:
                p["status"]["containerStatuses"] = [
                    {
                        "name": spec["name"],
                        "image": spec.get("image", ""),
                        "ready": False,
                        "restartCount": 0,
                        "imageID": "",
                        "state": {
                            "waiting": {"reason": "CreateContainerConfigError", "message": missing}
                        },
                    }
                ]

            if self.store.update("pods", meta["namespace"], meta["name"], waiting) != pod:
                self._event(pod, "Failed", f"Error: {missing}", warning=True)
            return
        mounts = self._volumes(pod)
        argv = [_expand(a, env) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        resolve = self._cluster_dns(meta["namespace"])
        if resolve is not None:
            argv = [resolve(a) for a in argv]
            env = {k: resolve(v) for k, v in env.items()}
        cwd = spec.get("workingDir")
        if not machine_root.isolated():  # no mount namespace: the volumes' host paths instead
            env = {k: _remap(v, mounts) for k, v in env.items()}
            argv = [_remap(a, mounts) for a in argv]
            cwd = cwd and _remap(cwd, mounts)
        log = self._log_path(pod)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            try:
                proc = machine_root.start(
                    argv,
                    machine_dir=self._machine_dir(pod),
                    image=self.image,
                    env=env,
                    volumes=mounts,
                    hide=[self.state_dir],
                    cwd=cwd,
                    stdout=out,
                )
            except OSError as exc:
                self._end_pod(pod, 128, reason="StartError", message=str(exc))
                return
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self._containers[meta["uid"]] = _Container(
            proc, log, time.monotonic(), time.time(), kill_after_s=grace
        )
        started = rfc3339()

        def running(p: Obj) -> None:
            p["status"].update(
                phase="Running", hostIP="127.0.0.1", podIP="127.0.0.1", startTime=started
            )
            p["status"]["containerStatuses"] = [
                {
                    "name": spec["name"],
                    "image": spec.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": started}},
                }
            ]
            _condition(p, "Ready", "True", "")

        self.store.update("pods", meta["namespace"], meta["name"], running)
        self._event(pod, "Started", f"Started container {spec['name']}")
        if self._started < len(self.evict_after_s):
            self._evict_at[meta["uid"]] = time.monotonic() + self.evict_after_s[self._started]
        self._started += 1

    def _watch_container(self, pod: Obj, c: _Container) -> None:
        meta = pod["metadata"]
        code = c.proc.poll()
        if code is not None:
            del self._containers[meta["uid"]]
            self._evict_at.pop(meta["uid"], None)
            machine_root.discard(self._machine_dir(pod))
            exit_code = code if code >= 0 else 128 - code
            self.exits[meta["name"]] = exit_code
            evicted = has_condition(pod, "DisruptionTarget")
            self._end_pod(
                pod,
                exit_code,
                signal_no=-code if code < 0 else None,
                reason="Terminated" if evicted else "",
                message=SHUTDOWN_MESSAGE if evicted else "",
            )
            if meta.get("deletionTimestamp") or (evicted and self.evict_mode == "delete"):
                self.store.remove("pods", meta["namespace"], meta["name"])
            return
        now = time.monotonic()
        due = self._evict_at.get(meta["uid"])
        if due is not None and now >= due and c.term_at is None:
            self._evict(pod)
            return
        if meta.get("deletionTimestamp") and c.term_at is None:
            self._terminate(pod, c, float(meta.get("deletionGracePeriodSeconds", 30)))
        if c.term_at is not None and now - c.term_at >= c.kill_after_s:
            _signal_group(c.proc.pid, signal.SIGKILL)

    def _terminate(self, pod: Obj, c: _Container, grace_s: float) -> None:
        c.term_at, c.kill_after_s = time.monotonic(), grace_s
        self._event(pod, "Killing", f"Stopping container {pod['spec']['containers'][0]['name']}")
        _signal_group(c.proc.pid, signal.SIGTERM)

    def _evict(self, pod: Obj) -> None:
        meta = pod["metadata"]
        c = self._containers.get(meta["uid"])
        self._evict_at.pop(meta["uid"], None)
        reason = "DeletionByPodGC" if self.evict_mode == "delete" else "TerminationByKubelet"
        self.store.update(
            "pods",
            meta["namespace"],
            meta["name"],
            lambda p: _condition(p, "DisruptionTarget", "True", reason, SHUTDOWN_MESSAGE),
        )
        self.evictions.append(meta["name"])
        self._event(
            pod,
            "Preempting",
            f"Node {pod['spec'].get('nodeName')} is being reclaimed (spot); " + SHUTDOWN_MESSAGE,
            warning=True,
        )
        if c is None:
            self._end_pod(pod, None, reason="Terminated", message=SHUTDOWN_MESSAGE)
            return
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        if self.shutdown_grace_s is not None:
            grace = min(grace, self.shutdown_grace_s)
        self._terminate(pod, c, grace)

    def _delete_pod(self, ns: str, name: str, grace: int | None) -> None:
        def mark(p: Obj) -> None:
            p["metadata"].setdefault("deletionTimestamp", rfc3339())
            p["metadata"]["deletionGracePeriodSeconds"] = int(
                grace if grace is not None else p["spec"].get("terminationGracePeriodSeconds", 30)
            )

        pod = self.store.update("pods", ns, name, mark)
        if pod is not None and pod["metadata"]["uid"] not in self._containers:
            self.store.remove("pods", ns, name)
        elif pod is not None and grace == 0:
            _signal_group(self._containers[pod["metadata"]["uid"]].proc.pid, signal.SIGKILL)

    def _end_pod(
        self,
        pod: Obj,
        exit_code: int | None,
        *,
        signal_no: int | None = None,
        reason: str = "",
        message: str = "",
    ) -> None:
        name = pod["spec"]["containers"][0]["name"]
        finished = rfc3339()

        def mutate(p: Obj) -> None:
            status = p["status"]
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            if reason:
                status["reason"], status["message"] = reason, message
            _condition(p, "Ready", "False", "PodCompleted")
            if exit_code is None:
                return
            term: Obj = {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "finishedAt": finished,
            }
            running = ((status.get("containerStatuses") or [{}])[0].get("state") or {}).get(
                "running"
            ) or {}
            term["startedAt"] = running.get("startedAt", finished)
            if signal_no:
                term["signal"] = signal_no
            status["containerStatuses"] = [
                {
                    "name": name,
                    "image": pod["spec"]["containers"][0].get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": term},
                }
            ]

        self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate)

    def _event(self, obj: Obj, reason: str, message: str, warning: bool = False) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace", "default")
        now = rfc3339()
        self.store.create(
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
                "source": {"component": "spotwise-emulated-cluster"},
            },
        )


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: known variables replaced, ``$$`` -> ``$``."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


def _remap(text: str, mounts: dict[str, Path]) -> str:
    for mount, host in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
        if text == mount or text.startswith(mount + "/"):
            return str(host) + text[len(mount) :]
        text = text.replace(f"={mount}/", f"={host}/")
    return text


def _free_port() -> int:
    """A port nothing listens on now on 127.0.0.1 (a Service port's stand-in)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


__all__ = ["GPU", "SHUTDOWN_MESSAGE", "Cluster", "NodeSpec", "has_condition"]
