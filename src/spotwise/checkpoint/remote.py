"""Checkpoints in an object store (``s3://``, ``gs://``, ``az://``), found and checked from one
listing and their manifests, without torch: what ``ckpt list`` and the controller's progress
read, and where the runtime's tiered mirror (``spotwise.runtime.tiered``) starts from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spotwise.checkpoint.format import MANIFEST, Manifest, parse_manifest, step_dir_name
from spotwise.checkpoint.read import CheckpointInfo
from spotwise.errors import (
    CorruptCheckpointError,
    EncryptionKeyError,
    IntegrityError,
    StorageNotFoundError,
)
from spotwise.storage import is_remote as is_remote  # where the runtime and the CLI look for it
from spotwise.storage.base import Storage

_STEP_KEY = re.compile(r"^(step-(\d{8,}))/(.+)$")


def open_remote(uri: str) -> Storage:
    """The storage backend for ``uri``, wrapped for encryption when a key is configured."""
    from spotwise.storage import open_storage
    from spotwise.storage.crypt import EncryptedStorage

    return EncryptedStorage.from_env(open_storage(uri))


@dataclass
class RemoteCheckpoint:
    """One ``step-*`` prefix of the remote store, as found by listing it."""

    step: int
    name: str
    sizes: dict[str, int]  # file name -> size, as listed
    manifest_raw: bytes | None = None
    manifest: Manifest | None = None
    valid: bool = False
    problem: str | None = None

    @property
    def size_bytes(self) -> int:
        return sum(self.sizes.values())

    def info(self) -> CheckpointInfo:
        """As a ``CheckpointInfo`` (path = the step name), for retention decisions and listings."""
        manifest = self.manifest
        return CheckpointInfo(
            step=self.step,
            path=Path(self.name),
            wall_time=manifest.wall_time if manifest else None,
            size_bytes=self.size_bytes,
            valid=self.valid,
            problem=self.problem,
            metrics=dict(manifest.metrics) if manifest else {},
        )


def scan_remote(
    storage: Storage, cache: dict[str, RemoteCheckpoint] | None = None
) -> list[RemoteCheckpoint]:
    """Every ``step-*`` prefix under ``storage``, oldest first, checked from one listing.

    A checkpoint is valid when its manifest parses and every file it names is listed with the
    manifest's size. ``cache`` (name -> checkpoint) saves re-reading unchanged manifests.
    """
    groups: dict[str, RemoteCheckpoint] = {}
    for obj in storage.list(""):
        match = _STEP_KEY.match(obj.key)
        if match is None or step_dir_name(int(match.group(2))) != match.group(1):
            continue
        name, step, rest = match.group(1), int(match.group(2)), match.group(3)
        groups.setdefault(name, RemoteCheckpoint(step, name, {})).sizes[rest] = obj.size
    found = []
    for name, ckpt in sorted(groups.items(), key=lambda kv: kv[1].step):
        cached = (cache or {}).get(name)
        if cached is not None and cached.valid and cached.sizes == ckpt.sizes:
            found.append(cached)
            continue
        _check(storage, ckpt)
        if cache is not None:
            cache[name] = ckpt
        found.append(ckpt)
    return found


def _check(storage: Storage, ckpt: RemoteCheckpoint) -> None:
    if MANIFEST not in ckpt.sizes:
        ckpt.problem = f"no {MANIFEST}: the upload never committed"
        return
    where = f"{storage.uri}/{ckpt.name}/{MANIFEST}"
    try:
        ckpt.manifest_raw = storage.get(f"{ckpt.name}/{MANIFEST}")
        ckpt.manifest = parse_manifest(ckpt.manifest_raw, where)
    except CorruptCheckpointError as exc:
        ckpt.problem = exc.message
        if _looks_encrypted(ckpt.manifest_raw):
            raise EncryptionKeyError(
                f"the checkpoints at {storage.uri} are encrypted and no key is configured",
                hint="set SPOTWISE_ENCRYPTION_KEY (or SPOTWISE_ENCRYPTION_KEY_FILE) to the key "
                "they were written with",
            ) from exc
        return
    except (IntegrityError, StorageNotFoundError) as exc:
        ckpt.problem = exc.message
        return
    if ckpt.manifest.step != ckpt.step:
        ckpt.problem = f"holds step {ckpt.manifest.step} but is named for step {ckpt.step}"
        return
    for fname, entry in ckpt.manifest.files.items():
        listed = ckpt.sizes.get(fname)
        if listed != entry.size:
            got = "missing" if listed is None else f"{listed} bytes"
            ckpt.problem = f"{fname} is {got}, the manifest says {entry.size} bytes"
            return
    ckpt.valid = True


def _looks_encrypted(raw: bytes | None) -> bool:
    from spotwise.storage.crypt import looks_encrypted

    return raw is not None and looks_encrypted(raw)


def list_remote(uri: str) -> list[CheckpointInfo]:
    """The checkpoints at ``uri``, oldest first, with the listing and manifest checks."""
    return [c.info() for c in scan_remote(open_remote(uri))]
