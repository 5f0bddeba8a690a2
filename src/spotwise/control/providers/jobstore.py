"""A cloud provider's job store: the object-store prefix its jobs live under.

``provider.<name>.store`` (``gs://bucket/jobs``, ``az://container/jobs``, ``s3://bucket/jobs``:
any object-store scheme the storage registry serves) holds each job's checkpoints
(``<store>/<job id>/checkpoint``), packed code, heartbeat and each attempt's exit record and
output (``<store>/<job id>/attempts/<n>``). ``s3:`` is the key's old spelling, still read.
Every read goes through the Storage seam (``open_storage``), so the VM's reporter, the
controller and the runtime agree on one store whatever its scheme.
"""

from __future__ import annotations

from spotwise.control.providers.base import CheckpointHome
from spotwise.control.providers.cloud_nodes import node_uri
from spotwise.errors import ConfigError, SpotwiseError
from spotwise.storage import Storage, object_store_schemes, open_storage
from spotwise.storage.objectstore import parse_bucket_uri

OLD_KEY = "s3"  # the key's spelling when S3 was the only store
PROBE = ".spotwise-preflight"  # a prefix listed at preflight: the bucket answers, cheaply


class JobStore:
    """The store a provider's options name (``store``, or the old ``s3``), checked now."""

    def __init__(self, provider: str, store: str | None, s3: str | None) -> None:
        self.provider = provider
        if store is not None and s3 is not None:
            raise ConfigError(
                f"provider.{provider}: both store and s3 are given",
                hint="keep store: (s3: is its old spelling)",
            )
        self.key = "store" if s3 is None else OLD_KEY
        uri = store if s3 is None else s3
        example = f"e.g. store: {_example(provider)}"
        if uri is None:
            raise ConfigError(
                f"provider.{provider}.store: required option is missing", hint=example
            )
        schemes = object_store_schemes()
        scheme = uri.split("://", 1)[0] if "://" in uri else ""
        if f"{scheme}://" not in schemes or (self.key == OLD_KEY and scheme != "s3"):
            raise ConfigError(
                f"{self.named}: {uri!r} is not an object-store URI"
                + (" (s3: takes s3:// only)" if self.key == OLD_KEY else ""),
                hint=f"{example}; the schemes: {', '.join(schemes)}",
            )
        try:
            parse_bucket_uri(uri, scheme)
        except ConfigError as exc:
            raise ConfigError(f"{self.named}: {exc.message}", hint=exc.hint) from None
        self.uri, self.scheme = uri.rstrip("/"), scheme
        self._attempts: dict[str, Storage] = {}

    @property
    def named(self) -> str:
        """The key as the job file spells it (``provider.gcp.store``)."""
        return f"provider.{self.provider}.{self.key}"

    def job_uri(self, job_id: str) -> str:
        return f"{self.uri}/{job_id}"

    def attempt_uri(self, job_id: str, n: int, node: tuple[str, int] | None = None) -> str:
        """Where attempt ``n``'s machine (or its node ``(launch, rank)``) reports its exit and
        output."""
        return node_uri(f"{self.job_uri(job_id)}/attempts/{n}", node)

    def checkpoints(self) -> CheckpointHome:
        """Checkpoints under the store by default; a job's own checkpoint_dir may be in any
        object store (the machine's disk dies with it)."""
        return CheckpointHome(
            default=f"{self.uri}/{{job_id}}/checkpoint",
            durable=tuple(object_store_schemes()),
            hint="give checkpoint_dir as an object-store URI "
            f"({', '.join(object_store_schemes())}), or leave it out: each job then "
            f"checkpoints to {self.uri}/<job id>/checkpoint",
        )

    def attempt(self, job_id: str, n: int, node: tuple[str, int] | None = None) -> Storage:
        """The attempt's (or its node's) prefix, one client per attempt (making one costs up
        to seconds: a status poll reuses it)."""
        uri = self.attempt_uri(job_id, n, node)
        if uri not in self._attempts:
            self._attempts[uri] = open_storage(uri)
        return self._attempts[uri]

    def check(self) -> None:
        """Before anything is paid for: the bucket exists and the controller may read it."""
        try:
            open_storage(self.uri).list(PROBE)
        except SpotwiseError as exc:
            raise ConfigError(
                f"{self.named}: {self.uri} is not usable: {exc.message}",
                hint=exc.hint or f"create the bucket or fix {self.named}",
            ) from None


def _example(provider: str) -> str:
    return {"gcp": "gs://my-bucket/jobs", "azure": "az://my-container/jobs"}.get(
        provider, "s3://my-bucket/jobs"
    )
