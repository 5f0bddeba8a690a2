"""Every ``SPOTWISE_*`` environment variable: its type, default, meaning and who sets it.

This table is the one place a variable is declared and read: modules ask its :class:`Setting`
(``settings.HOME.path()``) instead of ``os.environ``, so each value is parsed one way
everywhere, a bad value is named with its fix, and docs/settings.md's table is generated from
it (``python -m spotwise.settings``; a test fails when they differ, or when the code names a
variable the table does not declare). Standard library only: the runtime, the controller, the
CLI and the machines' boot scripts all read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from spotwise.durations import DURATION, MAX_DURATION_S, parse_duration_s
from spotwise.errors import ConfigError, SpotwiseError

Kind = Literal["path", "text", "url", "seconds", "int", "list", "secret", "flag"]
SetBy = Literal[
    "you", "spotwise", "tests"
]  # spotwise: given to the job's process by the controller

Error = type[SpotwiseError]

SETTINGS: dict[str, Setting] = {}


@dataclass(frozen=True)
class Setting:
    name: str
    kind: Kind
    default: str  # as it would be written; "" when unset means "not used"
    doc: str
    set_by: SetBy = "you"
    example: str = ""  # a good value for an error's hint, where the default is none

    def raw(self, env: Mapping[str, str] | None = None) -> str:
        """The value as set (stripped), or "" when unset."""
        return (os.environ if env is None else env).get(self.name, "").strip()

    def text(self, env: Mapping[str, str] | None = None) -> str | None:
        return self.raw(env) or None

    def path(self, env: Mapping[str, str] | None = None) -> Path | None:
        raw = self.raw(env)
        return Path(raw).expanduser() if raw else None

    @overload
    def seconds(
        self, env: Mapping[str, str] | None = None, default: None = None, *, error: Error = ...
    ) -> float | None: ...
    @overload
    def seconds(
        self, env: Mapping[str, str] | None, default: float, *, error: Error = ...
    ) -> float: ...
    def seconds(
        self,
        env: Mapping[str, str] | None = None,
        default: float | None = None,
        *,
        error: Error = ConfigError,
    ) -> float | None:
        """A duration (``90``, ``90s``, ``15m``...) in seconds, or ``default`` when unset.
        ``error``: the exception a bad value raises (the caller's layer, e.g. NoticeError)."""
        raw = self.raw(env)
        if not raw:
            return default
        try:
            return parse_duration_s(raw)
        except ValueError as exc:
            number = _plain_seconds(raw)  # what a program wrote with "%g": "1.2e+06"
            if number is not None:
                return number
            problem = (
                "is negative"
                if raw.startswith("-")
                else f"is out of range ({exc})"
                if DURATION.match(raw)
                else "is not a number of seconds"
            )
            raise error(
                f"{self.name}={raw!r} {problem}",
                hint=f"e.g. {self.name}={self._example('30s')} (or 90s, 15m, 2h), or unset it",
            ) from None

    @overload
    def integer(self, env: Mapping[str, str] | None = None, default: None = None) -> int | None: ...
    @overload
    def integer(self, env: Mapping[str, str] | None, default: int) -> int: ...
    def integer(
        self, env: Mapping[str, str] | None = None, default: int | None = None
    ) -> int | None:
        raw = self.raw(env)
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(
                f"{self.name}={raw!r} is not a whole number",
                hint=f"e.g. {self.name}={self._example('1')}",
            ) from None

    def _example(self, fallback: str) -> str:
        return self.example or self.default or fallback


def _plain_seconds(raw: str) -> float | None:
    """A finite, non-negative number in any form ``float`` reads, else None."""
    try:
        number = float(raw)
    except ValueError:
        return None
    return number if 0 <= number <= MAX_DURATION_S else None


def _declare(
    name: str, kind: Kind, default: str, doc: str, set_by: SetBy = "you", *, example: str = ""
) -> Setting:
    setting = Setting(name, kind, default, doc, set_by, example)
    SETTINGS[name] = setting
    return setting


# --- where spotwise keeps its state ----------------------------------------------------------
HOME = _declare(
    "SPOTWISE_HOME",
    "path",
    "~/.spotwise",
    "Job store, jobs' logs and run directories, price history, login.",
)
DB = _declare(
    "SPOTWISE_DB",
    "url",
    "",
    "The job store's database (`postgresql://...` for a team); default SQLite in SPOTWISE_HOME.",
)
CACHE_DIR = _declare(
    "SPOTWISE_CACHE_DIR",
    "path",
    "",
    "Where object-store run directories are staged locally (default: ~/.cache/spotwise).",
)
ADMIN_TOKEN_FILE = _declare(
    "SPOTWISE_ADMIN_TOKEN_FILE",
    "path",
    "",
    "`spotwise server`: register the admin token in this file at the first start (a Secret).",
)
# --- talking to a server ---------------------------------------------------------------------
SERVER = _declare(
    "SPOTWISE_SERVER",
    "url",
    "",
    "The `spotwise server` the CLI talks to (wins over `spotwise login`).",
)
TOKEN = _declare("SPOTWISE_TOKEN", "secret", "", "The API token for SPOTWISE_SERVER.")
# --- interruption notices ------------------------------------------------------------------
PLATFORM = _declare(
    "SPOTWISE_PLATFORM",
    "text",
    "auto",
    "Which platform's notices to watch: auto, none, aws, gcp, azure, kubernetes, slurm.",
)
SIGNALS = _declare(
    "SPOTWISE_SIGNALS",
    "list",
    "TERM,INT",
    "Signals taken as a notice (comma-separated; SLURM adds USR1).",
)
GRACE_S = _declare(
    "SPOTWISE_GRACE_S",
    "seconds",
    "30",
    "Time between a signal notice and the kill (set by the controller from the provider's grace).",
)
NOTICE_FILE = _declare(
    "SPOTWISE_NOTICE_FILE",
    "path",
    "",
    "Where `spotwise run -- CMD` writes the notice (JSON) for the wrapped program.",
    "spotwise",
)
AWS_POLL_S = _declare(
    "SPOTWISE_AWS_POLL_S",
    "seconds",
    "1",
    "How often the EC2 instance metadata is asked for a spot notice.",
)
GCP_WAIT_S = _declare(
    "SPOTWISE_GCP_WAIT_S", "seconds", "30", "The GCP metadata server's long-poll wait."
)
GCP_MAINTENANCE_NOTICE_S = _declare(
    "SPOTWISE_GCP_MAINTENANCE_NOTICE_S",
    "seconds",
    "60",
    "Notice assumed for a GCP host-maintenance event (GPU VMs get 3600).",
)
AZURE_METADATA_ENDPOINT = _declare(
    "SPOTWISE_AZURE_METADATA_ENDPOINT",
    "url",
    "",
    "Another Azure instance-metadata endpoint (an emulator).",
)
AZURE_VM_NAME = _declare(
    "SPOTWISE_AZURE_VM_NAME",
    "text",
    "",
    "This VM's name, to pick its Scheduled Events (default: from the instance metadata).",
)
HEARTBEAT_URI = _declare(
    "SPOTWISE_HEARTBEAT_URI",
    "text",
    "",
    "Where the machine reads its controller's heartbeat (the job's checkpoint storage).",
    "spotwise",
)
UNSUPERVISED_LIMIT_S = _declare(
    "SPOTWISE_UNSUPERVISED_LIMIT_S",
    "seconds",
    "",
    "The job's `unsupervised_limit`: without a new heartbeat for this long, save and stop.",
    "spotwise",
    example="1h",
)
# --- the runtime's checkpoint schedule -------------------------------------------------------
CHECKPOINT_DIR = _declare(
    "SPOTWISE_CHECKPOINT_DIR",
    "text",
    "",
    "The attempt's run directory (a path or an object-store URI).",
    "spotwise",
)
MTBI_S = _declare(
    "SPOTWISE_MTBI_S",
    "seconds",
    "",
    "Mean time between interruptions, for the checkpoint interval (default: from the provider).",
    example="1h",
)
NOTICE_MARGIN_S = _declare(
    "SPOTWISE_NOTICE_MARGIN_S",
    "seconds",
    "",
    "Safety margin kept before a notice's deadline.",
    example="60",
)
ENCRYPTION_KEY = _declare(
    "SPOTWISE_ENCRYPTION_KEY",
    "secret",
    "",
    "Key (64 hex digits) that encrypts object-store checkpoints at rest.",
)
ENCRYPTION_KEY_FILE = _declare(
    "SPOTWISE_ENCRYPTION_KEY_FILE",
    "path",
    "",
    "A file holding that key (preferred: not in the environment).",
)
# --- the job's identity, given to its process ---------------------------------------------
JOB_ID = _declare("SPOTWISE_JOB_ID", "text", "", "The job's id.", "spotwise")
ATTEMPT = _declare("SPOTWISE_ATTEMPT", "int", "", "The attempt number (1, 2, ...).", "spotwise")
ATTEMPT_RESTARTS = _declare(
    "SPOTWISE_ATTEMPT_RESTARTS", "int", "0", "SLURM requeues within the attempt.", "spotwise"
)
WORKER = _declare(
    "SPOTWISE_WORKER", "text", "", "This worker's name in a worker group (w0, w1, ...).", "spotwise"
)
WORKERS = _declare("SPOTWISE_WORKERS", "int", "", "The number of workers in the group.", "spotwise")
BATCH_OUT = _declare(
    "SPOTWISE_BATCH_OUT", "text", "", "`spotwise infer`: the output location.", "spotwise"
)
STUDY = _declare(
    "SPOTWISE_STUDY", "text", "", "`spotwise sweep`: the Optuna study's name.", "spotwise"
)
STUDY_STORAGE = _declare(
    "SPOTWISE_STUDY_STORAGE", "url", "", "`spotwise sweep`: the study's storage URL.", "spotwise"
)
TRIALS = _declare(
    "SPOTWISE_TRIALS", "int", "", "`spotwise sweep`: trials to run in all.", "spotwise"
)
RUN_ROOT = _declare(
    "SPOTWISE_RUN_ROOT",
    "text",
    "",
    "`spotwise sweep`: where each trial's run directory goes.",
    "spotwise",
)
# --- telemetry --------------------------------------------------------------------------------
METRICS_PORT = _declare(
    "SPOTWISE_METRICS_PORT",
    "int",
    "",
    "Serve the run's Prometheus /metrics on 127.0.0.1 at this port.",
)
GPU_SAMPLE_S = _declare(
    "SPOTWISE_GPU_SAMPLE_S", "seconds", "5", "Seconds between NVML samples; 0 turns sampling off."
)
CLOUDWATCH_LOG_GROUP = _declare(
    "SPOTWISE_CLOUDWATCH_LOG_GROUP",
    "text",
    "",
    "Send the run's events to this CloudWatch Logs group.",
)
CLOUDWATCH_LOG_STREAM = _declare(
    "SPOTWISE_CLOUDWATCH_LOG_STREAM", "text", "", "Its stream (default: job/attempt/pid)."
)
# --- endpoint overrides (loopback emulators) ------------------------------------------------
AZURE_ENDPOINT_URL = _declare(
    "SPOTWISE_AZURE_ENDPOINT_URL",
    "url",
    "",
    "Another Azure Resource Manager endpoint (`spotwise emulate azure-compute`).",
)
GCP_COMPUTE_ENDPOINT = _declare(
    "SPOTWISE_GCP_COMPUTE_ENDPOINT",
    "url",
    "",
    "Another Compute Engine API endpoint (`spotwise emulate gcp-compute`).",
)
AZURE_PRICES_URL = _declare(
    "SPOTWISE_AZURE_PRICES_URL", "url", "", "Another Azure Retail Prices API endpoint."
)
EC2_EMULATED = _declare(
    "SPOTWISE_EC2_EMULATED",
    "flag",
    "",
    "Set on the EC2 double's machines: the boot script does not power off the host.",
    "spotwise",
)
GCE_EMULATED = _declare(
    "SPOTWISE_GCE_EMULATED",
    "flag",
    "",
    "Set on the Compute Engine double's machines (as above).",
    "spotwise",
)
AZURE_EMULATED = _declare(
    "SPOTWISE_AZURE_EMULATED",
    "flag",
    "",
    "Set on the Azure double's machines (as above).",
    "spotwise",
)
# --- tests ----------------------------------------------------------------------------------------
TEST_WRITE_DELAY_S = _declare(
    "SPOTWISE_TEST_WRITE_DELAY_S",
    "seconds",
    "",
    "Slows each checkpoint write (tests kill a run mid-save).",
    "tests",
    example="0.5",
)
TEST_POSTGRES_URL = _declare(
    "SPOTWISE_TEST_POSTGRES_URL",
    "url",
    "",
    "The PostgreSQL the job store's tests also run on (`scripts/pg-up.sh` prints it).",
    "tests",
)
ARTIFACTS = _declare(
    "SPOTWISE_ARTIFACTS",
    "path",
    "",
    "Where the dashboard's browser tests also keep their screenshots.",
    "tests",
)


def home() -> Path:
    """spotwise's own folder: SPOTWISE_HOME, else ~/.spotwise."""
    return HOME.path() or Path.home() / ".spotwise"


def markdown_table() -> str:
    """docs/settings.md's table, generated from :data:`SETTINGS`."""
    rows = ["| variable | type | default | set by | what it does |", "|---|---|---|---|---|"]
    for s in SETTINGS.values():
        default = f"`{s.default}`" if s.default else ""
        rows.append(f"| `{s.name}` | {s.kind} | {default} | {s.set_by} | {s.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
