"""Kueue in the loopback cluster: its batch/v1 Job integration and quota admission, the subset
Kueue's documentation describes (concepts/workload; tasks/troubleshooting, troubleshooting_jobs).

- A Job labelled ``kueue.x-k8s.io/queue-name`` gets a Workload ``job-<job>-<5 hex>`` (label
  ``kueue.x-k8s.io/job-uid``, owned by the Job, event ``CreatedWorkload`` on the Job) with one
  pod set ``main`` of ``parallelism`` pods. A Job created unsuspended is left alone (Kueue's
  webhook would have suspended it; the double has no webhooks).
- Admission, oldest Workload first: the LocalQueue's ClusterQueue must have unused
  ``nominalQuota`` (its first flavor) for the pod set's requests x count of every resource. Then
  ``QuotaReserved`` (``QuotaReserved``, "Quota reserved in ClusterQueue CQ") and ``Admitted``
  (``Admitted``, "The workload is admitted") are True, ``status.admission`` names the
  ClusterQueue and flavor, and the Job is unsuspended. Otherwise ``QuotaReserved=False`` with
  ``Pending`` ("couldn't assign flavors to pod set main: insufficient unused quota for cpu in
  flavor F, 2 more needed") or ``Inadmissible`` ("LocalQueue Q doesn't exist").
- Eviction (:meth:`Kueue.evict`; in a real cluster a higher-priority Workload preempting this
  one): ``Evicted=True`` (``Preempted``, "Preempted to accommodate a higher priority
  Workload") and the Job is suspended again, so its pods get SIGTERM and their grace period.
  Once none is left the quota is released (``QuotaReserved=False`` ``Pending``, ``Admitted=False``
  ``NoReservation``, "The workload has no reservation") and the Workload waits to be admitted
  again; when it is, ``Evicted`` turns False (``QuotaReserved``, "Previously: ...").
- A finished Job's Workload gets ``Finished=True`` (``Succeeded`` / ``Failed``) and frees its
  quota; a deleted Job's Workload is deleted with it (garbage collection by owner).
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable

from spotwise.emulators.kubernetes.api import Obj, ObjectStore
from spotwise.emulators.kubernetes.jobs import owned_by
from spotwise.emulators.kubernetes.status import has_condition, record_event, set_condition

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
KUEUE = "kueue-admission"  # the source of its Events
PREEMPTED = "Preempted to accommodate a higher priority Workload"
_UNITS = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20}
_UNITS.update(Gi=2**30, Ti=2**40)
_QUANTITY = re.compile(r"([0-9.]+)([a-zA-Z]*)")


def quantity(text: object) -> float:
    """A Kubernetes resource quantity (``2``, ``500m``, ``16Gi``) as a number."""
    m = _QUANTITY.fullmatch(str(text))
    if m is None or (m[2] and m[2] not in _UNITS):
        raise ValueError(f"not a resource quantity: {text!r}")
    return float(m[1]) * (_UNITS[m[2]] if m[2] else 1.0)


def _shown(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def queues(cluster_queue: str, local_queue: str, namespace: str, quota: dict[str, str]) -> list:
    """The ClusterQueue (one flavor, ``default-flavor``, with ``quota``) and a LocalQueue of
    ``namespace`` pointing at it, as (resource, namespace, object) to create."""
    resources = [{"name": k, "nominalQuota": str(v)} for k, v in quota.items()]
    cq = {
        "metadata": {"name": cluster_queue},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": list(quota),
                    "flavors": [{"name": "default-flavor", "resources": resources}],
                }
            ],
        },
    }
    lq = {"metadata": {"name": local_queue}, "spec": {"clusterQueue": cluster_queue}}
    return [("clusterqueues", "", cq), ("localqueues", namespace, lq)]


def condition(obj: Obj, ctype: str) -> Obj | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None
    )


class Kueue:
    """Kueue's controllers over ``store``; :meth:`tick` is one pass (the cluster loop runs it)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._lock = threading.Lock()

    def tick(self) -> None:
        with self._lock:
            jobs, _ = self.store.select("jobs")
            workloads, _ = self.store.select("workloads")
            by_job = {w["metadata"]["labels"].get(JOB_UID_LABEL): w for w in workloads}
            live = {j["metadata"]["uid"] for j in jobs}
            for w in workloads:  # owner gone: garbage-collected
                if w["metadata"]["labels"].get(JOB_UID_LABEL) not in live:
                    self.store.remove(
                        "workloads", w["metadata"]["namespace"], w["metadata"]["name"]
                    )
            queued = [j for j in jobs if (j["metadata"].get("labels") or {}).get(QUEUE_LABEL)]
            oldest_first = sorted(
                queued, key=lambda j: (j["metadata"]["creationTimestamp"], j["metadata"]["name"])
            )
            for job in oldest_first:
                workload = by_job.get(job["metadata"]["uid"])
                if workload is None:
                    if not job["spec"].get("suspend"):
                        continue  # created running: not Kueue's (no webhook suspended it)
                    workload = self._create(job)
                self._sync(job, workload)

    def evict(self, namespace: str, job_name: str, reason: str = "Preempted") -> None:
        """Evict the admitted Workload of Job ``job_name`` (see the module docstring)."""
        with self._lock:
            job = self.store.get("jobs", namespace, job_name)
            if job is None:
                raise KeyError(f"no Job {namespace}/{job_name}")
            workloads, _ = self.store.select(
                "workloads", namespace, f"{JOB_UID_LABEL}={job['metadata']['uid']}"
            )
            if not workloads or not has_condition(workloads[0], "Admitted"):
                raise ValueError(f"the Workload of Job {job_name} is not admitted")
            self.store.update(
                "workloads",
                namespace,
                workloads[0]["metadata"]["name"],
                lambda w: set_condition(w, "Evicted", "True", reason, PREEMPTED),
            )
            self._suspend(job, True)

    # --- one Workload -------------------------------------------------------------------------
    def _create(self, job: Obj) -> Obj:
        meta = job["metadata"]
        template = job["spec"]["template"]
        workload = {
            "metadata": {
                "name": f"job-{meta['name']}-{secrets.token_hex(3)[:5]}",
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [owned_by(job)],
            },
            "spec": {
                "active": True,
                "queueName": meta["labels"][QUEUE_LABEL],
                "podSets": [
                    {
                        "name": "main",
                        "count": int(job["spec"].get("parallelism", 1)),
                        "template": template,
                    }
                ],
            },
            "status": {},
        }
        created = self.store.create("workloads", meta["namespace"], workload)
        where = f"{meta['namespace']}/{created['metadata']['name']}"
        record_event(
            self.store, job, "CreatedWorkload", f"Created Workload: {where}", component=KUEUE
        )
        return created

    def _sync(self, job: Obj, workload: Obj) -> None:
        ns, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
        if has_condition(workload, "Finished"):
            return
        ended = next((c for c in ("Complete", "Failed") if has_condition(job, c)), None)
        if ended is not None:

            def finish(w: Obj) -> None:
                ok = ended == "Complete"
                said = "Job finished successfully" if ok else "Job failed"
                set_condition(w, "Finished", "True", "Succeeded" if ok else "Failed", said)
                w["status"].pop("admission", None)

            self.store.update("workloads", ns, name, finish)
            return
        if has_condition(workload, "Admitted"):
            if has_condition(workload, "Evicted") and not self._active_pods(job):
                self.store.update("workloads", ns, name, _release)
            return
        if job["spec"].get("suspend"):
            self._admit(job, workload)

    def _admit(self, job: Obj, workload: Obj) -> None:
        ns, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
        queue = workload["spec"]["queueName"]
        local = self.store.get("localqueues", ns, queue)
        cq = (
            self.store.get("clusterqueues", "", local["spec"]["clusterQueue"])
            if local is not None
            else None
        )
        if local is None or cq is None:
            why = (
                f"LocalQueue {queue} doesn't exist"
                if local is None
                else f"ClusterQueue {local['spec']['clusterQueue']} doesn't exist"
            )
            self._pending(ns, name, "Inadmissible", why)
            return
        flavor = cq["spec"]["resourceGroups"][0]["flavors"][0]
        quota = {r["name"]: quantity(r["nominalQuota"]) for r in flavor["resources"]}
        pod_set = workload["spec"]["podSets"][0]
        wanted = _requested(pod_set)
        cq_name = cq["metadata"]["name"]
        short = _short_of(wanted, quota, self._usage(cq_name), flavor["name"])
        if short is not None:
            self._pending(ns, name, "Pending", short)
            return
        self.store.update("workloads", ns, name, _admission(cq_name, pod_set, wanted, flavor))
        self._suspend(job, False)
        record_event(
            self.store, job, "Started", f"Admitted by clusterQueue {cq_name}", component=KUEUE
        )

    # --- helpers ------------------------------------------------------------------------------
    def _pending(self, ns: str, name: str, reason: str, message: str) -> None:
        self.store.update(
            "workloads",
            ns,
            name,
            lambda w: set_condition(w, "QuotaReserved", "False", reason, message),
        )

    def _usage(self, cluster_queue: str) -> dict[str, float]:
        """What the ClusterQueue's admitted Workloads hold."""
        workloads, _ = self.store.select("workloads")
        used: dict[str, float] = {}
        for w in workloads:
            admission = (w.get("status") or {}).get("admission") or {}
            if admission.get("clusterQueue") != cluster_queue or not has_condition(
                w, "QuotaReserved"
            ):
                continue
            for assignment in admission["podSetAssignments"]:
                for resource, value in assignment["resourceUsage"].items():
                    used[resource] = used.get(resource, 0.0) + quantity(value)
        return used

    def _active_pods(self, job: Obj) -> list[Obj]:
        pods, _ = self.store.select(
            "pods", job["metadata"]["namespace"], f"controller-uid={job['metadata']['uid']}"
        )
        return [
            p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def _suspend(self, job: Obj, suspend: bool) -> None:
        def mutate(j: Obj) -> None:
            j["spec"]["suspend"] = suspend

        self.store.update("jobs", job["metadata"]["namespace"], job["metadata"]["name"], mutate)


def _release(w: Obj) -> None:
    """An evicted Workload whose pods are gone gives its quota back and waits again."""
    w["status"].pop("admission", None)
    set_condition(w, "QuotaReserved", "False", "Pending", "The workload is waiting for admission")
    set_condition(w, "Admitted", "False", "NoReservation", "The workload has no reservation")


__all__ = ["JOB_UID_LABEL", "PREEMPTED", "QUEUE_LABEL", "Kueue", "quantity", "queues"]


def _requested(pod_set: Obj) -> dict[str, float]:
    """What a pod set asks for in all: each container's limits, overridden by its requests,
    times the set's count."""
    wanted: dict[str, float] = {}
    for container in pod_set["template"]["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for resource, value in asked.items():
            wanted[resource] = wanted.get(resource, 0.0) + quantity(value) * pod_set["count"]
    return wanted


def _short_of(
    wanted: dict[str, float], quota: dict[str, float], used: dict[str, float], flavor: str
) -> str | None:
    """Kueue's message for the first resource the ClusterQueue cannot give; None: it fits."""
    for resource, want in sorted(wanted.items()):
        if resource not in quota:
            return (
                f"couldn't assign flavors to pod set main: resource {resource} unavailable "
                "in ClusterQueue"
            )
        free = quota[resource] - used.get(resource, 0.0)
        if want > free:
            return (
                f"couldn't assign flavors to pod set main: insufficient unused quota for "
                f"{resource} in flavor {flavor}, {_shown(want - free)} more needed"
            )
    return None


def _admission(
    cq_name: str, pod_set: Obj, wanted: dict[str, float], flavor: Obj
) -> Callable[[Obj], None]:
    """The update that admits a Workload: its quota reserved in ``cq_name``, a past eviction
    cleared."""

    def admit(w: Obj) -> None:
        w["status"]["admission"] = {
            "clusterQueue": cq_name,
            "podSetAssignments": [
                {
                    "name": "main",
                    "count": pod_set["count"],
                    "flavors": dict.fromkeys(wanted, flavor["name"]),
                    "resourceUsage": {k: _shown(v) for k, v in wanted.items()},
                }
            ],
        }
        set_condition(
            w, "QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cq_name}"
        )
        set_condition(w, "Admitted", "True", "Admitted", "The workload is admitted")
        evicted = condition(w, "Evicted")
        if evicted is not None and evicted["status"] == "True":
            set_condition(
                w, "Evicted", "False", "QuotaReserved", f"Previously: {evicted['message']}"
            )

    return admit
