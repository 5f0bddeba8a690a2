"""``slurm``: each attempt is a batch job (``sbatch --requeue --signal``) on a SLURM cluster.

SLURM relaunches a preempted or requeued job by itself under the same job id; the controller sees
that as the restart count going up (``scontrol show job``: ``Restarts=``) and records a new
attempt without submitting anything. ``--signal=B:SIG@secs`` asks SLURM to signal the training
process before its end time; the runtime's SLURM detector reads that signal and the end time.
The batch script ``exec``s the command, so the training process is the batch step's process and
gets SLURM's SIGTERM on preemption or requeue directly. An attempt of several processes asks
for ``--nodes`` / ``--ntasks-per-node`` and runs torch's launcher (``spotwise.runtime.launch``)
once per node with ``srun``; the launcher keeps the ranks' exit 75 as the job's exit code.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from spotwise.control.providers.base import (
    AttemptStatus,
    Features,
    Handle,
    LaunchRequest,
    NoticeKind,
    Options,
    Phase,
    Prices,
    attempt_key,
    parse_options,
)
from spotwise.control.providers.torchrun import launcher_argv
from spotwise.control.workdir import unpack_shell
from spotwise.errors import (
    ProviderError,
    ProviderUnavailableError,
    TransientProviderError,
)

if TYPE_CHECKING:
    from spotwise.control.resources import Resources

_PENDING = {
    "PENDING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "CONFIGURING",
    "RESIZING",
    "SUSPENDED",
}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
_LOST = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "DEADLINE", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY"}


def _run(argv: list[str], timeout_s: float = 30.0) -> str:
    """Run a SLURM command; translate its failures into our provider errors."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise ProviderUnavailableError(
            f"SLURM command {argv[0]!r} is not installed",
            hint="install slurm-wlm (scripts/slurm-up.sh starts a local cluster)",
        ) from None
    except subprocess.TimeoutExpired:
        raise TransientProviderError(f"{argv[0]} timed out after {timeout_s:.0f}s") from None
    if done.returncode != 0:
        err = (done.stderr or done.stdout).strip()
        if (
            "Unable to contact slurm controller" in err
            or "Connection refused" in err
            or "Socket timed out" in err
        ):
            raise TransientProviderError(
                f"{argv[0]} cannot reach slurmctld: {err}",
                hint="is slurmctld running? (scontrol ping)",
            )
        raise ProviderError(f"{shlex.join(argv)} failed: {err}")
    return done.stdout


def parse_show_job(text: str) -> dict[str, str]:
    """``scontrol show job -o`` output (one line of Key=Value) -> dict."""
    fields: dict[str, str] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


class SlurmOptions(Options):
    partition: str | None = None
    signal: str = Field(default="USR1", pattern=r"^[A-Z0-9]+$")
    signal_s: int = Field(default=60, ge=1)
    time_limit: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    usd_per_hour: float = Field(default=0.0, ge=0)


