"""The scheduler: binds a pending pod to a node whose labels satisfy its ``nodeSelector`` and
required node affinity, whose taints it tolerates, and whose free ``nvidia.com/gpu`` and CPU
cover its requests; otherwise the pod stays Pending with ``PodScheduled=False/Unschedulable``
and a ``FailedScheduling`` event saying why, as the real scheduler does. The pods of an Indexed
Job with ``parallelism`` > 1 are bound together or not at all (a gang, as Kueue's
all-or-nothing admission or a gang scheduler places them).
"""

from __future__ import annotations

from spotwise.emulators.kubernetes.api import Obj, ObjectStore
from spotwise.emulators.kubernetes.jobs import completion_index
from spotwise.emulators.kubernetes.kubelet import GPU
from spotwise.emulators.kubernetes.status import record_event, set_condition


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


class Scheduler:
    """Places the pods of ``store`` on its nodes."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def schedule(self, pod: Obj) -> None:
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
            key=completion_index,
        )

    def _unschedulable(self, pod: Obj, message: str) -> None:
        conds = pod.get("status", {}).get("conditions") or []
        if any(c["type"] == "PodScheduled" and c.get("message") == message for c in conds):
            return
        self.store.update(
            "pods",
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            lambda p: set_condition(p, "PodScheduled", "False", "Unschedulable", message),
        )
        record_event(self.store, pod, "FailedScheduling", message, warning=True)

    def _bind(self, pod: Obj, node: str) -> None:
        def mutate(p: Obj) -> None:
            p["spec"]["nodeName"] = node
            set_condition(p, "PodScheduled", "True", "")

        self.store.update("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], mutate)
        record_event(
            self.store,
            pod,
            "Scheduled",
            f"Successfully assigned {pod['metadata']['namespace']}/"
            f"{pod['metadata']['name']} to {node}",
        )
