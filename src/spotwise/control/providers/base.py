"""The Provider protocol: launch / status / terminate / find attempts; features and prices as data.

A provider knows machines, not jobs: the controller decides what to run and where, the provider
only carries it out and reports back in these plain values. Everything the controller needs to
*decide* (can it run spot, does it requeue by itself, how the notice arrives, how long the grace
is, what each placement costs) is plain data on the provider, so the controller branches on
features and never on a provider's name. Reachability and credential checks are part of
construction (``preflight=True``), so a bad setting fails before any machine is paid for.

Vendor failures are translated into ``ProviderError`` subclasses at the edge:
``TransientProviderError`` (retry, never a preemption), ``ProviderUnavailableError`` (daemon down,
credentials missing) and ``CapacityError`` (no machine of that kind right now).
"""

from __future__ import annotations

import difflib
import enum
import string
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from spotwise.control.secret_refs import SecretRef
from spotwise.control.workdir import CodeArchive
from spotwise.errors import ConfigError

MARKETS = ("spot", "on-demand")


@dataclass(frozen=True)
class Placement:
    market: str  # "spot" | "on-demand"
    zone: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a provider needs to start attempt ``n`` of a job."""

    job_id: str
    n: int
    # a remote provider's (``same_host=False``) argv is the job's command as written: its
    # machine expands the ``$NAME`` references in ``env`` (``remote_words``)
    argv: tuple[str, ...]
    workdir: Path
    env: dict[str, str]
    log_path: Path
    attempt_dir: Path
    placement: Placement
    grace_s: float = 30.0
    nodes: int = 1  # machines of this attempt (job's nodes, or fewer down to min_nodes)
    procs_per_node: int = 1  # training processes per machine (torchrun ranks)
    # secrets the machine resolves itself (Kubernetes Secret, AWS SSM / Secrets Manager):
    # references only, see spotwise.control.secret_refs; file references are already in env
    env_from: Mapping[str, SecretRef] = field(default_factory=dict)
    # the packed workdir (``workdir: pack:PATH``): unpacked on the machine, the command run in
    # it (``workdir`` is then the controller's folder it came from); None: run in ``workdir``
    code: CodeArchive | None = None

    @property
    def key(self) -> str:
        """A name unique to this attempt, used to find it again after a controller crash."""
        return attempt_key(self.job_id, self.n)


def attempt_key(job_id: str, n: int) -> str:
    return f"spotwise-{job_id}-{n}"


class Phase(str, enum.Enum):
    # waiting for admission by the cluster's queue (Kueue): no machine held, nothing billed
    QUEUED = "queued"
    STARTING = "starting"  # provisioning / queued: billed (cloud) but not training yet
    RUNNING = "running"
    EXITED = "exited"  # the command ended with ``exit_code``
    LOST = "lost"  # the machine went away (killed, vanished) with no exit code


@dataclass(frozen=True)
class AttemptStatus:
    phase: Phase
    exit_code: int | None = None
    ended_at: float | None = None  # wall time, when the provider knows it
    running_at: float | None = None
    restarts: int = 0  # times the provider relaunched it by itself (SLURM requeue)
    detail: str = ""


@dataclass(frozen=True)
class Pricing:
    """What one attempt costs: ``usd_per_hour`` over billed hours = wall seconds x time_scale."""

    usd_per_hour: float = 0.0
    ondemand_usd_per_hour: float = 0.0
    time_scale: float = 1.0


class NoticeKind(str, enum.Enum):
    """How a training process learns that its machine is going away."""

    SIGNAL = "signal"  # SIGTERM from the machine (local process, sim, a pod's kubelet)
    SLURM = "slurm"  # SLURM's --signal before the end time
    AWS_IMDS = "aws-imds"  # EC2 spot/instance-action on the instance metadata service
    GCP_METADATA = "gcp-metadata"  # instance/preempted on the GCE metadata server
    NONE = "none"  # nothing warns (the machine just vanishes)


@dataclass(frozen=True)
class CheckpointHome:
    """Where a provider's machines keep checkpoints that outlive them (an object store, a
    volume): a machine's own disk is lost with it, so a checkpoint directory anywhere else
    would make every attempt start again from step 0."""

    default: str | None  # a job's directory there ("{job_id}" is its id); None: none by default
    durable: tuple[str, ...]  # what a job's own checkpoint_dir may start with
    hint: str  # the fix, in the job file's words


@dataclass(frozen=True)
class Features:
    zones: tuple[str, ...]  # where attempts can be placed; never empty
    spot: bool = False  # can run on an interruptible market
    # one attempt can span several machines and processes (torch's launcher on each)
    multi_node: bool = False
    self_requeue: bool = False  # relaunches a preempted attempt itself (SLURM --requeue)
    notice: NoticeKind = NoticeKind.SIGNAL
    poll_s: float = 0.1  # how often the controller should ask for status
    grace_s: float = 30.0  # notice-to-kill time the training process gets (SPOTWISE_GRACE_S)
    # SPOTWISE_PLATFORM for the attempt: "none" where it runs on no cloud (never probe metadata),
    # None to let the runtime detect the platform it lands on.
    platform: str | None = None
    # Attempts run on the controller's own host: they get its environment and interpreter. A
    # remote machine gets only the job's ``env`` and SPOTWISE_* (never the controller's
    # credentials) and runs ``python`` as found there.
    same_host: bool = True
    # Where checkpoints survive the machine; None where the machine is the controller's host
    # (any path lasts: the job directory by default)
    checkpoints: CheckpointHome | None = None

    def __post_init__(self) -> None:
        if not self.zones:
            raise ValueError("a provider has at least one zone")


def checkpoint_dir(provider: str, features: Features, given: str | None, job_id: str) -> str | None:
    """The checkpoint directory a job's machines use (``$SPOTWISE_CHECKPOINT_DIR``): the job
    file's, else the provider's durable default; None: the controller's job directory.

    A directory the machine cannot reach after it is gone (a local path on a cloud instance,
    a path outside the pod's volume) is refused: the job would never resume."""
    home = features.checkpoints
    if home is None:
        return given
    if given is None and home.default is not None:
        return home.default.replace("{job_id}", job_id)
    if given is not None and any(given.startswith(p) for p in home.durable):
        return given
    what = (
        f"checkpoint_dir: {given!r} is on the machine's own disk"
        if given is not None
        else "checkpoint_dir is not set and there is no default"
    )
    raise ConfigError(
        f"{what}: a {provider} machine's disk is lost with it, so every attempt would start "
        "again from step 0",
        hint=home.hint,
    )


def remote_words(word: str, names: Collection[str]) -> list[tuple[str, bool]]:
    """One command word as ``(text, is_variable)`` parts, read as
    ``string.Template.safe_substitute`` reads it: ``$NAME`` / ``${NAME}`` of ``names`` are
    variables, anything else literal (``$$`` is ``$``, unknown names stay as written). A remote
    provider renders the variables in its machine's own syntax, so a reference such as
    ``$SPOTWISE_CHECKPOINT_DIR`` is expanded on the machine with the machine's value, and
    expands to exactly what the controller would have expanded on its own host."""
    parts: list[tuple[str, bool]] = []
    at = 0
    for m in string.Template.pattern.finditer(word):
        name = m.group("named") or m.group("braced")
        literal = "$" if m.group("escaped") is not None else None
        if literal is None and name not in names:
            continue  # not a reference we expand: stays in the literal text
        parts.append((word[at : m.start()], False))
        parts.append((literal, False) if literal is not None else (name, True))
        at = m.end()
    parts.append((word[at:], False))
    return [(text, var) for text, var in parts if text or var]


@dataclass(frozen=True)
class Prices:
    """What each placement costs, as data: ``{(market, zone): Pricing}`` for every zone."""

    table: dict[tuple[str, str], Pricing] = field(default_factory=dict)
    # Whether a zone has spot capacity at a wall time, where the provider knows it (the sim's
    # trace); None where it cannot tell (a cloud: only a launch finds out)
    capacity: Callable[[str, float], bool] | None = None

    def has_capacity(self, zone: str, at_s: float) -> bool:
        return self.capacity is None or self.capacity(zone, at_s)

    @classmethod
    def flat(cls, zones: tuple[str, ...], usd_per_hour: float) -> Prices:
        """One price everywhere, for spot and on-demand alike (local, SLURM)."""
        p = Pricing(usd_per_hour, usd_per_hour, 1.0)
        return cls({(m, z): p for m in MARKETS for z in zones})

    def of(self, placement: Placement) -> Pricing:
        """The price of a placement; an empty zone means the first (default) zone."""
        zone = placement.zone or next(iter(self.table))[1]
        try:
            return self.table[(placement.market, zone)]
        except KeyError:
            raise ConfigError(
                f"no {placement.market} price for zone {zone!r}",
                hint="known: " + ", ".join(sorted({z for _, z in self.table})),
            ) from None


Handle = dict[str, Any]  # JSON-serializable, stored with the attempt; always has "n" and "id"


@runtime_checkable
class Provider(Protocol):
    """Four methods; everything else is data. ``__init__(options, *, epoch, instance_type,
    preflight=False, resources=None)`` validates options (``Options`` model) and, with
    ``preflight``, checks that the provider is reachable with the given settings and can give
    a machine the job's ``resources`` (GPUs, CPUs). Optional: ``end_fd(handle)``, a descriptor
    that becomes readable when the attempt's machine ends (the sim and local providers' pidfd),
    which ``spotwise server`` waits on instead of polling a running machine."""

    name: str
    features: Features

    @property
    def prices(self) -> Prices:
        """What the provider charges (an attribute or a property: callers only read it)."""

    def launch(self, req: LaunchRequest) -> Handle:
        """Start attempt ``req``; ``CapacityError`` when there is no machine of that kind."""

    def status(self, handle: Handle) -> AttemptStatus: ...

    def terminate(self, handle: Handle) -> None:
        """Stop the attempt (notice first, so it can save) and free its machine; idempotent."""

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        """Every attempt of the job the provider still holds (live, or ended with an outcome
        not yet read), each handle with its attempt number ``n`` and provider-unique ``id``:
        how a restarted controller adopts a launch it lost and sweeps orphans.
        ``attempts_dir`` is ``<job dir>/attempts``, beside the job's ``job.log``."""


class Options(BaseModel):
    """Base of each provider's typed options: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


OptionsT = TypeVar("OptionsT", bound=Options)


def parse_options(model: type[OptionsT], provider: str, options: dict[str, Any]) -> OptionsT:
    """Validate a provider's options; every problem names ``provider.<name>.<option>``."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        allowed = sorted(model.model_fields)
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(str(err["loc"][0]), allowed, n=1)
                detail = "unknown option" + (f"; did you mean {close[0]!r}?" if close else "")
            elif err["type"] == "missing":
                detail = "required option is missing"
            else:
                detail = f"{err['msg'].removeprefix('Value error, ')} (given: {err['input']!r})"
            lines.append(f"provider.{provider}.{where}: {detail}")
        raise ConfigError(
            "\n  ".join(lines),
            hint=f"options of provider {provider!r}: {', '.join(allowed) or 'none'}",
        ) from None


def adoptable(found: list[Handle], n: int) -> Handle | None:
    """The one launch of attempt ``n`` among ``find``'s answer (lowest id if a crash made two)."""
    mine = sorted((h for h in found if h["n"] == n), key=lambda h: str(h["id"]))
    return mine[0] if mine else None


def orphans(found: list[Handle], live_n: int | None, live: Handle | None) -> list[Handle]:
    """What ``find`` reported that no live attempt owns: everything except the open attempt
    (by its stored handle, which a self-requeued attempt shares with its predecessor, or, when
    its handle was lost in a crash, by the launch that will be adopted)."""
    keep = live if live is not None else (adoptable(found, live_n) if live_n is not None else None)
    keep_id = None if keep is None else str(keep["id"])
    return [h for h in found if str(h["id"]) != keep_id]
