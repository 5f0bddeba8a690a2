"""The kubelet: runs a bound pod's container as a local process and reports it.

- Runs the container's ``command`` + ``args`` (``$(VAR)`` expanded) as a local process in its own
  process group and its own root directory (``machine_root``) with the container's ``env``
  (values, secret and field references), ``workingDir`` and stdout/stderr kept for ``/log``. The
  image is not pulled: the "image" is this machine's Python, spotwise and the job's code
  (``image``), as copy-on-write layers; a PVC volume is a host directory mounted at its
  ``mountPath``; whatever else the pod writes is gone with it. Where no mount namespace can be
  made (not root), the pod gets a fresh HOME on the host and paths under a ``mountPath`` are
  rewritten to the volume's host directory.
- Cluster DNS and network of a headless Service (``clusterIP: None``): every pod runs on this
  host's loopback, so a pod's name in the Service's subdomain (``<hostname>.<service>``, with or
  without ``.<namespace>.svc.cluster.local``) is 127.0.0.1, and each port the Service declares
  is given a free port of its own on 127.0.0.1 (two attempts' ``:29500`` would collide on one
  host). The kubelet writes both into the container's command and env values where the name
  appears (``<name>:<port>`` -> ``127.0.0.1:<its port>``): no resolver is involved, so a name
  the program builds itself from parts does not resolve.
- Evictions on a schedule, the way a spot node is reclaimed: the pod gets the
  ``DisruptionTarget`` condition, SIGTERM to its process group, SIGKILL after its grace period,
  then phase Failed (``shutdown``: graceful node shutdown, the pod object stays) or, in
  ``delete`` mode, the pod object is removed too (the node vanished and PodGC deleted it).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spotwise.emulators import machine_root
from spotwise.emulators.kubernetes.api import Obj, ObjectStore, rfc3339
from spotwise.emulators.kubernetes.status import has_condition, record_event, set_condition

GPU = "nvidia.com/gpu"
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


class Kubelet:
    """Runs the bound pods of ``store`` (every node's kubelet at once: they share this host)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        state_dir: Path,
        evict_after_s: list[float],
        evict_mode: str,
        shutdown_grace_s: float | None,
        image: tuple[str, ...],
    ) -> None:
        self.store = store
        self.state_dir = state_dir
        self.evict_after_s = evict_after_s  # the k-th pod to run is evicted after [k] s
        self.evict_mode = evict_mode
        self.shutdown_grace_s = shutdown_grace_s
        self.image = image
        self.evictions: list[str] = []  # names of the pods evicted, in order
        self.exits: dict[str, int] = {}  # pod name -> its container's exit code, once ended
        self._started = 0  # pods that reached Running
        self._evict_at: dict[str, float] = {}  # pod uid -> monotonic eviction time
        self._containers: dict[str, _Container] = {}  # pod uid -> its process
        self._ports: dict[tuple[str, int], int] = {}  # (Service uid, its port) -> loopback port

    def kill_all(self) -> None:
        """SIGKILL every container and wait for it: nothing outlives the emulator."""
        for c in self._containers.values():
            _signal_group(c.proc.pid, signal.SIGKILL)
            c.proc.wait(timeout=5)
        self._containers.clear()

    def read_log(self, pod: Obj) -> bytes:
        path = self._log_path(pod)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return b""

    def running(self) -> list[int]:
        """Pids of the containers still running."""
        return [c.proc.pid for c in self._containers.values() if c.proc.poll() is None]

    def sync(self, pod: Obj) -> bool:
        """One pass over ``pod``; False when it waits for a node (the scheduler's turn)."""
        meta = pod["metadata"]
        phase = pod.get("status", {}).get("phase")
        container = self._containers.get(meta["uid"])
        if container is not None:
            self._watch_container(pod, container)
        elif phase in ("Succeeded", "Failed"):
            if meta.get("deletionTimestamp"):
                self.store.remove("pods", meta["namespace"], meta["name"])
        elif meta.get("deletionTimestamp"):  # never started: nothing to stop
            self._end_pod(pod, None, reason="Killing")
            self.store.remove("pods", meta["namespace"], meta["name"])
        elif not pod["spec"].get("nodeName"):
            return False
        else:
            self._start(pod)
        return True

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

    def _command(
        self, namespace: str, spec: Obj, env: dict[str, str], mounts: dict[str, Path]
    ) -> tuple[list[str], dict[str, str], str | None]:
        """The container's argv, environment and working directory as its machine sees them:
        ``$(VAR)`` expanded, cluster DNS names on loopback, and without a mount namespace the
        volumes' host paths."""
        argv = [_expand(a, env) for a in [*(spec.get("command") or []), *(spec.get("args") or [])]]
        resolve = self._cluster_dns(namespace)
        if resolve is not None:
            argv = [resolve(a) for a in argv]
            env = {k: resolve(v) for k, v in env.items()}
        cwd = spec.get("workingDir")
        if not machine_root.isolated():
            env = {k: _remap(v, mounts) for k, v in env.items()}
            argv = [_remap(a, mounts) for a in argv]
            cwd = cwd and _remap(cwd, mounts)
        return argv, env, cwd

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        spec = pod["spec"]["containers"][0]
        env, missing = self._env(pod, spec)
        if missing is not None:
            waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": missing}}

            def config_error(p: Obj) -> None:
                p["status"]["containerStatuses"] = [_container_status(spec, waiting)]

            if self.store.update("pods", meta["namespace"], meta["name"], config_error) != pod:
                record_event(self.store, pod, "Failed", f"Error: {missing}", warning=True)
            return
        mounts = self._volumes(pod)
        argv, env, cwd = self._command(meta["namespace"], spec, env, mounts)
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
                _container_status(spec, {"running": {"startedAt": started}}, ready=True)
            ]
            set_condition(p, "Ready", "True", "")

        self.store.update("pods", meta["namespace"], meta["name"], running)
        record_event(self.store, pod, "Started", f"Started container {spec['name']}")
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
            self.evict(pod)
            return
        if meta.get("deletionTimestamp") and c.term_at is None:
            self._terminate(pod, c, float(meta.get("deletionGracePeriodSeconds", 30)))
        if c.term_at is not None and now - c.term_at >= c.kill_after_s:
            _signal_group(c.proc.pid, signal.SIGKILL)

    def _terminate(self, pod: Obj, c: _Container, grace_s: float) -> None:
        c.term_at, c.kill_after_s = time.monotonic(), grace_s
        record_event(
            self.store, pod, "Killing", f"Stopping container {pod['spec']['containers'][0]['name']}"
        )
        _signal_group(c.proc.pid, signal.SIGTERM)

    def evict(self, pod: Obj) -> None:
        """Take the pod's node away now (see the module docstring)."""
        meta = pod["metadata"]
        c = self._containers.get(meta["uid"])
        self._evict_at.pop(meta["uid"], None)
        reason = "DeletionByPodGC" if self.evict_mode == "delete" else "TerminationByKubelet"
        self.store.update(
            "pods",
            meta["namespace"],
            meta["name"],
            lambda p: set_condition(p, "DisruptionTarget", "True", reason, SHUTDOWN_MESSAGE),
        )
        self.evictions.append(meta["name"])
        record_event(
            self.store,
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

    def delete_pod(self, ns: str, name: str, grace: int | None) -> None:
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
            set_condition(p, "Ready", "False", "PodCompleted")
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


def _container_status(spec: Obj, state: Obj, *, ready: bool = False) -> Obj:
    """The pod's one container status: waiting (not ready) or running (ready, started)."""
    status = {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "ready": ready,
        "restartCount": 0,
        "imageID": "",
        "state": state,
    }
    if ready:
        status["started"] = True
    return status
