"""JobSpec: the job file (YAML) a user hands to ``spotwise launch``, validated at the boundary.

Every mistake becomes one :class:`~spotwise.errors.ConfigError` that names the key as the user
wrote it, what was given and what is allowed, so a user fixes the file in one go instead of
reading a traceback. Everything that can be checked before a job exists (names, deadlines, the
working directory) is checked here, so a bad file never leaves a job behind in the store.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import shlex
import time
from collections.abc import Callable
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from spotwise.control.jobfile import printable, read_job_file, shown, value_problems
from spotwise.control.resources import Resources
from spotwise.control.secret_refs import SecretRef, check_refs, missing_files, plain_secret_keys
from spotwise.control.workdir import split_workdir
from spotwise.durations import DURATION, parse_duration_s
from spotwise.errors import ConfigError, ControlError, UnknownBackendError
from spotwise.telemetry.webhooks import Notify

log = logging.getLogger(__name__)

MARKETS = ("spot", "on-demand", "auto")
DEFAULT_UNSUPERVISED_LIMIT_S = 3600.0  # what a control plane gone for good costs at most
MIN_UNSUPERVISED_LIMIT_S = 1.0  # below it, a late renewal would stop healthy machines
_MAX_DETAIL = 400  # characters of one error's explanation
_MAX_LINES = 20  # error lines shown for one file (a generated file may have thousands)


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_deadline_s(value: Any, now_s: float) -> float:
    """Seconds from ``now_s`` to a deadline written as a duration from launch (``90s``, ``2h``,
    ``1d``, a number of seconds) or as an ISO-8601 timestamp, YAML-native or quoted.

    A timestamp without a zone means UTC, as YAML defines it for its own timestamps, so the
    file means the same on every machine. A deadline that has already passed is refused: the
    job would otherwise run on-demand without saying why.
    """
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, date) or (isinstance(value, str) and _is_date(value)):
        day = value.isoformat() if isinstance(value, date) else value.strip()
        raise ValueError(f"{day} is a date without a time of day; write e.g. {day}T18:00:00Z")
    elif isinstance(value, str) and not DURATION.match(value):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(
                f"{value!r} is neither a duration (90s, 15m, 2h, 1d) nor an ISO-8601 timestamp "
                "(2030-01-31T18:00:00Z)"
            ) from None
    else:
        seconds = parse_duration_s(value)
        if seconds <= 0:
            raise ValueError("a deadline of 0 leaves no time; give e.g. 2h or a future timestamp")
        return seconds
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    remaining = when.timestamp() - now_s
    if remaining <= 0:
        raise ValueError(
            f"{_utc(when.timestamp())} is in the past (now: {_utc(now_s)}); give a later time "
            "or a duration from launch such as 2h"
        )
    return remaining


def _is_date(text: str) -> bool:
    try:
        date.fromisoformat(text.strip())
    except ValueError:
        return False
    return True


class ProviderSpec(BaseModel):
    """Which provider runs the attempts and its options, typed by that provider's ``Options``
    model from the provider registry (so a plugin provider's options are checked too)."""

    model_config = ConfigDict(extra="forbid")
    name: str = "local"
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from spotwise.control.providers import PROVIDERS

        if v not in PROVIDERS:
            try:
                PROVIDERS.load(v)
            except UnknownBackendError as exc:  # names the known ones and the closest match
                raise ValueError(exc.message + (f"; {exc.hint}" if exc.hint else "")) from None
        return v

    @model_validator(mode="after")
    def _options(self) -> ProviderSpec:
        from spotwise.control.providers import check_options

        try:
            check_options(self.name, self.options)
        except ConfigError as exc:  # already names provider.<name>.<option>
            raise ValueError(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None
        return self


class JobSpec(BaseModel):
    """One training job: what to run, where, by when, for how much."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(default="job", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    command: list[str]
    workdir: str = "."  # a path, or pack:PATH / remote:PATH (spotwise.control.workdir)
    # set at submit for pack:PATH: the packed workdir in its store, <uri>/<sha256>.tar.gz
    workdir_archive: str | None = Field(default=None, pattern=r"/[0-9a-f]{64}\.tar\.gz$")
    checkpoint_dir: str | None = None  # default: $SPOTWISE_HOME/jobs/<id>/checkpoint
    resources: Resources = Field(default_factory=Resources)
    market: Literal["spot", "on-demand", "auto"] = "auto"
    policy: str = "uniform-progress"  # used when market is auto
    deadline_s: float | None = None  # after launch
    expected_runtime_s: float | None = None  # compute time without interruptions (estimates)
    # total steps: progress = committed steps
    steps: int | None = Field(default=None, ge=1, le=10**15)
    changeover_s: float | None = None  # losing a machine -> training again (policy's d)
    decision_interval_s: float | None = Field(default=None, gt=0)  # policy tick, wall seconds
    budget_usd: float | None = Field(default=None, gt=0)
    max_restarts: int = Field(default=0, ge=0, le=1000)  # on errors (exit not 0/75)
    restart_backoff_s: float = Field(default=2.0, ge=0)
    control_plane_timeout_s: float = Field(default=120.0, gt=0)
    zone_cooldown_s: float = Field(default=60.0, ge=0)  # keep away from a zone just lost
    # a machine that sees no controller heartbeat this long saves and ends (none: never)
    unsupervised_limit_s: float | None = DEFAULT_UNSUPERVISED_LIMIT_S
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    env: dict[str, str] = Field(default_factory=dict)
    # NAME: where its value is (a file, a Kubernetes Secret, AWS SSM / Secrets Manager): only
    # the reference is stored; the value is read where the attempt starts (secret_refs.py)
    env_from: dict[str, SecretRef] = Field(default_factory=dict)
    # machines of one attempt and training processes on each: more than one in all runs the
    # command through torchrun (spotwise.runtime.launch); min_nodes lets an attempt start on
    # fewer machines when the market lacks capacity for ``nodes``
    nodes: int = Field(default=1, ge=1, le=1024)
    procs_per_node: int = Field(default=1, ge=1, le=1024)
    min_nodes: int | None = Field(default=None, ge=1)
    # webhooks posted on the job's state changes (spotwise.telemetry.webhooks)
    notify: Notify | None = None

    @field_validator("command", mode="before")
    @classmethod
    def _command(cls, v: Any) -> list[str]:
        if isinstance(v, str):
            argv = shlex.split(v)
        elif isinstance(v, list) and all(isinstance(a, (str, int, float)) for a in v):
            argv = [str(a) for a in v]
        else:
            raise ValueError("expected a command line (string) or a list of arguments")
        if not argv:
            raise ValueError("the command is empty")
        return argv

    @field_validator(
        "deadline_s",
        "expected_runtime_s",
        "restart_backoff_s",
        "control_plane_timeout_s",
        "zone_cooldown_s",
        "changeover_s",
        "decision_interval_s",
        mode="before",
    )
    @classmethod
    def _duration(cls, v: Any) -> float | None:
        return None if v is None else parse_duration_s(v)

    @field_validator("unsupervised_limit_s", mode="before")
    @classmethod
    def _unsupervised_limit(cls, v: Any) -> float | None:
        if v is None or (isinstance(v, str) and v.strip().lower() == "none"):
            return None
        try:
            seconds = parse_duration_s(v)
        except ValueError as exc:
            raise ValueError(f"{exc}; or none to never stop a machine") from None
        if seconds < MIN_UNSUPERVISED_LIMIT_S:
            raise ValueError(
                f"at least {MIN_UNSUPERVISED_LIMIT_S:g}s (the controller renews its heartbeat "
                "a few times per limit); write e.g. 1h, or none to never stop a machine"
            )
        return seconds

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        """The name must be in the policy registry: a typo found later leaves a job stuck."""
        from spotwise.market.policies import POLICIES

        try:
            POLICIES.check(v)
        except UnknownBackendError as exc:
            raise ValueError(f"{exc.message}; {exc.hint}" if exc.hint else exc.message) from None
        if hasattr(POLICIES.load(v), "plan"):
            raise ValueError(
                f"policy {v!r} needs the future (hindsight only): use it in "
                "`spotwise simulate`; for a job choose uniform-progress or spotwise"
            )
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        _check_names(v)
        empty = [str(k) for k, val in v.items() if val is None]
        if empty:
            raise ValueError(
                f'{", ".join(empty[:5])}: no value (null); write {empty[0]}: "" for an empty '
                f"value, or take a secret from a file or a store with env_from "
                f"(env_from: {{{empty[0]}: {{file: path/to/{empty[0].lower()}}}}})"
            )
        nested = [str(k) for k, val in v.items() if isinstance(val, (dict, list))]
        if nested:
            raise ValueError(f"{', '.join(nested[:5])}: expected a text value, not a list/mapping")
        return {str(k): str(val) for k, val in v.items()}

    @field_validator("env_from", mode="before")
    @classmethod
    def _env_from(cls, v: Any) -> Any:
        _check_names(v)
        return v

    @model_validator(mode="after")
    def _secrets(self) -> JobSpec:
        """A reference the job's provider cannot resolve fails now, not on the machine."""
        both = sorted(set(self.env) & set(self.env_from))
        if both:
            raise ValueError(f"env and env_from both set {', '.join(both[:5])}; keep one")
        check_refs(self.env_from, self.provider.name)
        return self

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, v: Any) -> Any:
        """``provider: sim`` or ``provider: {name: sim, time_compression: 600, ...}``."""
        if isinstance(v, str):
            return {"name": v}
        if isinstance(v, dict) and "options" not in v:
            rest = {k: val for k, val in v.items() if k != "name"}
            return {"name": v.get("name", "local"), "options": rest}
        return v

    @field_validator("min_nodes")
    @classmethod
    def _min_nodes(cls, v: int | None, info: ValidationInfo) -> int | None:
        nodes = info.data.get("nodes")
        if v is not None and nodes is not None and v > nodes:
            raise ValueError(f"more than nodes ({nodes}); set it to {nodes} or less")
        provider = info.data.get("provider")
        if v is not None and provider is not None and provider.options.get("kueue") is not None:
            # no launch fails for capacity behind a queue: min_nodes would never act
            raise ValueError(
                f"provider.{provider.name}.kueue admits an attempt with all its nodes or not "
                "at all, so it never starts on fewer; remove min_nodes (or the kueue option)"
            )
        return v

    @property
    def world_size(self) -> int:
        """Training processes of a full-size attempt."""
        return self.nodes * self.procs_per_node

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


def _check_names(v: Any) -> None:
    """``v`` is a mapping of environment variable names (for ``env`` and ``env_from``)."""
    if not isinstance(v, dict):
        raise ValueError("expected a mapping of NAME: value")
    bad = [shown(k) for k in v if not isinstance(k, str) or not _ENV_NAME.match(k)]
    if bad:
        raise ValueError(
            f"invalid variable name(s) {', '.join(bad[:5])}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            + " (letters, digits and _, not starting with a digit)"
        )


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_ALIASES = {
    "deadline": "deadline_s",
    "expected_runtime": "expected_runtime_s",
    "restart_backoff": "restart_backoff_s",
    "budget": "budget_usd",
    "checkpoint": "checkpoint_dir",
    "control_plane_timeout": "control_plane_timeout_s",
    "zone_cooldown": "zone_cooldown_s",
    "changeover": "changeover_s",
    "decision_interval": "decision_interval_s",
    "unsupervised_limit": "unsupervised_limit_s",
}


def _allowed(loc: tuple[Any, ...]) -> str:
    """The allowed values or shape of a field, for the error message."""
    field = loc[0] if loc else None
    if field == "market":
        return " (allowed: " + ", ".join(MARKETS) + ")"
    return ""


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """``; did you mean max_restarts?`` for a misspelled key (top level or ``resources``)."""
    if len(loc) == 1:
        known = [*JobSpec.model_fields, *_ALIASES]
    elif len(loc) == 2 and loc[0] == "resources":
        known = list(Resources.model_fields)
    else:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), known, n=2)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _normalize(
    raw: dict[str, Any],
    base_dir: Path,
    now_s: float,
    keys: dict[str, str],
    problems: list[str],
    packed: bool = False,
) -> dict[str, Any]:
    """Aliases to field names, the deadline to seconds, paths resolved and checked.

    ``keys`` learns which key the user wrote for each field (for error messages); what cannot
    be right whatever the model says (a past deadline, a missing workdir) goes to ``problems``.
    ``packed``: a ``pack:`` workdir was packed elsewhere (a server's client), so its folder is
    not looked for here.
    """
    doc: dict[str, Any] = {}
    for key, value in raw.items():
        field = _ALIASES.get(key, key)
        if field in doc:
            problems.append(f"{keys[field]}, {key}: the same field twice; keep one")
        keys[field] = str(key)
        doc[field] = value
    if doc.get("deadline_s") is not None:
        try:
            doc["deadline_s"] = parse_deadline_s(doc["deadline_s"], now_s)
        except ValueError as exc:
            deadline = doc.pop("deadline_s")
            given = deadline.isoformat() if isinstance(deadline, date) else shown(deadline)
            problems.append(f"{keys['deadline_s']}: {exc} (given: {given})")
    workdir = _normalize_workdir(doc, base_dir, keys, problems, packed)
    if doc.get("checkpoint_dir") is not None and "://" not in str(doc["checkpoint_dir"]):
        # (an s3:// URI stays as given)
        doc["checkpoint_dir"] = str(_resolve(workdir, doc["checkpoint_dir"]))
    if isinstance(doc.get("env_from"), dict):  # a file reference is relative to the job file
        doc["env_from"] = {
            k: {**ref, "file": str(_resolve(base_dir, ref["file"]))}
            if isinstance(ref, dict) and isinstance(ref.get("file"), str)
            else ref
            for k, ref in doc["env_from"].items()
        }
    return doc


