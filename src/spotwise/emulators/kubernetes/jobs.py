"""The Job controller: one pod per Job, or with ``completionMode: Indexed`` one pod per
completion index (``parallelism`` at a time; ``backoffLimitPerIndex`` 0: a failed index is never
retried, ``failedIndexes``, and the Job fails once every index has ended), each with its index in
the ``batch.kubernetes.io/job-completion-index`` label and annotation, ``JOB_COMPLETION_INDEX``
in its env and ``<job>-<index>`` as host name; ``backoffLimit`` and ``podFailurePolicy``
(``onExitCodes``, ``onPodConditions``; FailJob / FailIndex / Ignore / Count), Complete / Failed
conditions (a failed Job's other pods are terminated with their grace period), ``suspend`` (a
suspended Job's pods are terminated, not counted as failures; ``Suspended`` condition; resuming
starts them again), and deletion with the batch API's propagation policies (the API default for
Jobs is ``Orphan``: pods survive).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from spotwise.emulators.kubernetes.api import Obj, ObjectStore, rfc3339
from spotwise.emulators.kubernetes.status import has_condition, record_event, set_condition

INDEX = "batch.kubernetes.io/job-completion-index"


def _failed_indexes(job: Obj) -> set[int]:
    text = (job.get("status") or {}).get("failedIndexes") or ""
    return {int(i) for i in text.split(",") if i}


def completion_index(pod: Obj) -> int:
    """A pod's completion index (0 for a pod of a Job that is not Indexed)."""
    return int((pod["metadata"].get("labels") or {}).get(INDEX, 0))


def owned_by(job: Obj) -> Obj:
    """The owner reference that makes ``job`` the controller of an object (deleted with it)."""
    meta = job["metadata"]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


class JobController:
    """Drives the Jobs of ``store``; ``delete_pod`` is the kubelet's graceful pod deletion."""

    def __init__(
        self, store: ObjectStore, delete_pod: Callable[[str, str, int | None], None]
    ) -> None:
        self.store = store
        self._delete_pod = delete_pod
        self._counted: set[str] = set()  # pod uids the Job controller has accounted for
        self._last_seen: dict[str, Obj] = {}  # pod uid -> last state (for vanished pods)

    def saw(self, pod: Obj) -> None:
        """Remember a pod that has not ended, to account for it if it vanishes unfinished."""
        if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._last_seen[pod["metadata"]["uid"]] = pod

    def sync(self) -> None:
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
        done = {
            completion_index(p) for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"
        }
        done |= _failed_indexes(job)  # never retried (backoffLimitPerIndex)
        running = {completion_index(p) for p in active}
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
                set_condition(j, "Suspended", "True", "JobSuspended", "Job suspended")
                j["status"]["active"] = len(active)

            self.store.update("jobs", ns, job["metadata"]["name"], mutate)
            record_event(self.store, job, "Suspended", "Job suspended")
        else:
            self._job_status(job, active=len(active))

    def _resume(self, job: Obj) -> None:
        def mutate(j: Obj) -> None:
            set_condition(j, "Suspended", "False", "JobResumed", "Job resumed")
            j["status"]["startTime"] = rfc3339()  # reset on resume, as the Job controller does

        self.store.update("jobs", job["metadata"]["namespace"], job["metadata"]["name"], mutate)
        record_event(self.store, job, "Resumed", "Job resumed")

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
                "ownerReferences": [owned_by(job)],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        created = self.store.create("pods", meta["namespace"], pod)
        record_event(
            self.store, job, "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"
        )

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
            indexes = sorted({*_failed_indexes(job), completion_index(pod)})

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
                set_condition(j, "FailureTarget", "True", reason, message)
            else:
                set_condition(j, "SuccessCriteriaMet", "True", reason, message)
                status["completionTime"] = rfc3339()
            set_condition(j, ctype, "True", reason, message)

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
        record_event(
            self.store,
            job,
            "Completed" if ctype == "Complete" else reason,
            message or "Job completed",
            warning=ctype == "Failed",
        )

    def delete_job(self, ns: str, name: str, policy: str, grace: int | None) -> None:
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
