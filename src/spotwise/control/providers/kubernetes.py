"""``kubernetes``: each attempt is a ``batch/v1`` Job (one pod) on a Kubernetes cluster.

The manifest (``kube_manifest.py``) makes the Job fail at once on exit 75 or node disruption,
so Kubernetes never retries behind the controller's back; the controller decides the next
attempt. Status comes from watching the job's Jobs and pods (list + watch from the list's
resourceVersion, relisting on ``410 Expired`` or a dropped stream), not from polling each
object: the pod's phase, its ``DisruptionTarget`` condition (spot reclaim, eviction,
preemption), its container's exit code, and the Job's conditions. Once an attempt's outcome is
read, its output is appended to the job log, the outcome is kept in the attempt directory and
the Job is deleted with its pod, so a finished job leaves nothing in the cluster.

The official client is imported lazily (``pip install 'spotwise[kubernetes]'``); its errors are
translated here into the provider error tree. Credentials stay in the kubeconfig: pods are not
on the controller's host (``same_host=False``), so a manifest carries only the job's own ``env``
and the attempt's ``SPOTWISE_*`` variables; secrets are passed by reference (``secret_env``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from calendar import timegm
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotwise.checkpoint.durable import write_atomic
from spotwise.control.providers.base import (
    AttemptStatus,
    CheckpointHome,
    Features,
    Handle,
    LaunchRequest,
    NoticeKind,
    Phase,
    Prices,
    Pricing,
    parse_options,
    remote_words,
)
from spotwise.control.providers.kube_manifest import (
    GPU,
    INDEX_ENV,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_QUEUE,
    SPOT_LABELS,
    KubernetesOptions,
    dns_name,
    job_manifest,
    rendezvous_host,
    service,
)
from spotwise.control.providers.process import group_status
from spotwise.control.providers.torchrun import launcher_argv
from spotwise.control.workdir import MACHINE_DIR, run_argv
from spotwise.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    ProviderUnavailableError,
    TransientProviderError,
)
from spotwise.registry import require

if TYPE_CHECKING:
    from spotwise.control.resources import Resources

log = logging.getLogger("spotwise.providers.kubernetes")
LOG_EVERY_S = 2.0  # how often a running pod's new output is copied into the job log
WATCH_IDLE_S = 120.0  # a job's watches end when its status has not been asked for this long
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # on each pod of an Indexed Job
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
_FATAL_WAITING = {
    "CreateContainerConfigError",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerError",
}


def _timestamp(value: Any) -> float | None:
    """A client datetime (or RFC 3339 string) -> epoch seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        return float(timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%SZ")))
    return float(value.timestamp())


class _Informer:
    """The current pods or Jobs carrying one label, kept by list + watch on a daemon thread.

    Deleted objects are kept as tombstones (their last state), because a Job deleted with its
    pod still has to tell how the pod ended. After ``give_up_s`` of failing to list, the thread
    ends (the API is gone, or so is the provider object), and so it does once nobody has read
    it for ``idle_s`` (the job ended: a server that drove a thousand jobs would otherwise keep
    a thousand watches open); the next ``status`` starts another."""

    def __init__(
        self,
        kube: Any,
        list_fn: Any,
        namespace: str,
        selector: str,
        give_up_s: float = 60.0,
        idle_s: float = WATCH_IDLE_S,
    ) -> None:
        self._kube, self._list, self._ns, self._selector = kube, list_fn, namespace, selector
        self._objects: dict[str, Any] = {}
        self._tombstones: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._give_up_s, self._idle_s = give_up_s, idle_s
        self._read_at = time.monotonic()
        self.synced = threading.Event()
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="spotwise-k8s-watch", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        failing_since: float | None = None
        while (
            failing_since is None or time.monotonic() - failing_since < self._give_up_s
        ) and time.monotonic() - self._read_at < self._idle_s:
            try:
                listed = self._list(self._ns, label_selector=self._selector)
                with self._lock:
                    self._objects = {o.metadata.name: o for o in listed.items}
                self.synced.set()
                self.error, failing_since = "", None
                stream = self._kube.watch.Watch().stream(
                    self._list,
                    self._ns,
                    label_selector=self._selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=max(1, round(self._idle_s / 2)),
                )
                for event in stream:
                    if time.monotonic() - self._read_at >= self._idle_s:
                        break
                    obj = event["object"]
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._objects.pop(obj.metadata.name, None)
                            self._tombstones[obj.metadata.name] = obj
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self._objects[obj.metadata.name] = obj
            except Exception as exc:  # any failure (stream dropped, 410, API down): relist
                self.error = f"{type(exc).__name__}: {exc}"
                log.debug("watch of %s restarts: %s", self._selector, self.error)
                failing_since = failing_since or time.monotonic()
                time.sleep(0.5)

    def items(self) -> list[Any]:
        self._read_at = time.monotonic()
        with self._lock:
            return list(self._objects.values())

    def gone(self) -> list[Any]:
        self._read_at = time.monotonic()
        with self._lock:
            return list(self._tombstones.values())


class KubernetesProvider:
    name = "kubernetes"
    Options = KubernetesOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
    ) -> None:
        self.opts = parse_options(KubernetesOptions, self.name, options)
        self.gpu_count = resources.gpu_count if resources is not None else 0
        self.cpus = resources.cpus if resources is not None else 1
        self._kube = require("kubernetes", "kubernetes", "the 'kubernetes' provider")
        self._urllib3 = require("urllib3", "kubernetes", "the 'kubernetes' provider")
        self._api, context_ns = self._connect()
        self.namespace = self.opts.namespace or context_ns or "default"
        self._core = self._kube.client.CoreV1Api(self._api)
        self._batch = self._kube.client.BatchV1Api(self._api)
        zone = f"{self.opts.flavour or 'k8s'}/{self.namespace}"
        spot_price = self.opts.usd_per_hour
        ondemand = self.opts.ondemand_usd_per_hour
        ondemand = spot_price if ondemand is None else ondemand
        self.prices = Prices(
            {
                ("spot", zone): Pricing(spot_price, ondemand),
                ("on-demand", zone): Pricing(ondemand, ondemand),
            }
        )
        self.features = Features(
            zones=(zone,),
            spot=self.opts.flavour is not None,
            notice=NoticeKind.SIGNAL,
            poll_s=self.opts.poll_s,
            grace_s=self.opts.grace,
            platform="kubernetes",
            same_host=False,
            multi_node=True,
            checkpoints=self._checkpoint_home(),
        )
        self._informers: dict[str, tuple[_Informer, _Informer]] = {}
        self._log_copied: dict[str, float] = {}  # Job name -> when its pods' logs were copied
        self._stopping: set[str] = set()  # Jobs deleted because one of their pods ended
        if preflight:
            self._preflight()

    # --- connecting ---------------------------------------------------------------------------
    def _connect(self) -> tuple[Any, str | None]:
        config = self._kube.config
        path = self.opts.kubeconfig or os.environ.get("KUBECONFIG") or None
        try:
            if (
                path is None
                and not Path("~/.kube/config").expanduser().exists()
                and os.environ.get("KUBERNETES_SERVICE_HOST")
            ):
                config.load_incluster_config()
                return self._kube.client.ApiClient(), None
            contexts, active = config.list_kube_config_contexts(config_file=path)
            chosen = (
                next((c for c in contexts if c["name"] == self.opts.context), None)
                if self.opts.context
                else active
            )
            if chosen is None:
                names = ", ".join(c["name"] for c in contexts)
                raise ConfigError(
                    f"provider.kubernetes.context: no context "
                    f"{self.opts.context!r} in the kubeconfig",
                    hint=f"known contexts: {names}",
                )
            api = config.new_client_from_config(config_file=path, context=chosen["name"])
        except config.ConfigException as exc:
            where = path or "~/.kube/config"
            raise ConfigError(
                f"provider.kubernetes.kubeconfig: cannot use {where}: {exc}",
                hint="point provider.kubernetes.kubeconfig (or $KUBECONFIG) at "
                "a valid kubeconfig, e.g. the one `spotwise emulate kubernetes` "
                "writes",
            ) from None
        return api, (chosen.get("context") or {}).get("namespace")

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One API call, its failures translated into the provider error tree."""
        rest = self._kube.client.exceptions
        try:
            return fn(*args, **kwargs)
        except rest.ApiException as exc:
            message = _api_message(exc)
            if exc.status == 401:
                raise ProviderUnavailableError(
                    f"the Kubernetes API rejected the credentials ({what}): {message}",
                    hint="refresh the kubeconfig's credentials",
                ) from None
            if exc.status == 403:
                raise ProviderError(
                    f"not allowed to {what}: {message}",
                    hint="grant the Role in docs/control.md (Kubernetes RBAC)",
                ) from None
            if exc.status in (429, 500, 502, 503, 504) or exc.status == 0:
                raise TransientProviderError(f"{what}: {exc.status} {message}") from None
            raise
        except (self._urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientProviderError(
                f"cannot reach the Kubernetes API ({what}): {exc}"
            ) from None

    def _preflight(self) -> None:
        """Refuse before anything is created: unreachable API, missing namespace or PVC, a
        cluster whose nodes cannot run the job (no GPU resource, no spot label)."""
        rest = self._kube.client.exceptions
        try:
            self._call("read the server version", self._kube.client.VersionApi(self._api).get_code)
        except TransientProviderError as exc:
            raise ProviderUnavailableError(
                exc.message,
                hint="check the kubeconfig's server, or start `spotwise emulate kubernetes`",
            ) from None
        try:
            try:
                self._call("read the namespace", self._core.read_namespace, self.namespace)
            except ProviderError as exc:
                if type(exc) is not ProviderError:  # unreachable, credentials: not RBAC
                    raise
                # 403: namespaces are cluster-scoped, a namespaced Role cannot read them
                log.debug("namespace not checked: %s", exc.message)
            if self.opts.checkpoint_pvc:
                self._call(
                    "read the checkpoint volume claim",
                    self._core.read_namespaced_persistent_volume_claim,
                    self.opts.checkpoint_pvc,
                    self.namespace,
                )
        except rest.ApiException as exc:
            if exc.status != 404:
                raise
            field, value = (
                ("checkpoint_pvc", self.opts.checkpoint_pvc)
                if "persistentvolume" in _api_message(exc)
                else ("namespace", self.namespace)
            )
            raise ConfigError(
                f"provider.kubernetes.{field}: {value!r} does not exist in the "
                f"cluster ({_api_message(exc)})",
                hint=f"create it first, or change provider.kubernetes.{field}",
            ) from None
        if self.opts.kueue is not None:
            self._check_queue(self.opts.kueue.queue)
        if not self.opts.check_nodes:  # e.g. a pool the autoscaler scales up from zero
            return
        try:
            nodes = self._call("list nodes", self._core.list_node).items
        except ProviderError as exc:  # listing nodes needs a ClusterRole: skip, say so
            log.warning("cannot check the cluster's nodes (%s); launching anyway", exc.message)
            return
        self._check_nodes(nodes)

    def _check_queue(self, queue: str) -> None:
        """The LocalQueue exists: a Job sent to no queue (or to a cluster without Kueue) would
        stay suspended for ever."""
        rest = self._kube.client.exceptions
        try:
            self._call(
                "read the Kueue LocalQueue",
                self._kube.client.CustomObjectsApi(self._api).get_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                self.namespace,
                "localqueues",
                queue,
            )
        except ProviderError as exc:
            if type(exc) is not ProviderError:  # unreachable, credentials: not RBAC
                raise
            log.warning("cannot check the Kueue LocalQueue (%s); launching anyway", exc.message)
        except rest.ApiException as exc:
            if exc.status != 404:
                raise
            raise ConfigError(
                f"provider.kubernetes.kueue.queue: no LocalQueue {queue!r} in namespace "
                f"{self.namespace!r} ({_api_message(exc)})",
                hint="`kubectl get localqueues -n NAMESPACE` lists the queues; without Kueue in "
                "the cluster, remove provider.kubernetes.kueue",
            ) from None

    def _check_nodes(self, nodes: list[Any]) -> None:
        selector = dict(self.opts.node_selector)
        if self.opts.flavour is not None:
            key, value, _ = SPOT_LABELS[self.opts.flavour]
            selector[key] = value
        fits = [
            n
            for n in nodes
            if all((n.metadata.labels or {}).get(k) == v for k, v in selector.items())
        ]
        if not fits:
            wanted = ", ".join(f"{k}={v}" for k, v in selector.items())
            raise ConfigError(
                f"no node of the cluster carries the label(s) {wanted} that "
                f"provider.kubernetes.{'flavour' if self.opts.flavour else 'node_selector'} "
                "asks for",
                hint="add a spot node pool with that label, fix the flavour or "
                "node_selector, or (on-demand only) remove provider.kubernetes.flavour; if "
                "the pool scales up from zero nodes, set provider.kubernetes.check_nodes: false",
            )
        if self.gpu_count and not any(
            int((n.status.allocatable or {}).get(GPU, 0)) >= self.gpu_count for n in fits
        ):
            raise ConfigError(
                f"resources.gpu_count: {self.gpu_count} but no matching node of the cluster "
                f"has {self.gpu_count} allocatable {GPU}",
                hint="add a GPU node pool (with the NVIDIA device plugin) or lower "
                "resources.gpu_count",
            )

    # --- the four methods ---------------------------------------------------------------------
    def manifest(self, req: LaunchRequest) -> dict[str, Any]:
        """The Job of attempt ``req`` (what ``launch`` creates and ``--dry-run`` prints)."""
        argv = [_kube_word(a, req.env) for a in req.argv]  # expanded in the pod
        name = dns_name(req.key, req.nodes)
        if req.nodes * req.procs_per_node > 1:  # torch's launcher on each pod
            argv = list(
                launcher_argv(
                    argv,
                    python="python",
                    nodes=req.nodes,
                    procs_per_node=req.procs_per_node,
                    endpoint=f"{rendezvous_host(name)}:{self.opts.rendezvous_port}",
                    node_rank=f"$({INDEX_ENV})" if req.nodes > 1 else None,
                )
            )
        workdir: str | None = str(req.workdir)
        if req.code is not None:  # the pod's first step: the packed workdir, from S3
            argv = run_argv(req.code, self.opts.working_dir or MACHINE_DIR, argv)
            workdir = None
        from spotwise.control.secret_refs import kubernetes_secret_env

        # env_from's Kubernetes Secrets: secretKeyRef entries, as provider option secret_env
        refs = {**self.opts.secret_env, **kubernetes_secret_env(req.env_from)}
        return job_manifest(
            self.opts.model_copy(update={"secret_env": refs}),
            name=name,
            namespace=self.namespace,
            job_id=req.job_id,
            n=req.n,
            argv=argv,
            env=req.env,
            workdir=workdir,
            market=req.placement.market,
            gpu_count=self.gpu_count,
            cpus=self.cpus,
            nodes=req.nodes,
        )

    def manifests(self, req: LaunchRequest) -> list[dict[str, Any]]:
        """Everything attempt ``req`` creates, in creation order: the headless Service of a
        multi-node attempt first, so rank 0's name resolves as soon as its pod exists."""
        job = self.manifest(req)
        if req.nodes == 1:
            return [job]
        name = job["metadata"]["name"]
        return [
            service(self.opts, name=name, namespace=self.namespace, job_id=req.job_id, n=req.n),
            job,
        ]

    def launch(self, req: LaunchRequest) -> Handle:
        req.attempt_dir.mkdir(parents=True, exist_ok=True)
        (req.attempt_dir / "outcome.json").unlink(missing_ok=True)
        objects = self.manifests(req)
        for body in objects:
            self._create(body)
        name = objects[-1]["metadata"]["name"]
        handle = self._handle(req.job_id, name, req.n, req.attempt_dir.parent, req.nodes)
        if req.nodes > 1 and self.opts.kueue is None:  # (Kueue admits all pods or none)
            self._wait_placed(handle)
        return handle

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        selector = f"{LABEL_JOB}={job_id}"
        jobs = self._call(
            "list Jobs", self._batch.list_namespaced_job, self.namespace, label_selector=selector
        ).items
        try:
            services = self._call(
                "list Services",
                self._core.list_namespaced_service,
                self.namespace,
                label_selector=selector,
            ).items
        except ProviderError as exc:
            if type(exc) is not ProviderError:  # unreachable, credentials: not RBAC
                raise
            # a Role from before multi-node attempts: single-node jobs need no Service
            log.warning("cannot list Services (%s): only Jobs are swept", exc.message)
            services = []
        found: dict[str, Handle] = {}
        for obj in (*services, *jobs):  # a Service alone: a launch cut off before its Job
            completions = getattr(obj.spec, "completions", None)
            nodes = completions or (2 if obj.kind == "Service" else 1)
            n = int(obj.metadata.labels[LABEL_ATTEMPT])
            found[obj.metadata.name] = self._handle(
                job_id, obj.metadata.name, n, attempts_dir, nodes
            )
        return list(found.values())

    def status(self, handle: Handle) -> AttemptStatus:
        outcome = Path(handle["dir"]) / "outcome.json"
        if outcome.exists():
            doc = json.loads(outcome.read_text())
            return AttemptStatus(
                Phase(doc["phase"]),
                exit_code=doc["exit_code"],
                ended_at=doc["ended_at"],
                running_at=doc["running_at"],
                detail=doc["detail"],
            )
        jobs, pods = self._watching(handle["job_id"])
        name = handle["id"]

        def of_job(objs: list[Any]) -> list[Any]:
            return [p for p in objs if (p.metadata.labels or {}).get("job-name") == name]

        gone = {p.metadata.name for p in of_job(pods.gone())}
        mine = _first_pods([*of_job(pods.gone()), *of_job(pods.items())], gone)
        job = next((j for j in jobs.items() if j.metadata.name == name), None) or self._read_job(
            name
        )
        if not mine:
            if job is None:
                gone_job = AttemptStatus(Phase.LOST, detail="the Job was deleted")
                return self._settle(handle, [], gone_job)
            failed = _condition(job, "Failed")
            if failed is not None or _condition(job, "Complete") is not None:
                why = failed.message if failed is not None else "the Job ended without its pods"
                return self._settle(handle, [], AttemptStatus(Phase.LOST, detail=why))
            if job.metadata.deletion_timestamp is not None:
                return AttemptStatus(Phase.RUNNING, detail="the Job is being deleted")
            if job.spec.suspend:
                return AttemptStatus(Phase.QUEUED, detail=self._queue_detail(job))
            return AttemptStatus(Phase.STARTING, detail="waiting for the Job's pods")
        per_pod = [_pod_status(p, p.metadata.name in gone) for p in mine]
        missing = int(handle.get("nodes", 1)) - len(mine)
        per_pod += [AttemptStatus(Phase.STARTING, detail="pod not created yet")] * max(0, missing)
        if len(per_pod) == 1:
            status, stop_rest = per_pod[0], False
        else:  # one pod lost or failed ends the attempt, as one machine does on sim
            status, stop_rest = group_status(per_pod, now=time.time(), settle_s=self.opts.grace)
        if status.phase in (Phase.EXITED, Phase.LOST):
            evicted = self._eviction(job) if job is not None and status.exit_code != 0 else ""
            if evicted:
                status = replace(status, detail=evicted)
            return self._settle(handle, mine, status)
        if stop_rest and name not in self._stopping:  # the others get SIGTERM and save
            self._stopping.add(name)
            self._delete(handle, grace_s=round(self.opts.grace))
        if status.phase is Phase.RUNNING:
            stopping = any(p.metadata.deletion_timestamp is not None for p in mine)
            if stopping or time.monotonic() - self._log_copied.get(name, 0.0) >= LOG_EVERY_S:
                for pod in mine:  # (a deleted pod's log goes with it)
                    if pod.metadata.name not in gone:
                        self._copy_log(handle, pod)
        return status

    def terminate(self, handle: Handle) -> None:
        """Delete the Job and its pods: each pod gets SIGTERM and ``grace_s`` to save."""
        self._delete(handle, grace_s=round(self.opts.grace))

    # --- launch helpers -----------------------------------------------------------------------
    def _create(self, body: dict[str, Any]) -> None:
        kind, name = body["kind"], body["metadata"]["name"]
        create = (
            self._batch.create_namespaced_job
            if kind == "Job"
            else self._core.create_namespaced_service
        )
        rest = self._kube.client.exceptions
        try:
            self._call(f"create the {kind}", create, self.namespace, body)
        except rest.ApiException as exc:
            if exc.status != 409:  # 409: created by a launch whose answer was lost: adopt it
                raise ProviderError(
                    f"the cluster refused {kind} {name}: {_api_message(exc)}"
                ) from None

    def _wait_placed(self, handle: Handle) -> None:
        """All pods of a multi-node attempt placed on nodes within ``capacity_wait_s``, or none:
        the attempt is deleted and the launch is "no capacity" (the controller then tries
        elsewhere, or fewer nodes down to ``min_nodes``). A half-placed attempt would hold
        nodes that do nothing while the rest wait."""
        selector = f"{LABEL_JOB}={handle['job_id']},{LABEL_ATTEMPT}={handle['n']}"
        deadline = time.monotonic() + self.opts.capacity_wait_s
        while True:
            pods = self._call(
                "list the attempt's pods",
                self._core.list_namespaced_pod,
                self.namespace,
                label_selector=selector,
            ).items
            placed = [p for p in pods if p.spec.node_name]
            if len(placed) >= handle["nodes"]:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(min(self.opts.poll_s, 1.0))
        why = next(
            (
                c.message
                for p in pods
                for c in (p.status.conditions or [] if p.status else [])
                if c.type == "PodScheduled" and c.status == "False" and c.message
            ),
            "",
        )
        self._delete(handle, grace_s=0, propagation="Background")
        raise CapacityError(
            f"{len(placed)} of the {handle['nodes']} pods of the attempt could be placed in "
            f"{self.opts.capacity_wait_s:g}s" + (f" ({why})" if why else ""),
            hint="another zone or market, fewer nodes (min_nodes), or a longer "
            "provider.kubernetes.capacity_wait_s for a pool that scales up",
        )

    # --- status helpers -----------------------------------------------------------------------
    def _handle(self, job_id: str, name: str, n: int, attempts_dir: Path, nodes: int) -> Handle:
        return {
            "n": n,
            "id": name,
            "job_id": job_id,
            "namespace": self.namespace,
            "nodes": nodes,
            "dir": str(attempts_dir / str(n)),
            "log": str(attempts_dir.parent / "job.log"),
        }

    def _watching(self, job_id: str) -> tuple[_Informer, _Informer]:
        if job_id not in self._informers or not all(i.alive for i in self._informers[job_id]):
            selector = f"{LABEL_JOB}={job_id}"
            self._informers[job_id] = (
                _Informer(self._kube, self._batch.list_namespaced_job, self.namespace, selector),
                _Informer(self._kube, self._core.list_namespaced_pod, self.namespace, selector),
            )
        jobs, pods = self._informers[job_id]
        if not (jobs.synced.wait(10) and pods.synced.wait(10)):
            raise TransientProviderError(
                f"cannot watch the job's Jobs and pods: {jobs.error or pods.error or 'no answer'}"
            )
        return jobs, pods

    def _read_job(self, name: str) -> Any:
        """A Job the watch has not shown (yet): ask the API, None if it does not exist."""
        rest = self._kube.client.exceptions
        try:
            return self._call("read the Job", self._batch.read_namespaced_job, name, self.namespace)
        except rest.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _workload(self, job: Any) -> dict[str, Any] | None:
        """Kueue's Workload of ``job`` (found by Kueue's ``job-uid`` label), None where there
        is none yet or the credentials may not read Workloads (only details are lost)."""
        rest = self._kube.client.exceptions
        try:
            found = self._call(
                "read the Job's Kueue Workload",
                self._kube.client.CustomObjectsApi(self._api).list_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                self.namespace,
                "workloads",
                label_selector=f"kueue.x-k8s.io/job-uid={job.metadata.uid}",
            )
        except (ProviderError, rest.ApiException) as exc:
            log.debug("no Workload of %s: %s", job.metadata.name, exc)
            return None
        items = found.get("items") or []
        return items[0] if items else None

    def _queue_detail(self, job: Any) -> str:
        """Why a suspended Job waits: Kueue's own words (``QuotaReserved=False``) if it has any."""
        queue = (job.metadata.labels or {}).get(LABEL_QUEUE)
        what = f"waiting for admission by Kueue (LocalQueue {queue})" if queue else "suspended"
        workload = self._workload(job) if queue else None
        cond = _dict_condition(workload, "QuotaReserved", "False")
        return f"{what}: {cond.get('message')}" if cond and cond.get("message") else what

    def _eviction(self, job: Any) -> str:
        """Why an attempt's pods ended, where the Job was suspended under them: Kueue evicted
        (preempted) its workload ("" if not). Kueue may have admitted the Job again by now: its
        Workload then says ``Evicted=False``, "Previously: <why>"."""
        queue = (job.metadata.labels or {}).get(LABEL_QUEUE)
        if not queue:
            return "the Job was suspended" if job.spec.suspend else ""
        workload = self._workload(job)
        cond = _dict_condition(workload, "Evicted", "True") or _dict_condition(
            workload, "Evicted", "False"
        )
        if cond is None:
            return ""
        said = str(cond.get("message") or "").removeprefix("Previously: ")
        why = f"{cond.get('reason')}: {said}" if cond.get("status") == "True" else said
        return f"evicted by Kueue (LocalQueue {queue}): {why}"

    def _settle(self, handle: Handle, pods: list[Any], status: AttemptStatus) -> AttemptStatus:
        """Keep the outcome and the pods' output, then delete the Job (and the attempt's
        Service): nothing is left behind."""
        for pod in pods:
            self._copy_log(handle, pod, final=True)
        outcome = Path(handle["dir"]) / "outcome.json"
        outcome.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            outcome,
            json.dumps(
                {
                    "phase": status.phase.value,
                    "exit_code": status.exit_code,
                    "ended_at": status.ended_at,
                    "running_at": status.running_at,
                    "detail": status.detail,
                }
            ).encode(),
        )
        self._delete(handle, grace_s=0)
        self._stopping.discard(handle["id"])
        return status

    def _copy_log(self, handle: Handle, pod: Any, final: bool = False) -> None:
        """Append the part of the pod's output the job log does not have yet (so ``spotwise
        logs -f`` follows a running pod); how much was copied is kept in the attempt directory,
        so a restarted controller neither repeats nor skips lines."""
        self._log_copied[handle["id"]] = time.monotonic()
        rest = self._kube.client.exceptions
        try:
            # The raw body, decoded here: kubernetes-client 36 deserializes the text/plain log
            # into the repr of its bytes ("b'...'"); the undecoded response reads the same in
            # every client version.
            response = self._call(
                "read the pod's log",
                self._core.read_namespaced_pod_log,
                pod.metadata.name,
                self.namespace,
                _preload_content=False,
            )
        except rest.ApiException:  # the pod is already gone: its output went with it
            return
        text = response.data.decode("utf-8", errors="replace")
        mark = Path(handle["dir"]) / "log-copied.json"
        try:
            done = json.loads(mark.read_text())
        except (FileNotFoundError, ValueError):
            done = {}
        start = int(done.get(pod.metadata.name, 0))
        if start > len(text):  # the kubelet rotated the log: copy what is there now
            start = 0
        new = text[start:]
        if final and new and not new.endswith("\n"):
            new += "\n"
        if new:
            with open(handle["log"], "a", encoding="utf-8") as out:
                out.write(new)
        mark.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(mark, json.dumps({**done, pod.metadata.name: start + len(new)}).encode())

    def _delete(self, handle: Handle, grace_s: int, propagation: str = "Foreground") -> None:
        """Delete the attempt's Job with its pods (Foreground: the batch API's default, Orphan,
        would leave them running) and its Service; idempotent."""
        rest = self._kube.client.exceptions
        name = handle["id"]
        calls = [
            (
                "Job",
                self._batch.delete_namespaced_job,
                {"propagation_policy": propagation, "grace_period_seconds": grace_s},
            )
        ]
        if int(handle.get("nodes", 1)) > 1:
            calls.append(("Service", self._core.delete_namespaced_service, {}))
        for kind, delete, options in calls:
            try:
                self._call(f"delete the {kind}", delete, name, self.namespace, **options)
            except rest.ApiException as exc:
                if exc.status != 404:  # already gone: terminate is idempotent
                    raise ProviderError(
                        f"cannot delete {kind} {name}: {_api_message(exc)}"
                    ) from None

    # --- the pod's checkpoints ---------------------------------------------------------------
    def _checkpoint_home(self) -> CheckpointHome:
        """The claim's mount (one directory per job), or an object store: what outlives a pod."""
        mount = self.opts.checkpoint_mount
        if self.opts.checkpoint_pvc:
            return CheckpointHome(
                default=f"{mount}/{{job_id}}",
                durable=(f"{mount}/", "s3://"),
                hint=f"give checkpoint_dir under {mount}/ (the volume claim "
                f"{self.opts.checkpoint_pvc!r} is mounted there) or as an s3:// URI, or leave "
                f"it out: each job then checkpoints to {mount}/<job id>",
            )
        return CheckpointHome(
            default=None,
            durable=("s3://",),
            hint="set provider.kubernetes.checkpoint_pvc (a PersistentVolumeClaim, mounted at "
            f"{mount}) or give checkpoint_dir as an s3:// URI",
        )