def _normalize_workdir(
    doc: dict[str, Any],
    base_dir: Path,
    keys: dict[str, str],
    problems: list[str],
    packed: bool,
) -> Path:
    """Rewrite ``doc["workdir"]`` to its resolved form and return the folder that relative
    paths (the checkpoint directory) start at; a workdir that cannot be right goes to
    ``problems``."""
    written = doc.get("workdir", ".")
    kind, path = split_workdir(str(written))
    workdir = _resolve(base_dir, path)
    if kind == "remote":  # a path on the machine: nothing here to check but its form
        workdir = base_dir
        if not path.startswith("/"):
            problems.append(
                f"{keys.get('workdir', 'workdir')}: {shown(written, 300)} is not an absolute "
                "path on the machine; write e.g. remote:/app"
            )
        doc["workdir"] = str(written)
    elif kind == "pack" and packed:  # packed on the client's machine, uploaded: not here
        doc["workdir"] = f"{kind}:{workdir}"
    elif not workdir.is_dir():
        what = "is not a directory" if workdir.exists() else "does not exist"
        problems.append(
            f"{keys.get('workdir', 'workdir')}: {printable(str(workdir))} {what} (given: "
            f"{shown(written, 300)}; a relative workdir starts at the job file's folder)"
        )
        doc["workdir"] = str(workdir)
    else:
        doc["workdir"] = f"{kind}:{workdir}" if kind else str(workdir)
    return workdir


