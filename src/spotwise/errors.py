"""One exception tree for all of spotwise.

Vendor errors (botocore, OSError, subprocess...) are translated into these at the edge, so callers
catch ``SpotwiseError`` subclasses and always get a message that names the problem and the fix.
Where a class also derives from a builtin, code written against the builtin (``except
ValueError``, ``except KeyError``) keeps working. The tree (``tests/test_errors.py`` redraws it
from the classes and fails on drift)::

    SpotwiseError
      ConfigError (also ValueError)
        UnknownBackendError
      MissingExtraError (also ImportError)
      CheckpointError
        NoCheckpointError
        CorruptCheckpointError
        StateMismatchError
        SaveError
      DataLoaderError (also RuntimeError)
      StorageError
        StorageNotFoundError (also KeyError)
        StoragePermissionError
        StorageFullError
        TransientStorageError
        IntegrityError
        EncryptionKeyError
      NoticeError
      MarketError
        UnknownGPUError (also ConfigError)
        NoPlacementError
        IngestError
        TraceError (also ConfigError)
      ControlError
        JobNotFoundError
        ControllerBusyError
        ServerError
        BudgetError
        ProviderError
          ProviderUnavailableError
          TransientProviderError
          CapacityError
      WorkloadError
        PlanMismatchError (also ConfigError)
"""

from __future__ import annotations


class SpotwiseError(Exception):
    """Base of every error spotwise raises on purpose.

    ``hint`` says what the user can do about it; it is appended to ``str(err)``.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class ConfigError(SpotwiseError, ValueError):
    """Bad input from the user: a field, a flag, a file."""


class MissingExtraError(SpotwiseError, ImportError):
    """An optional dependency is not installed; the message carries the exact pip command."""

    def __init__(self, package: str, extra: str, feature: str) -> None:
        super().__init__(
            f"{feature} needs the optional package {package!r}, which is not installed",
            hint=f"pip install 'spotwise[{extra}]'",
        )
        self.package = package
        self.extra = extra


class UnknownBackendError(ConfigError):
    """A registry was asked for a name it does not know."""


# --- checkpoints -------------------------------------------------------------------------------
class CheckpointError(SpotwiseError):
    """Something is wrong with a checkpoint or with saving one."""


class NoCheckpointError(CheckpointError):
    """No committed checkpoint exists where one was required."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint failed verification (checksum, size, missing file, bad manifest)."""


class StateMismatchError(CheckpointError):
    """A checkpoint does not fit the objects it is loaded into (keys, shapes, dtypes)."""


class SaveError(CheckpointError):
    """Writing a checkpoint failed (disk full, read-only, background write error)."""


# --- training data ------------------------------------------------------------------------------
class DataLoaderError(SpotwiseError, RuntimeError):
    """A DataLoader worker process died under the training loop (killed, crashed)."""


# --- storage -----------------------------------------------------------------------------------
class StorageError(SpotwiseError):
    """A storage backend failed."""


class StorageNotFoundError(StorageError, KeyError):
    """The key, bucket or directory does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message otherwise
        return SpotwiseError.__str__(self)


class StoragePermissionError(StorageError):
    """Credentials are missing/wrong or the location is read-only."""


class StorageFullError(StorageError):
    """No space left where the data must go."""


class TransientStorageError(StorageError):
    """A retryable failure (throttling, 5xx, timeout) that persisted after retries."""


class IntegrityError(StorageError):
    """Data read back does not match its checksum or authentication tag."""


class EncryptionKeyError(StorageError):
    """The encryption key is missing or wrong."""


# --- notices -----------------------------------------------------------------------------------
class NoticeError(SpotwiseError):
    """Configuration problem with interruption detection (never raised from a poll)."""


# --- market ------------------------------------------------------------------------------------
class MarketError(SpotwiseError):
    """Catalog, price or advisor problem."""


class UnknownGPUError(MarketError, ConfigError):
    """A GPU name that the catalog does not know (the hint suggests close matches)."""


class NoPlacementError(MarketError):
    """No placement satisfies the request."""


class IngestError(MarketError):
    """Price data could not be ingested."""


class TraceError(MarketError, ConfigError):
    """A spot availability trace file is missing or malformed."""


# --- control -----------------------------------------------------------------------------------
class ControlError(SpotwiseError):
    """Job controller problem."""


class JobNotFoundError(ControlError):
    """No job with that id."""


class ControllerBusyError(ControlError):
    """Another controller already drives the job (an embedded one's lock, a server's lease)."""


class ServerError(ControlError):
    """A spotwise server did not answer, or refused the caller."""


class BudgetError(ControlError):
    """The job cannot be done within its budget."""


class ProviderError(ControlError):
    """A provider failed to launch, query or terminate."""


class ProviderUnavailableError(ProviderError):
    """The provider cannot be reached (daemon down, command missing)."""


class TransientProviderError(ProviderError):
    """A control-plane hiccup: retried, and never counted as a preemption."""


class CapacityError(ProviderError):
    """No machine of the requested kind (spot in that zone) is available right now."""


# --- workloads (batch inference, hyperparameter search) -----------------------------------------
class WorkloadError(SpotwiseError):
    """A batch-inference or hyperparameter-search problem."""


class PlanMismatchError(WorkloadError, ConfigError):
    """Existing outputs or a study were made by a different plan (model, shard size, dataset
    length, search space, direction); nothing is overwritten."""