def _first_pods(pods: list[Any], gone: set[str]) -> list[Any]:
    """The attempt's pods: the first of each completion index, in index order. A later pod of
    an index is Kubernetes starting the Job again after the attempt ended (Kueue re-admitting
    an evicted workload before the Job was deleted): not the attempt's.

    Creation times are whole seconds, so an eviction within a second of the start leaves two
    pods of one time; the Job makes a replacement only once the pod before it is ending, so of
    those the one deleted, being deleted or ended came first (never the one a name sorts first:
    names end in random letters)."""

    def order(pod: Any) -> tuple[float, bool, str]:
        ended = (
            pod.metadata.name in gone
            or pod.metadata.deletion_timestamp is not None
            or (pod.status is not None and pod.status.phase in ("Succeeded", "Failed"))
        )
        created = _timestamp(pod.metadata.creation_timestamp) or 0.0
        return (created, not ended, pod.metadata.name)

    by_index: dict[int, list[Any]] = {}
    for pod in pods:
        index = _completion_index(pod)
        if index is not None:
            by_index.setdefault(index, []).append(pod)
    return [min(by_index[i], key=order) for i in sorted(by_index)]


def _completion_index(pod: Any) -> int | None:
    """The pod's completion index (0 without one); None for a value the Job controller never
    writes: a pod someone made by hand with the Job's labels, which is not the attempt's."""
    text = (pod.metadata.labels or {}).get(INDEX_LABEL, "0")
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 9):
        return None
    return int(text)