def _resolve(base: Path, written: Any) -> Path:
    """``written`` (``~`` expanded) against ``base``; a path the OS cannot even look at (too
    long, a component over NAME_MAX) is returned unresolved, so the check after it reports it
    as missing instead of raising."""
    path = base / Path(str(written)).expanduser()
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # ENAMETOOLONG, a symlink loop
        return Path(os.path.abspath(path))


def parse_spec(
    doc: Any,
    *,
    base_dir: Path | None = None,
    source: str = "job spec",
    clock: Callable[[], float] = time.time,
    packed: bool = False,
) -> JobSpec:
    """Validate a parsed document; relative paths are resolved against ``base_dir``.

    ``clock`` is the wall time an absolute deadline is measured from (injected for tests).
    ``packed``: a ``pack:`` workdir was packed and uploaded by a server's client; its folder
    is on the client's machine, not looked for here.
    """
    if not isinstance(doc, dict):
        raise ConfigError(
            f"{source}: expected a mapping of fields at the top level",
            hint="see examples/digits/job.yaml",
        )
    keys: dict[str, str] = {}
    # characters and sizes first: nothing below (shlex, paths, pydantic) sees a NUL or 5 MB
    lines = value_problems(doc)
    spec: JobSpec | None = None
    if not lines:
        normalized = _normalize(doc, base_dir or Path.cwd(), clock(), keys, lines, packed)
        try:
            spec = JobSpec.model_validate(normalized)
        except ValidationError as exc:
            lines += [_error_line(err, keys) for err in exc.errors()]
        if spec is not None:
            lines += missing_files(spec.env_from)
    if spec is None or lines:
        more = [f"... and {len(lines) - _MAX_LINES:,} more"] if len(lines) > _MAX_LINES else []
        raise ConfigError(
            f"{source} is invalid:\n  " + "\n  ".join(lines[:_MAX_LINES] + more),
            hint="fix the named field(s); see docs/control.md for every field",
        )
    for key in plain_secret_keys(spec.env):
        log.warning(
            "%s: env.%s looks like a secret and is stored in plain text in the job store; "
            "take it from a file or a secret store instead, e.g. env_from: {%s: {file: "
            "~/.secrets/%s}} (see docs/control.md, 'Secrets')",
            source,
            key,
            key,
            key.lower(),
        )
    return spec


