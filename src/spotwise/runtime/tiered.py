"""Two-tier checkpoints: commit to fast local disk, then copy to an object store in the background.

Training only ever waits for the local commit (``checkpoint.write_checkpoint``). A single
uploader thread then pushes the newest committed checkpoint to the remote ``Storage`` with the
object-store commit protocol: every data file first, ``manifest.json`` **last**. A reader that
lists the remote prefix sees a checkpoint only once its manifest exists, and trusts it only when
every file it names is there with the right size (and, when pulled, the right CRC32C).

On start (:meth:`TieredMirror.restore`), the newest committed checkpoint across both tiers wins:
a newer remote one is pulled into the local directory (verified, written, then renamed into
place); a newer local one (the previous process died before its upload finished) is uploaded.

Emergency saves (a spot notice): the checkpoint is committed locally first, which takes as long
as writing it to disk, and ``flush`` then waits for its upload. The local copy survives a process
crash and a stop/hibernate; the remote copy is what survives the VM. If the deadline hits first,
the remote still holds the previous committed checkpoint, never a partial one.

Remote retention follows the local policy, but only after a newer checkpoint has committed
remotely; a deletion removes the manifest first, so a half-deleted checkpoint is never trusted.

Distributed runs without a shared file system use the same protocol with several writers and no
mirror: each rank uploads its own files (:func:`push_files`), rank 0 the manifest last
(:func:`commit_remote`), and a resume pulls the agreed checkpoint into every rank's own
directory (:func:`pull_alone`); see :mod:`spotwise.runtime.distributed.sharded`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotwise import settings
from spotwise.checkpoint.durable import remove_tree
from spotwise.checkpoint.format import MANIFEST, step_dir_name
from spotwise.checkpoint.read import CheckpointInfo, check_bytes
from spotwise.checkpoint.remote import RemoteCheckpoint, open_remote, scan_remote
from spotwise.checkpoint.retention import RetentionPolicy, choose_deletions, delete_checkpoint
from spotwise.checkpoint.write import manifest_bytes, temporary_dir
from spotwise.errors import (
    CorruptCheckpointError,
    IntegrityError,
    NoCheckpointError,
    SaveError,
    StorageNotFoundError,
)
from spotwise.runtime.commit import commit_staged, list_checkpoints, verify_checkpoint
from spotwise.storage.base import Storage

log = logging.getLogger(__name__)


def staging_dir(uri: str, local_dir: str | os.PathLike[str] | None = None) -> Path:
    """The local directory that stages checkpoints of remote ``uri``.

    ``local_dir`` wins; else ``$SPOTWISE_CACHE_DIR/<name>-<hash>``; else
    ``~/.cache/spotwise/<name>-<hash>``, where the hash of the URI keeps two runs apart.
    """
    if local_dir is not None:
        return Path(local_dir).expanduser()
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", uri.split("://", 1)[-1].rstrip("/"))[-40:]
    base = settings.CACHE_DIR.path() or Path("~/.cache/spotwise").expanduser()
    return base / f"{name}-{digest}"


# --- moving checkpoints between tiers ----------------------------------------------------------
def push_files(storage: Storage, step: int, directory: Path, names: Iterable[str]) -> None:
    """Upload the data files ``names`` of ``directory`` as files of remote step ``step``. Until
    its manifest goes up (last), they are no checkpoint. A manifest already standing for this
    step (a step saved again after a fallback) is deleted first, so no file it lists is ever
    overwritten while it stands: a crash in between leaves no step ``step``, never one that
    fails its CRCs."""
    storage.delete(f"{step_dir_name(step)}/{MANIFEST}")
    for fname in names:
        storage.put(f"{step_dir_name(step)}/{fname}", directory / fname)


def push(storage: Storage, ckpt_dir: Path) -> None:
    """Upload one committed local checkpoint: data files first, the manifest last, after every
    byte was checked against the manifest (never upload bytes that differ from the commit)."""
    manifest, raw = check_bytes(ckpt_dir)
    push_files(storage, manifest.step, ckpt_dir, manifest.files)
    storage.put(f"{ckpt_dir.name}/{MANIFEST}", raw)


def commit_remote(
    storage: Storage,
    step: int,
    files: Mapping[str, Mapping[str, Any]],
    *,
    metrics: Mapping[str, float] | None = None,
) -> CheckpointInfo:
    """The object-store half of a distributed commit, once every rank has uploaded its
    ``files`` (names with their sizes and CRCs): the manifest listing them goes up last, and
    from then on remote step ``step`` exists. A file a rank never uploaded is missing from the
    listing, so a checkpoint lacking it stays invalid (:func:`scan_remote`)."""
    wall = time.time()
    raw = manifest_bytes(step, wall, metrics, files)
    name = step_dir_name(step)
    storage.put(f"{name}/{MANIFEST}", raw)
    total = sum(int(f["size"]) for f in files.values()) + len(raw)
    return CheckpointInfo(step, Path(name), wall, total, True, None, dict(metrics or {}))


def _download(storage: Storage, ckpt: RemoteCheckpoint, into: Path) -> None:
    """Fetch every file of ``ckpt`` and its manifest into the empty directory ``into`` and check
    them with the local reader (sizes and CRC32C, in bounded memory)."""
    if not ckpt.valid or ckpt.manifest is None or ckpt.manifest_raw is None:
        raise CorruptCheckpointError(f"{storage.uri}/{ckpt.name} is not valid: {ckpt.problem}")
    for fname in ckpt.manifest.files:
        storage.get(f"{ckpt.name}/{fname}", into / fname)
    (into / MANIFEST).write_bytes(ckpt.manifest_raw)
    try:
        check_bytes(into, step=ckpt.step)
    except CorruptCheckpointError as exc:
        raise CorruptCheckpointError(_remote_names(exc.message, storage, ckpt, into)) from exc


def _remote_names(message: str, storage: Storage, ckpt: RemoteCheckpoint, into: Path) -> str:
    """A local reader's message about a downloaded copy, naming the remote objects instead."""
    return message.replace(str(into), f"{storage.uri}/{ckpt.name}")