def _pod_status(pod: Any, gone: bool) -> AttemptStatus:
    """One pod's part of the attempt; ``gone``: the pod object was deleted (its last state)."""
    phase = pod.status.phase if pod.status else None
    state = _container_state(pod)
    if phase in ("Succeeded", "Failed") or gone:
        return _pod_end(pod, (pod.status.message if pod.status else "") or "")
    if state is not None and state.waiting is not None and state.waiting.reason in _FATAL_WAITING:
        return AttemptStatus(
            Phase.EXITED, exit_code=None, detail=f"{state.waiting.reason}: {state.waiting.message}"
        )
    if phase == "Running":
        running_at = _timestamp(state.running.started_at) if state and state.running else None
        return AttemptStatus(Phase.RUNNING, running_at=running_at)
    scheduled = _condition(pod, "PodScheduled", "False")
    detail = (
        scheduled.message
        if scheduled is not None
        else (state.waiting.reason if state is not None and state.waiting else "Pending")
    )
    return AttemptStatus(Phase.STARTING, detail=detail or "Pending")


def _pod_end(pod: Any, why: str) -> AttemptStatus:
    """How an ended pod ended: its exit code, or *lost* when the pod was taken away (a
    disruption, or a deletion) and the process did not end by itself (0 or 75)."""
    state = _container_state(pod)
    term = state.terminated if state is not None else None
    code = term.exit_code if term is not None else None
    ended_at = _timestamp(term.finished_at) if term is not None else None
    running_at = _timestamp(term.started_at) if term is not None else None
    disrupted = _condition(pod, "DisruptionTarget")
    deleted = pod.metadata.deletion_timestamp is not None
    if code is not None and ((disrupted is None and not deleted) or code in (0, 75)):
        return AttemptStatus(
            Phase.EXITED, exit_code=code, ended_at=ended_at, running_at=running_at, detail=why
        )
    reason = (
        f"{disrupted.reason}: {disrupted.message}"
        if disrupted is not None
        else "the pod was deleted before it could save"
        if deleted or code is None
        else why
    )
    return AttemptStatus(
        Phase.LOST,
        exit_code=code,
        ended_at=ended_at,
        running_at=running_at,
        detail=reason or "pod gone",
    )


def _dict_condition(obj: dict[str, Any] | None, ctype: str, status: str) -> dict[str, Any] | None:
    """A condition of a custom object read as plain data (a Kueue Workload), or None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == status:
            return dict(cond)
    return None


def _container_state(pod: Any) -> Any:
    statuses = (pod.status.container_statuses or []) if pod.status else []
    return statuses[0].state if statuses else None


def _condition(obj: Any, ctype: str, status: str = "True") -> Any:
    """The object's condition of type ``ctype`` in ``status``, or None."""
    for cond in (obj.status.conditions or []) if obj.status else []:
        if cond.type == ctype and cond.status == status:
            return cond
    return None


def _kube_word(word: str, env: dict[str, str]) -> str:
    """One command word with its ``$NAME`` references to the container's env as Kubernetes'
    ``$(NAME)``, which the kubelet expands in the pod; other ``$`` are escaped (``$$``)."""
    return "".join(
        f"$({text})" if var else text.replace("$", "$$") for text, var in remote_words(word, env)
    )


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)