def stored_spec(job_id: str, stored: dict[str, Any]) -> JobSpec:
    """A job's spec as the store holds it. One recorded by an older spotwise may break a rule
    added since (a checkpoint directory now refused, a non-finite duration): that job is
    refused by name with the way out, never a traceback."""
    try:
        return JobSpec.model_validate(stored)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the job"
        raise ControlError(
            f"job {job_id} was recorded with a job file this spotwise no longer accepts "
            f"({where}: {printable(str(first['msg']))[:_MAX_DETAIL]})",
            hint=f"cancel it (spotwise cancel {job_id}) and launch its job file again, fixed",
        ) from None


def _error_line(err: Any, keys: dict[str, str]) -> str:
    """One pydantic error as ``key: what is wrong (allowed) (given)``, in the user's key."""
    loc = tuple(err["loc"])
    detail = err["msg"].removeprefix("Value error, ")
    if len(detail) > _MAX_DETAIL:  # a provider's or a registry's message quoting a value
        detail = detail[:_MAX_DETAIL] + "..."
    if loc == ("provider",) and detail.startswith("provider."):
        return str(detail)  # a provider's own options, already in the job file's words
    written = (keys.get(str(loc[0]), str(loc[0])), *map(str, loc[1:])) if loc else ()
    field = printable(".".join(written), 80) or "(top level)"
    if err["type"] == "extra_forbidden":
        detail = "unknown field" + _did_you_mean(loc)
    elif err["type"] == "missing":
        detail = "required field is missing"
    elif err["type"] == "finite_number":
        detail = "not a finite number (.nan and .inf are not values)"
    given = "" if err["type"] == "missing" else f" (given: {shown(err.get('input'))})"
    return f"{field}: {detail}{_allowed(loc)}{given}"


def load_spec(path: str | Path, *, clock: Callable[[], float] = time.time) -> JobSpec:
    """Read (within the limits of :mod:`spotwise.control.jobfile`) and validate a job file."""
    p = Path(path)
    doc = read_job_file(p)
    return parse_spec(doc, base_dir=p.resolve().parent, source=printable(str(p)), clock=clock)
