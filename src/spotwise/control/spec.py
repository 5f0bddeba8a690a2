"""JobSpec: the job file (YAML) a user hands to ``spotwise launch``, validated at the boundary.

Every mistake becomes one :class:`~spotwise.errors.ConfigError` that names the field, what was
given and what is allowed, so a user fixes the file in one go instead of reading a traceback.
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from spotwise.errors import ConfigError, UnknownBackendError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|hr|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400}
MARKETS = ("spot", "on-demand", "auto")


def parse_duration_s(value: Any) -> float:
    """``90``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1.5d"`` -> seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 15m or 2h")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration; use e.g. 90s, 15m, 2h or 1d")
        seconds = float(match.group(1)) * _UNIT_S[(match.group(2) or "s").lower()]
    if seconds < 0:
        raise ValueError("a duration must be >= 0")
    return seconds


class Resources(BaseModel):
    """What one machine must have. ``gpu`` is a catalog name (V100, A100...) or absent."""

    model_config = ConfigDict(extra="forbid")
    gpu: str | None = None
    gpu_count: int = Field(default=0, ge=0, le=64)
    instance_type: str | None = None  # e.g. p3.2xlarge: what the sim bills and SLURM ignores
    cpus: int = Field(default=1, ge=1, le=1024)


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

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="job", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    command: list[str]
    workdir: str = "."
    checkpoint_dir: str | None = None  # default: $SPOTWISE_HOME/jobs/<id>/checkpoint
    resources: Resources = Field(default_factory=Resources)
    market: Literal["spot", "on-demand", "auto"] = "auto"
    policy: str = "uniform-progress"  # used when market is auto
    deadline_s: float | None = None  # after launch
    expected_runtime_s: float | None = None  # compute time without interruptions (estimates)
    budget_usd: float | None = Field(default=None, gt=0)
    max_restarts: int = Field(default=0, ge=0, le=1000)  # on errors (exit not 0/75)
    restart_backoff_s: float = Field(default=2.0, ge=0)
    control_plane_timeout_s: float = Field(default=120.0, gt=0)
    zone_cooldown_s: float = Field(default=60.0, ge=0)  # keep away from a zone just lost
    provider: ProviderSpec = Field(default_factory=ProviderSpec)
    env: dict[str, str] = Field(default_factory=dict)

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

    @field_validator("deadline_s", "expected_runtime_s", "restart_backoff_s",
                     "control_plane_timeout_s", "zone_cooldown_s", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float | None:
        return None if v is None else parse_duration_s(v)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> dict[str, str]:
        if not isinstance(v, dict):
            raise ValueError("expected a mapping of NAME: value")
        bad = [k for k in v if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", str(k))]
        if bad:
            raise ValueError(f"invalid variable name(s) {bad}")
        return {str(k): str(val) for k, val in v.items()}

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

    @property
    def command_line(self) -> str:
        return shlex.join(self.command)


_ALIASES = {"deadline": "deadline_s", "expected_runtime": "expected_runtime_s",
            "restart_backoff": "restart_backoff_s", "budget": "budget_usd",
            "checkpoint": "checkpoint_dir", "control_plane_timeout": "control_plane_timeout_s",
            "zone_cooldown": "zone_cooldown_s"}


def _allowed(loc: tuple[Any, ...]) -> str:
    """The allowed values or shape of a field, for the error message."""
    field = loc[0] if loc else None
    if field == "market":
        return " (allowed: " + ", ".join(MARKETS) + ")"
    if loc and loc[-1] in {"deadline_s", "expected_runtime_s", "restart_backoff_s"}:
        return " (a duration such as 90s, 15m, 2h)"
    return ""


def _normalize(doc: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    doc = {_ALIASES.get(k, k): v for k, v in doc.items()}
    deadline = doc.get("deadline_s")
    if isinstance(deadline, datetime):  # YAML timestamps: an absolute deadline
        when = deadline if deadline.tzinfo else deadline.replace(tzinfo=timezone.utc)
        doc["deadline_s"] = max(0.0, when.timestamp() - datetime.now(timezone.utc).timestamp())
    workdir = Path(str(doc.get("workdir", "."))).expanduser()
    doc["workdir"] = str((base_dir / workdir).resolve())
    if doc.get("checkpoint_dir") is not None and "://" not in str(doc["checkpoint_dir"]):
        ckpt = Path(str(doc["checkpoint_dir"])).expanduser()  # (an s3:// URI stays as given)
        doc["checkpoint_dir"] = str((Path(doc["workdir"]) / ckpt).resolve())
    return doc


def parse_spec(doc: Any, *, base_dir: Path | None = None, source: str = "job spec") -> JobSpec:
    """Validate a parsed document; relative paths are resolved against ``base_dir``."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping of fields at the top level",
                          hint="see examples/digits/job.yaml")
    try:
        return JobSpec.model_validate(_normalize(doc, base_dir or Path.cwd()))
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            field = ".".join(str(p) for p in loc) or "(top level)"
            given = err.get("input")
            detail = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                detail = "unknown field"
            elif err["type"] == "missing":
                detail = "required field is missing"
            if loc == ("provider",) and detail.startswith("provider."):
                lines.append(detail)  # a provider's own options, in the job file's words
                continue
            shown = "" if err["type"] == "missing" else f" (given: {given!r})"
            lines.append(f"{field}: {detail}{_allowed(loc)}{shown}")
        raise ConfigError(
            f"{source} is invalid:\n  " + "\n  ".join(lines),
            hint="fix the named field(s); see docs/control.md for every field",
        ) from None


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a job YAML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"job file {str(p)!r} does not exist", hint="check the path") from None
    except OSError as exc:
        raise ConfigError(f"cannot read job file {str(p)!r}: {exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}", hint="check indentation and quoting") \
            from None
    return parse_spec(doc, base_dir=p.resolve().parent, source=str(p))