class SlurmProvider:
    name = "slurm"
    Options = SlurmOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
    ):
        opts = parse_options(SlurmOptions, self.name, options)
        self.partition, self.signal, self.signal_s = opts.partition, opts.signal, opts.signal_s
        self.time_limit, self.extra_args = opts.time_limit, opts.extra_args
        self.features = Features(
            zones=("slurm",),
            spot=False,
            multi_node=True,
            self_requeue=True,
            notice=NoticeKind.SLURM,
            poll_s=0.5,
            grace_s=30.0,
        )
        self.prices = Prices.flat(self.features.zones, opts.usd_per_hour)
        if preflight:
            self._ping()

    def _ping(self) -> None:
        """Fail at submit time, with the fix, when slurmctld cannot be reached."""
        try:
            _run(["scontrol", "ping"], timeout_s=15)
        except TransientProviderError as exc:
            raise ProviderUnavailableError(exc.message, hint=exc.hint) from None
        except ProviderError as exc:  # ping exits 1 when the controller is DOWN
            raise ProviderUnavailableError(
                f"slurmctld is not reachable: {exc.message}", hint="start it (scripts/slurm-up.sh)"
            ) from None

    def _script(self, req: LaunchRequest) -> Path:
        exports = "\n".join(
            f"export {k}={shlex.quote(v)}"
            for k, v in sorted(req.env.items())
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
        )
        script = req.attempt_dir / "batch.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"# spotwise job {req.job_id} attempt {req.n}\n"
            f"{exports}\n"
            'export SPOTWISE_ATTEMPT_RESTARTS="${SLURM_RESTART_COUNT:-0}"\n'
            'echo "[spotwise] slurm job $SLURM_JOB_ID start"'
            ' "(restart ${SLURM_RESTART_COUNT:-0})"\n'
            f"{self._enter(req)}\n"
            f"{self._command(req)}\n"
        )
        script.chmod(0o700)
        return script

    @staticmethod
    def _enter(req: LaunchRequest) -> str:
        """Into the job's folder: the packed code unpacked beside the attempt's files (the
        controller's job directory, shared with the nodes as the log is), or the workdir."""
        if req.code is None:
            return f"cd {shlex.quote(str(req.workdir))}"
        return unpack_shell(req.code, str(req.attempt_dir / "workdir"), sys.executable)

    @staticmethod
    def _command(req: LaunchRequest) -> str:
        """The batch step: the command itself, or ``srun`` starting torch's launcher once per
        node (the rendezvous store on the allocation's first node, torch deciding by host
        name which node serves it). ``exec``: SLURM's signals reach srun, which passes them on
        to the launchers, which pass them on to the ranks."""
        if req.nodes * req.procs_per_node == 1:
            return f"exec {shlex.join(req.argv)}"
        launcher = launcher_argv(
            req.argv, python=sys.executable, nodes=req.nodes, procs_per_node=req.procs_per_node
        )
        rdzv = (
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
            'export PET_RDZV_ENDPOINT="$head:$((20000 + SLURM_JOB_ID % 20000))"\n'
            'export PET_RDZV_ID="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"\n'
            if req.nodes > 1
            else ""
        )
        # --export=ALL: the step gets the script's environment (sbatch --export=NONE would
        # otherwise carry over to srun through SLURM_EXPORT_ENV)
        srun = ["srun", "--export=ALL", f"--ntasks={req.nodes}", "--ntasks-per-node=1"]
        srun.append(f"--cpus-per-task={req.procs_per_node}")
        return f"{rdzv}exec {shlex.join([*srun, *launcher])}"

    def launch(self, req: LaunchRequest) -> Handle:
        req.attempt_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            "sbatch",
            "--parsable",
            "--requeue",
            "--open-mode=append",
            f"--signal=B:{self.signal}@{self.signal_s}",
            f"--job-name={req.key}",
            f"--output={req.log_path}",
            f"--chdir={req.attempt_dir if req.code is not None else req.workdir}",
            "--export=NONE",
            f"--nodes={req.nodes}",
            f"--ntasks-per-node={req.procs_per_node}",
        ]
        if self.partition:
            argv.append(f"--partition={self.partition}")
        if self.time_limit:
            argv.append(f"--time={self.time_limit}")
        argv += [*self.extra_args, str(self._script(req))]
        job_id = _run(argv).strip().split(";")[0]
        return {"n": req.n, "id": job_id, "slurm_job_id": job_id}

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        """Queued or running SLURM jobs named after the job's attempts (``spotwise-JOB-N``)."""
        prefix = attempt_key(job_id, 0)[:-1]
        found = []
        for line in _run(["squeue", "-h", "-o", "%i %j"]).splitlines():
            slurm_id, _, name = line.strip().partition(" ")
            n = name.removeprefix(prefix)
            if name.startswith(prefix) and n.isdigit():
                found.append({"n": int(n), "id": slurm_id, "slurm_job_id": slurm_id})
        return found

    def status(self, handle: Handle) -> AttemptStatus:
        job_id = handle["slurm_job_id"]
        try:
            info = parse_show_job(_run(["scontrol", "-o", "show", "job", job_id]))
        except TransientProviderError:
            raise
        except ProviderError as exc:
            if "Invalid job id" in exc.message:  # purged from slurmctld's memory
                return AttemptStatus(Phase.LOST, detail=f"slurm job {job_id} is gone")
            raise
        state = info.get("JobState", "UNKNOWN")
        restarts = int(info.get("Restarts", "0") or 0)
        if state in _PENDING:
            return AttemptStatus(Phase.STARTING, restarts=restarts, detail=state)
        if state in _RUNNING:
            return AttemptStatus(Phase.RUNNING, restarts=restarts, detail=state)
        code = int(info.get("ExitCode", "0:0").split(":")[0])
        if state == "COMPLETED" or (state == "FAILED" and code != 0):
            return AttemptStatus(Phase.EXITED, exit_code=code, restarts=restarts, detail=state)
        if state in _LOST or state == "FAILED":
            return AttemptStatus(Phase.LOST, restarts=restarts, detail=state)
        raise TransientProviderError(f"slurm job {job_id} is in unknown state {state}")

    def terminate(self, handle: Handle) -> None:
        _run(["scancel", "--full", handle["slurm_job_id"]])