def pull(storage: Storage, ckpt: RemoteCheckpoint, run_dir: Path) -> Path:
    """Download a remote checkpoint into ``run_dir`` with the local commit protocol.

    Files land in a hidden temporary directory, are checked against the manifest's sizes and
    CRC32Cs, and the directory is committed like a local save (fsync, rename, fsync).
    Raises CorruptCheckpointError (or IntegrityError) and leaves nothing behind on failure.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / ckpt.name
    tmp = temporary_dir(run_dir, ckpt.step)
    try:
        _download(storage, ckpt, tmp)
        commit_staged(tmp, final)
    except BaseException:
        remove_tree(tmp)
        raise
    return final


def pull_alone(storage: Storage, ckpt: RemoteCheckpoint | None, run_dir: Path) -> Path:
    """Make remote ``ckpt`` the one checkpoint of ``run_dir``, a rank's local cache of a
    distributed run without a shared file system: the local ``step-*`` directories go (each
    is only a copy of a remote commit), then :func:`pull`. ``ckpt`` None (another rank listed
    a checkpoint this one does not see) raises CorruptCheckpointError."""
    if ckpt is None:
        raise CorruptCheckpointError("it is not listed (or not valid) at the remote for this rank")
    for info in list_checkpoints(run_dir):
        delete_checkpoint(info.path)
    return pull(storage, ckpt, run_dir)


def retain_remote(
    storage: Storage,
    policy: RetentionPolicy,
    newest_step: int,
    cache: dict[str, RemoteCheckpoint] | None = None,
) -> list[CheckpointInfo]:
    """Apply ``policy`` to the remote listing after step ``newest_step`` committed there;
    returns what was deleted (never ``newest_step`` or a newer one)."""
    remote = scan_remote(storage, cache)
    doomed = {c.step for c in choose_deletions([c.info() for c in remote], policy)}
    deleted = []
    for ckpt in remote:
        if ckpt.step in doomed and ckpt.step < newest_step:
            delete_remote(storage, ckpt)
            if cache is not None:
                cache.pop(ckpt.name, None)
            deleted.append(ckpt.info())
    return deleted


def delete_remote(storage: Storage, ckpt: RemoteCheckpoint) -> None:
    """Delete a remote checkpoint, manifest first so a half-deleted one is never trusted."""
    if MANIFEST in ckpt.sizes:
        storage.delete(f"{ckpt.name}/{MANIFEST}")
    for fname in ckpt.sizes:
        if fname != MANIFEST:
            storage.delete(f"{ckpt.name}/{fname}")


def verify_deep(storage: Storage, ckpt: RemoteCheckpoint, scratch: Path) -> None:
    """Download a (listing-valid) checkpoint into ``scratch`` and give it the same verdict as
    loading it would; a failure marks ``ckpt`` invalid with the problem."""
    if not ckpt.valid:
        return
    into = scratch / ckpt.name
    into.mkdir()
    try:
        _download(storage, ckpt, into)
        verdict = verify_checkpoint(into, step=ckpt.step)
        if not verdict.valid:
            ckpt.valid = False
            ckpt.problem = _remote_names(verdict.problem or "", storage, ckpt, into)
    except (CorruptCheckpointError, IntegrityError, StorageNotFoundError) as exc:
        ckpt.valid, ckpt.problem = False, exc.message
    finally:
        remove_tree(into)


def verify_remote(uri: str) -> list[CheckpointInfo]:
    """The checkpoints at ``uri``, oldest first, each downloaded and given the loading verdict
    (``spotwise ckpt verify`` and ``ckpt list --deep``; the listing checks alone, without torch,
    are :func:`spotwise.checkpoint.remote.list_remote`)."""
    storage = open_remote(uri)
    found = scan_remote(storage)
    with tempfile.TemporaryDirectory(prefix="spotwise-verify-") as scratch:
        for ckpt in found:
            verify_deep(storage, ckpt, Path(scratch))
    return [c.info() for c in found]


def pull_newest(storage: Storage, dest: Path) -> Path:
    """Download the newest valid remote checkpoint into ``dest`` (``spotwise ckpt pull``);
    a newer one that fails verification is skipped with a warning."""
    checkpoints = scan_remote(storage)
    for ckpt in reversed([c for c in checkpoints if c.valid]):
        try:
            return pull(storage, ckpt, dest)
        except (CorruptCheckpointError, IntegrityError) as exc:
            log.warning("skipping %s/%s: %s", storage.uri, ckpt.name, exc)
    raise NoCheckpointError(
        f"no valid checkpoint at {storage.uri} ({len(checkpoints)} found, none valid)",
        hint="check the URI (s3://bucket/prefix given as --run-dir) and the credentials",
    )


# --- the mirror that Run drives ----------------------------------------------------------------
@dataclass
class _UploadState:
    pending: CheckpointInfo | None = None
    busy: bool = False
    error: BaseException | None = None
    uploaded: list[int] = field(default_factory=list)


class TieredMirror:
    """A ``spotwise.runtime.run.Mirror`` backed by a remote ``Storage`` (see module docstring)."""

    def __init__(self, remote: Storage, *, retention: RetentionPolicy | None = None) -> None:
        self.remote = remote
        self.retention = retention or RetentionPolicy()
        self._state = _UploadState()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._manifests: dict[str, RemoteCheckpoint] = {}

    @classmethod
    def from_uri(cls, uri: str, *, retention: RetentionPolicy | None = None) -> TieredMirror:
        return cls(open_remote(uri), retention=retention)

    @property
    def uploaded_steps(self) -> list[int]:
        with self._cond:
            return list(self._state.uploaded)

    # -- Mirror protocol -------------------------------------------------------------------------
    def restore(self, run_dir: Path) -> None:
        """Make the newest committed checkpoint of either tier the newest local one."""
        local = [c for c in list_checkpoints(run_dir) if c.valid]
        local_step = local[-1].step if local else -1
        remote = scan_remote(self.remote, self._manifests)
        remote_valid = [c for c in remote if c.valid]
        remote_step = remote_valid[-1].step if remote_valid else -1
        for ckpt in reversed(remote_valid):
            if ckpt.step <= local_step:
                break
            try:
                pull(self.remote, ckpt, run_dir)
                log.info("pulled %s/%s into %s", self.remote.uri, ckpt.name, run_dir)
                return
            except (CorruptCheckpointError, IntegrityError) as exc:
                log.warning("remote %s/%s fails verification (%s); trying an older one",
                            self.remote.uri, ckpt.name, exc)  # fmt: skip
        if local_step > remote_step:
            log.info("uploading local step %d, newer than the remote's %d", local_step, remote_step)
            self.committed(local[-1], ())

    def committed(self, checkpoint: CheckpointInfo, deleted: Sequence[CheckpointInfo]) -> None:
        """Queue ``checkpoint`` for upload; a newer commit replaces one that has not started.

        Local deletions are not mirrored one by one: after each upload, the retention policy is
        applied to the remote listing itself.
        """
        with self._cond:
            self._state.pending = checkpoint
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._upload_loop, name="spotwise-upload", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every committed checkpoint is safe remotely; raise SaveError if the newest
        upload failed (the local checkpoint is intact either way)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._state.pending is not None or self._state.busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise SaveError(
                        f"upload to {self.remote.uri} did not finish within {timeout_s:.0f} s",
                        hint="the local checkpoint is intact; the remote keeps the previous one",
                    )
                self._cond.wait(left)
            error, self._state.error = self._state.error, None
        if error is not None:
            hint = getattr(error, "hint", None) or "the local checkpoint is intact"
            raise SaveError(f"upload to {self.remote.uri} failed: {error}", hint=hint) from error

    # -- the uploader thread ---------------------------------------------------------------------
    def _upload_loop(self) -> None:
        while True:
            with self._cond:
                if self._state.pending is None:
                    self._cond.notify_all()
                    return  # restarted by the next commit
                job, self._state.pending = self._state.pending, None
                self._state.busy = True
            error: BaseException | None = None
            try:
                self._upload(job)
            except Exception as exc:  # kept for flush(); training goes on with local checkpoints
                error = exc
                log.error("upload of step %d to %s failed: %s", job.step, self.remote.uri, exc)
            with self._cond:
                self._state.busy = False
                if error is None:
                    self._state.uploaded.append(job.step)
                    self._state.error = None
                elif self._state.pending is None:  # a newer upload would supersede this error
                    self._state.error = error
                self._cond.notify_all()

    def _upload(self, job: CheckpointInfo) -> None:
        if not (job.path / MANIFEST).exists():
            log.info("step %d was deleted locally before its upload started; skipped", job.step)
            return
        started = time.perf_counter()
        push(self.remote, job.path)
        log.info("uploaded step %d to %s in %.1fs", job.step, self.remote.uri,
                 time.perf_counter() - started)  # fmt: skip
        retain_remote(self.remote, self.retention, job.step, self._manifests)
