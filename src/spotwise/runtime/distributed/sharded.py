"""Saving and loading a Run's state under ``torch.distributed``: the models' and optimizers'
state through torch's own machinery (``get_model_state_dict``/``get_optimizer_state_dict``,
DCP ``save``/``load`` with :mod:`spotwise.runtime.distributed.dcp_storage`), everything else
as today.

One checkpoint directory, one manifest, written by rank 0 last:

- ``dcp-<rank>.safetensors``: the tensors DCP's plan gives each rank (a replicated DDP tensor
  once, on one rank; an FSDP2 shard on the rank that holds it).
- ``rank-<rank>.safetensors`` / ``rank-<rank>.json``: each rank's RNG state and ``run.extras``.
- ``tensors.safetensors`` / ``state.json``: rank 0's copy of everything replicated (counters,
  the loader position, schedulers and other objects), the JSON of the DCP states' non-tensor
  parts (learning rates, betas...) and DCP's metadata as JSON.

A save: on the training thread, every rank together plans it with DCP and packs its share of
the tensors (:func:`stage`; for a background save, copied into reused buffers: the only stall).
Then every rank writes and fsyncs its files (:class:`PendingSave`, in the background or at
once); their sizes and CRCs reach rank 0 (an all-gather, which is also the barrier) only when
every rank's writes are done, rank 0 writes the manifest and renames the directory into place
(:func:`spotwise.runtime.commit.commit_files`), then every rank learns the outcome, so all of
them raise together when any part failed.

Without a shared file system (an ``s3://`` run directory: each rank stages in a local directory
of its own) the object store carries the checkpoint instead: every rank writes and fsyncs its
files in its own temporary directory and uploads them, the same all-gather tells rank 0 that
every upload finished, and rank 0 uploads the manifest last
(:func:`spotwise.runtime.tiered.commit_remote`); the local copies are then removed. A resume
pulls the agreed remote checkpoint into each rank's directory (:func:`agreed_checkpoints`).
"""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from spotwise.checkpoint.durable import remove_tree
from spotwise.checkpoint.format import STATE_FILE, TENSORS_FILE, parse_state, step_dir_name
from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.remote import RemoteCheckpoint, scan_remote
from spotwise.checkpoint.write import TMP_PREFIX, write_durable
from spotwise.errors import (
    ConfigError,
    CorruptCheckpointError,
    IntegrityError,
    SaveError,
    StateMismatchError,
    StorageError,
    StorageNotFoundError,
)
from spotwise.runtime import distributed
from spotwise.runtime.commit import (
    LoadedCheckpoint,
    commit_files,
    fresh_buffer,
    list_checkpoints,
    load_checkpoint,
)
from spotwise.runtime.distributed import Ranks
from spotwise.runtime.distributed.dcp_storage import (
    DCP_FILE,
    SpotwiseReader,
    SpotwiseWriter,
    dcp_tensors,
)
from spotwise.runtime.format import TensorBlob, pack_tensors, parse_safetensors
from spotwise.runtime.snapshot import SnapshotBuffer, on_cache_line
from spotwise.runtime.state import StateEncoder, capture_rng, decode
from spotwise.runtime.tiered import commit_remote, pull_alone, push_files
from spotwise.storage.base import Storage

log = logging.getLogger(__name__)

RANK_TENSORS = "rank-{rank:05d}.safetensors"
RANK_STATE = "rank-{rank:05d}.json"
_WRITTEN_BY = re.compile(r"^(?:dcp|rank)-(\d+)\.(?:safetensors|json)$")  # a rank's own file
_MARK = "__dcp__"  # where a tensor of a DCP state sits in its JSON skeleton


def sharded_objects(state: Mapping[str, Any]) -> dict[str, tuple[torch.nn.Module, Any]]:
    """The objects whose state goes through DCP: every model (paired with itself) and every
    optimizer (paired with the model that owns its parameters, which DCP needs to name them)."""
    models = {n: o for n, o in state.items() if isinstance(o, torch.nn.Module)}
    owners = {id(p): m for m in models.values() for p in m.parameters()}
    out: dict[str, tuple[torch.nn.Module, Any]] = {n: (m, None) for n, m in models.items()}
    for name, obj in state.items():
        if isinstance(obj, torch.optim.Optimizer):
            params = [p for g in obj.param_groups for p in g["params"]]
            model = owners.get(id(params[0])) if params else None
            if model is None:
                raise ConfigError(
                    f"optimizer {name!r} optimizes parameters of no model given to the Run",
                    hint="under torch.distributed pass the model too (model=...)",
                )
            out[name] = (model, obj)
    return out


def _state_dict(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    if optimizer is None:
        return get_model_state_dict(model)
    return get_optimizer_state_dict(model, optimizer)


def _split(value: Any, path: str, out: dict[str, torch.Tensor]) -> Any:
    """``value`` with each tensor (plain or DTensor) moved to ``out`` under its path and a
    marker left in its place."""
    if isinstance(value, torch.Tensor):
        out[path] = value
        return {_MARK: path}
    if isinstance(value, Mapping):
        return {k: _split(v, f"{path}/{k}", out) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_split(v, f"{path}/{i}", out) for i, v in enumerate(value)]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _join(value: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Inverse of :func:`_split`."""
    if isinstance(value, dict):
        if len(value) == 1 and _MARK in value:
            if value[_MARK] not in tensors:
                raise StateMismatchError(f"the distributed state names no tensor {value[_MARK]!r}")
            return tensors[value[_MARK]]
        return {k: _join(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_join(v, tensors) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def capture(
    objects: Mapping[str, tuple[torch.nn.Module, Any]],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The DCP states of ``objects``: their tensors by DCP key and their JSON skeletons."""
    tensors: dict[str, torch.Tensor] = {}
    skeletons = {}
    for name, (model, optimizer) in objects.items():
        skeleton = _split(_state_dict(model, optimizer), name, tensors)
        skeletons[name] = StateEncoder().encode(skeleton, name)
    return tensors, skeletons


Pack = Callable[[str, Mapping[str, torch.Tensor]], TensorBlob]


def pack_live(file: str, tensors: Mapping[str, torch.Tensor]) -> TensorBlob:
    """A :data:`Pack` that copies nothing: for a save written before training goes on."""
    return pack_tensors(tensors)


class StagingBuffers:
    """A :data:`Pack` into reused host buffers, one per file this rank writes, for background
    saves: the copy is the stall, and the thread writing the copies out lets training change the
    live tensors meanwhile. A save may be staged only when the previous one's writes are done."""

    def __init__(self) -> None:
        self._buffers: dict[str, SnapshotBuffer] = {}

    def __call__(self, file: str, tensors: Mapping[str, torch.Tensor]) -> TensorBlob:
        return self._buffers.setdefault(file, SnapshotBuffer()).capture(tensors)


@dataclass
class Staged:
    """A distributed save after its collectives: the files this rank writes into ``tmp`` (tensor
    files as packed chunks, JSON files as documents, serialized by the writer). With ``remote``
    (no shared file system) ``tmp`` is this rank's own, and the object store is where the
    checkpoint is committed."""

    step: int
    tmp: Path
    chunks: dict[str, tuple[memoryview | bytes, ...]]
    documents: dict[str, Any]
    remote: Storage | None = None
    problem: str | None = None  # this rank could not create ``tmp``
    direct: bool = True  # large files written directly, else through the page cache

    def owns_tmp(self, ranks: Ranks) -> bool:
        """Whether this rank removes ``tmp``: its own, or the shared one on rank 0."""
        return self.remote is not None or ranks.is_coordinator


class SavePlans:
    """What a Run's saves reuse: DCP's plan of the last save and its metadata, while the layout
    of the state (names, dtypes, shapes, placements, on every rank) stays the same, so that a
    save runs DCP's planning collectives (gathering and scattering pickled plans: most of a
    background save's stall) only when it changes; and a count of the saves, which names
    their temporary directories alike on every rank without a broadcast."""

    def __init__(self) -> None:
        self.layout: tuple[Any, ...] | None = None
        self.plan: SavePlan | None = None  # this rank's final plan
        self.document: dict[str, Any] | None = None  # the metadata JSON, on rank 0
        self.saves = 0


def _layout(tensors: Mapping[str, torch.Tensor]) -> tuple[Any, ...]:
    """Everything DCP's plan depends on: the same tuple on every rank means the same plan."""
    return tuple(
        (key, t.dtype, t.shape, t.device.type)
        + ((t.placements, t.device_mesh) if isinstance(t, DTensor) else ())
        for key, t in tensors.items()
    )


def stage(
    ranks: Ranks,
    run_dir: Path,
    step: int,
    objects: Mapping[str, tuple[torch.nn.Module, Any]],
    common: tuple[Mapping[str, torch.Tensor], dict[str, Any]],
    own: tuple[Mapping[str, torch.Tensor], dict[str, Any]],
    plans: SavePlans,
    pack: Pack = pack_live,
    remote: Storage | None = None,
) -> Staged:
    """The collective part of saving step ``step``, together with every other rank: the
    temporary directory is created (in the shared ``run_dir`` by rank 0; with ``remote``, in
    its own ``run_dir`` by every rank), one all-reduce tells every rank that the shared one
    exists and whether any rank's layout changed since the last save; only then DCP plans the
    save anew (its collectives run here, on the calling thread). ``pack`` takes this rank's
    share of the tensors. ``common`` is rank 0's replicated state (the others' is ignored),
    ``own`` this rank's RNG and extras. Raises SaveError on every rank when the shared
    directory or DCP's plan failed (a rank's own directory failing fails the save at
    :func:`conclude_writes`)."""
    plans.saves += 1
    tmp = run_dir / f"{TMP_PREFIX}{step:08d}-{plans.saves:08x}"  # the same name on every rank
    staged = Staged(step, tmp, {}, {}, remote)
    error = _create_tmp(staged, ranks, run_dir)
    tensors, skeletons = capture(objects)
    layout = _layout(tensors)
    failed, changed = distributed.all_max(ranks, [int(bool(error)), int(layout != plans.layout)])
    if failed:
        problem = error or "rank 0 could not create the temporary directory"
        raise SaveError(
            f"could not save step {step}: {problem}", hint="earlier checkpoints are intact"
        )
    dcp_file = DCP_FILE.format(rank=ranks.rank)
    writer = SpotwiseWriter(tmp, ranks.rank, lambda live: pack(dcp_file, live))
    if changed:
        plans.layout = None  # until this plan succeeds
        try:  # DCP raises on every rank when any rank failed
            dcp.save(tensors, storage_writer=writer, process_group=ranks.group)
        except CheckpointException as exc:
            if staged.owns_tmp(ranks):
                remove_tree(tmp)
            raise SaveError(
                f"could not save step {step}: {exc}", hint="earlier checkpoints are intact"
            ) from exc
        plans.layout, plans.plan, plans.document = layout, writer.plan, writer.document
    else:
        assert plans.plan is not None
        planner = DefaultSavePlanner()
        planner.set_up_planner(tensors, None, ranks.is_coordinator)
        writer.write_data(plans.plan, planner)
        writer.document = plans.document
    if writer.blob is not None:
        staged.chunks[dcp_file] = (writer.blob.layout.header, *writer.blob.chunks)
    _stage_state(
        staged, ranks, own, common, {"objects": skeletons, "metadata": writer.document}, pack
    )
    return staged


def _create_tmp(staged: Staged, ranks: Ranks, run_dir: Path) -> str:
    """Create ``staged.tmp`` where this rank owns it. Returns what fails the save on every rank
    ("" if nothing): the shared directory's failure; a rank's own directory (with
    ``staged.remote``) failing is kept in ``staged.problem``, with no collective, and reported
    with the writes."""
    if staged.owns_tmp(ranks):
        try:
            staged.tmp.mkdir()
        except OSError as exc:
            problem = f"cannot create a directory in {run_dir}: {exc.strerror}"
            if staged.remote is None:
                return problem
            staged.problem = problem
    return ""


def _stage_state(
    staged: Staged,
    ranks: Ranks,
    own: tuple[Mapping[str, torch.Tensor], dict[str, Any]],
    common: tuple[Mapping[str, torch.Tensor], dict[str, Any]],
    dcp_doc: dict[str, Any],
    pack: Pack,
) -> None:
    """Add the state beside DCP's files to ``staged``: this rank's own (RNG, extras) and, on
    rank 0, the replicated state, whose document also records DCP's (``dcp_doc``) and the
    world size."""
    own_tensors, own_doc = own
    rank_tensors = RANK_TENSORS.format(rank=ranks.rank)
    blob = pack(rank_tensors, own_tensors)
    staged.chunks[rank_tensors] = (blob.layout.header, *blob.chunks)
    staged.documents[RANK_STATE.format(rank=ranks.rank)] = own_doc
    if ranks.is_coordinator:
        common_tensors, doc = common
        doc = {**doc, "dcp": dcp_doc}
        doc["spotwise"] = {**doc["spotwise"], "world": ranks.world}
        blob = pack(TENSORS_FILE, common_tensors)
        staged.chunks[TENSORS_FILE] = (blob.layout.header, *blob.chunks)
        staged.documents[STATE_FILE] = doc


def share_report(staged: Staged) -> dict[str, Any]:
    """Write and fsync this rank's files of ``staged`` (and, with ``staged.remote``, then
    upload them), as the JSON report :func:`conclude_writes` gathers: their manifest entries,
    or what failed. No collective, so it may run on a background thread, and it never raises:
    the other ranks wait for the report, whatever went wrong."""
    if staged.problem is not None:
        return {"files": {}, "problem": staged.problem}
    try:
        contents = dict(staged.chunks)
        for name, doc in staged.documents.items():
            contents[name] = (json.dumps(doc).encode(),)
        entries = write_durable(staged.tmp, contents, direct=staged.direct)
        if staged.remote is not None:
            push_files(staged.remote, staged.step, staged.tmp, entries)
    except Exception as exc:  # reported to every rank by conclude_writes
        problem = exc.message if isinstance(exc, SaveError) else f"{type(exc).__name__}: {exc}"
        return {"files": {}, "problem": problem}
    return {"files": entries, "problem": None}


def conclude_writes(ranks: Ranks, staged: Staged, report: Mapping[str, Any]) -> dict[str, Any]:
    """Gather every rank's :func:`share_report` (a collective, once all have written: it is
    also the barrier); returns every rank's manifest entries, or raises SaveError on every rank
    naming the ranks whose files failed (rank 0 removes the temporary directory)."""
    reports = distributed.gather_json(ranks, dict(report))
    problems = [f"rank {r}: {rep['problem']}" for r, rep in enumerate(reports) if rep["problem"]]
    if problems:
        if staged.owns_tmp(ranks):
            remove_tree(staged.tmp)
        raise SaveError(
            f"could not save step {staged.step}: {'; '.join(problems)}",
            hint="earlier checkpoints are intact",
        )
    return {name: entry for rep in reports for name, entry in rep["files"].items()}


_WRITE, _COMMIT = 0, 1  # the phases of a PendingSave


class PendingSave:
    """One distributed save from the end of its stall (:func:`stage`) to its commit, driven by
    the training thread in the same order on every rank.

    Phase one: every rank writes and fsyncs its files (:func:`share_report`), in the
    background after :meth:`start`, on the one thread of ``pool``, which the Run keeps (a
    thread started per save stalled the training thread for a GIL switch interval, 5 ms or
    more, before it could go on). Phase two: rank 0 writes the manifest listing every rank's
    files and renames the directory (:func:`~spotwise.runtime.commit.commit_files`), then calls
    ``committed`` (retention, events). A phase ends only when every rank's part of it is done,
    and with a collective, so its threads never issue one: at a step boundary each rank
    proposes :meth:`busy` through the Run's per-step agreement, and :meth:`agreed` ends the
    phase once the agreed value says no rank is busy; :meth:`finish` ends the save at once
    (blocking). A rank killed while writing leaves a temporary directory without a manifest,
    which does not exist as a checkpoint; rank 0 removes it at the next start."""

    def __init__(
        self,
        ranks: Ranks,
        staged: Staged,
        metrics: Mapping[str, float],
        committed: Callable[[CheckpointInfo], None],
        pool: ThreadPoolExecutor,
    ) -> None:
        self.ranks, self.staged, self._pool = ranks, staged, pool
        self.step = staged.step
        self.staged_at = time.perf_counter()  # the end of the stall
        self._metrics, self._committed = dict(metrics), committed
        self._phase = _WRITE
        self._task: Future[None] | None = None  # this rank's part running in the pool
        self._report: dict[str, Any] | None = None
        self._error: BaseException | None = None  # rank 0's commit
        self._entries: dict[str, Any] = {}
        self._proposed: int | None = None  # the phase this rank's last proposal was about
        self._agreed_on: int | None = None  # ... and the one before, which agreed() receives
        self.timed_write: tuple[int, float] = (0, 0.0)  # bytes made durable here, seconds

    def start(self) -> None:
        """Write this rank's files in the background."""
        self._task = self._pool.submit(self._write)

    def busy(self) -> int:
        """This boundary's proposal: 1 while this rank's part of the current phase runs."""
        self._agreed_on, self._proposed = self._proposed, self._phase
        return int(self._task is not None and not self._task.done())

    def agreed(self, busy: int) -> bool:
        """Act on the agreed (maximum) of the proposals of one boundary ago: end the phase when
        they were about this phase and no rank was busy. True once the save is committed;
        raises SaveError on every rank when it failed."""
        if busy or self._agreed_on != self._phase:
            return False
        self._join()
        if self._phase == _WRITE:
            self._end_writes(background=True)
            return False
        self._end_commit()
        return True

    def finish(self) -> None:
        """Complete the save now, on every rank together (blocking): returns once committed,
        raises SaveError on every rank when any part failed."""
        if self._task is None and self._report is None:
            self._write()  # a blocking save: written on the calling thread
        self._join()
        if self._phase == _WRITE:
            self._end_writes(background=False)
        self._join()
        self._end_commit()

    def abandon(self) -> None:
        """Wait for this rank's thread and leave the save uncommitted, without a collective (the
        other ranks may be gone): for a Run ending on an error."""
        self._join()
        problem = self._error or (self._report or {}).get("problem")
        if problem is not None:
            log.error("background save of step %d failed: %s", self.step, problem)

    def _join(self) -> None:
        if self._task is not None:
            self._task.result()  # its function never raises: it keeps what failed
            self._task = None

    def _write(self) -> None:
        started = time.perf_counter()
        self._report = share_report(self.staged)
        nbytes = sum(entry["size"] for entry in self._report["files"].values())
        self.timed_write = (nbytes, time.perf_counter() - started)

    def _end_writes(self, *, background: bool) -> None:
        assert self._report is not None
        self._entries = conclude_writes(self.ranks, self.staged, self._report)
        self._phase = _COMMIT
        if not self.ranks.is_coordinator:
            return
        if background:
            self._task = self._pool.submit(self._commit)
        else:
            self._commit()

    def _commit(self) -> None:
        staged = self.staged
        try:
            if staged.remote is None:
                info = commit_files(staged.tmp, self.step, {}, self._entries, metrics=self._metrics)
            else:
                info = commit_remote(staged.remote, self.step, self._entries, metrics=self._metrics)
            self._committed(info)
        except BaseException as exc:  # reported to every rank by _end_commit
            self._error = exc

    def _end_commit(self) -> None:
        agreed = distributed.all_agree(self.ranks, self._error is None)
        if self.staged.remote is not None:  # uploaded: this rank's local copy is done with
            remove_tree(self.staged.tmp)
        if agreed:
            return
        error = self._error
        problem = "rank 0 could not commit" if error is None else f"rank 0: {error}"
        if isinstance(error, SaveError):
            problem = f"rank 0: {error.message}"
        raise SaveError(
            f"could not save step {self.step}: {problem}", hint="earlier checkpoints are intact"
        ) from error


def agreed_checkpoints(
    ranks: Ranks, run_dir: Path, remote: Storage | None = None
) -> Iterator[LoadedCheckpoint]:
    """The checkpoints every rank can read, newest first, the same sequence on every rank: rank
    0 lists the candidates; each rank reads the candidate's manifest, tensors and state, checks
    the type and size of every file and the bytes of its :func:`verify_share`, and one
    all-reduce of the verdicts skips it on all ranks when any rank failed. So each rank's files
    are checked by one rank, the cost split over the ranks, and a rank reads its share only
    once: the bytes are kept for :func:`restore`. Each yielded document has this rank's RNG
    and extras in place of rank 0's.

    With ``remote`` (no shared file system) the candidates are the valid checkpoints of the
    object store, and each rank first pulls the candidate into its own ``run_dir``, every byte
    checked (:func:`~spotwise.runtime.tiered.pull_alone`): a corrupt remote file fails every
    rank's pull, so all of them fall back together. The store failing on any rank (after its
    retries) raises on every rank, rather than falling back past a good checkpoint."""
    found: dict[int, RemoteCheckpoint] = {}
    if remote is not None:
        failure = None
        try:
            found = {c.step: c for c in scan_remote(remote) if c.valid}
        except StorageError as exc:
            failure = exc
        if not distributed.all_agree(ranks, failure is None):
            raise failure or _failed_elsewhere(remote)
        candidates = sorted(found, reverse=True)
    else:
        candidates = [i.step for i in reversed(list_checkpoints(run_dir)) if i.valid]
    steps = distributed.broadcast_ints(ranks, candidates if ranks.is_coordinator else None)
    for step in steps:
        path = run_dir / step_dir_name(step)
        loaded, problem = None, "another rank found a problem in its share of the files"
        failure = None
        try:
            if remote is not None:
                pull_alone(remote, found.get(step), run_dir)
            loaded = _load_for_rank(path, ranks)
        except (CorruptCheckpointError, IntegrityError, StorageNotFoundError) as exc:
            problem = exc.message
        except StorageError as exc:  # the store, not the checkpoint: no reason to fall back
            failure = exc
        verdict = _FAILED if failure is not None else _BAD if loaded is None else _OK
        agreed = distributed.all_max(ranks, [verdict])[0]
        if agreed == _FAILED:
            assert remote is not None
            raise failure or _failed_elsewhere(remote)
        if agreed == _BAD:
            message = f"skipping checkpoint {path.name}: {problem}; falling back to an older one"
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)
            continue
        assert loaded is not None
        yield loaded


_OK, _BAD, _FAILED = 0, 1, 2  # a rank's verdict on a candidate, the most severe one wins


def _failed_elsewhere(remote: Storage) -> StorageError:
    return StorageError(
        f"another rank could not read the checkpoints at {remote.uri}",
        hint="see that rank's error (credentials, network); the remote checkpoints are untouched",
    )


def verify_share(names: Iterable[str], rank: int, world: int) -> set[str]:
    """The files of a distributed checkpoint, beyond the tensors and state every rank reads,
    whose bytes rank ``rank`` of ``world`` checks: those rank ``i`` wrote fall to rank
    ``i % world``, which at the same world size is the rank that reads them (its RNG and
    extras, and under FSDP2 its shards), and anything else to rank 0, so that together the
    ranks check every file once."""
    mine = set()
    for name in names:
        written = _WRITTEN_BY.match(name)
        if (int(written.group(1)) % world if written else 0) == rank:
            mine.add(name)
    return mine


def _load_for_rank(path: Path, ranks: Ranks) -> LoadedCheckpoint:
    loaded = load_checkpoint(
        path, share=lambda manifest: verify_share(manifest.files, ranks.rank, ranks.world)
    )
    doc = loaded.doc
    meta = doc.get("spotwise") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or "world" not in meta:
        return loaded  # not distributed: the Run refuses it with the reason
    files = loaded.manifest.files
    name = RANK_STATE.format(rank=ranks.rank)
    if name not in files:  # more ranks now than wrote it: this rank starts its RNG afresh
        log.info("%s holds no state of rank %d; its RNGs are left as they are", path, ranks.rank)
        doc.update(rng=capture_rng(), extras=None)
        return loaded
    tensors_name = RANK_TENSORS.format(rank=ranks.rank)
    if tensors_name not in files:
        raise CorruptCheckpointError(f"{path} lists {name} but not {tensors_name}")
    # both are this rank's own files, so in its share: read and checked already
    own = parse_state(loaded.members[name].numpy().tobytes(), str(path / name))
    tensors = parse_safetensors(loaded.members[tensors_name], str(path))
    try:
        mine = decode(own, tensors)
    except (CorruptCheckpointError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise CorruptCheckpointError(f"{path / name} does not decode: {exc}") from exc
    if not isinstance(mine, dict):
        raise CorruptCheckpointError(f"{path / name} is not a rank's state")
    doc.update(rng=mine.get("rng"), extras=mine.get("extras"))
    return loaded


def check_fits(
    where: Path, doc: Any, objects: Mapping[str, tuple[torch.nn.Module, Any]]
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Refuse (StateMismatchError naming the tensor) a distributed state whose tensors differ in
    name, shape or dtype from these objects'; returns the saved skeletons and the live tensors
    (by DCP key)."""
    meta = doc.get("spotwise") if isinstance(doc, dict) else None
    section = doc.get("dcp") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or "world" not in meta:
        raise StateMismatchError(
            f"{where} was written by a single process, and this Run runs under torch.distributed",
            hint="resume it without torchrun, or use a new run directory",
        )
    if not isinstance(section, dict) or not isinstance(section.get("objects"), dict):
        raise StateMismatchError(f"{where} holds no distributed state")
    saved = dcp_tensors(section.get("metadata"), str(where))
    live, _ = capture(objects)
    for key, tensor in live.items():
        if key not in saved:
            raise StateMismatchError(f"{where} has no tensor {key!r}", hint=_FIT_HINT)
        dtype, shape = saved[key]
        if tuple(shape) != tuple(tensor.shape) or dtype != tensor.dtype:
            raise StateMismatchError(
                f"{where}: tensor {key!r} is {tuple(shape)} {dtype} in the checkpoint and "
                f"{tuple(tensor.shape)} {tensor.dtype} in this Run",
                hint=_FIT_HINT,
            )
    extra = sorted(set(saved) - set(live))
    if extra:
        raise StateMismatchError(
            f"{where} holds tensor {extra[0]!r}, which this Run's objects lack", hint=_FIT_HINT
        )
    missing = sorted(set(objects) - set(section["objects"]))
    if missing:
        raise StateMismatchError(f"{where} holds no state of {missing[0]!r}", hint=_FIT_HINT)
    return dict(section["objects"]), live


_FIT_HINT = "pass the same model and optimizer as the run that wrote it, or a new run directory"


def restore(
    ranks: Ranks,
    loaded: LoadedCheckpoint,
    doc: Any,
    objects: Mapping[str, tuple[torch.nn.Module, Any]],
) -> None:
    """Load the DCP states of ``objects`` from checkpoint ``loaded`` (a collective), whose
    ``doc`` the Run checked. ``dcp.load`` only reads and checks every chunk (the reader defers
    its copies), and one all-reduce of the ranks' verdicts comes before any live object
    changes, so a failed read on any rank leaves every rank's objects as they were (raising
    StateMismatchError on all of them). Then the chunks are copied: straight into a model's own
    tensors where :func:`_in_place_keys` allows, else into blank copies that
    ``set_model_state_dict``/``set_optimizer_state_dict`` take. Each rank plans its reads
    alone (DCP's load plan depends only on its own shards and the metadata; its gathering
    collectives would decide nothing), and the files this rank verified are not read again: a
    blank copy's shard stored whole in one of them (a resume at the same world size) is used
    where it lies."""
    where = loaded.info.path
    skeletons, live = check_fits(where, doc, objects)
    reader = SpotwiseReader(
        where,
        doc["dcp"]["metadata"],
        loaded.manifest.files,
        str(where / STATE_FILE),
        loaded.members,
    )
    in_place = {
        name: keys
        for name, (model, optimizer) in objects.items()
        if optimizer is None and (keys := _in_place_keys(model, skeletons[name], live)) is not None
    }
    direct = {key for keys in in_place.values() for key in keys}
    others = {k: t for k, t in live.items() if k not in direct}
    copies = _blank_copies(others, _stored_shards(reader, others))
    problem = None
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": each rank plans alone
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(
                {**copies, **{k: live[k] for k in direct}}, storage_reader=reader, no_dist=True
            )
    except CheckpointException as exc:
        problem = f"{where}: reading the distributed state failed: {exc}"
    if not distributed.all_agree(ranks, problem is None):
        raise StateMismatchError(problem or f"{where}: another rank could not read its shards")
    with torch.no_grad():
        for key in direct & reader.untiled:  # as a blank copy would read where no chunk lies
            _local(live[key]).zero_()
    reader.apply()
    for name, (model, optimizer) in objects.items():
        if name in in_place:
            continue
        state = _join(skeletons[name], copies)
        if optimizer is None:
            set_model_state_dict(model, state)
        else:
            set_optimizer_state_dict(model, optimizer, state)


def _in_place_keys(
    model: torch.nn.Module, skeleton: Any, live: Mapping[str, torch.Tensor]
) -> list[str] | None:
    """The DCP keys of a model's live tensors (as :func:`capture` returned them) when they can
    be loaded into directly: its state is tensors only (``skeleton``: no extra state), every
    live one is a view of the model's own parameters and buffers, and no module changes how it
    loads (``_load_from_state_dict``). That is what ``set_model_state_dict`` does then,
    without ``load_state_dict``'s scan of the whole state for each module, which is quadratic
    (most of the resume of a 2,000-layer model), and without a blank copy of each tensor. None
    otherwise."""
    if not isinstance(skeleton, dict) or not all(
        isinstance(v, dict) and set(v) == {_MARK} and v[_MARK] in live for v in skeleton.values()
    ):
        return None
    if any(type(m)._load_from_state_dict is not _MODULE_LOAD for m in model.modules()):
        return None
    keys = [v[_MARK] for v in skeleton.values()]
    owned = {_storage(t) for t in (*model.parameters(), *model.buffers())}
    if not all(_local(live[k]).numel() == 0 or _storage(live[k]) in owned for k in keys):
        return None
    return keys


_MODULE_LOAD = torch.nn.Module._load_from_state_dict


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _storage(tensor: torch.Tensor) -> int:
    return _local(tensor).untyped_storage().data_ptr()


def _stored_shards(
    reader: SpotwiseReader, live: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The live tensors (by DCP key) whose local shard lies whole, with the same shape and
    dtype, in a file this rank has read and verified: those tensors, as views of its bytes."""
    parsed: dict[str, dict[str, torch.Tensor]] = {}
    out = {}
    for key, tensor in live.items():
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if isinstance(tensor, DTensor):
            chunks = tensor.__create_chunk_list__()
            if len(chunks) != 1:
                continue
            offsets = torch.Size(chunks[0].offsets)
        else:
            offsets = torch.Size([0] * tensor.dim())
        location = reader.locations.get(MetadataIndex(key, offsets))
        if location is None or location[0] not in reader.preread or local.device.type != "cpu":
            continue
        file, name = location
        if file not in parsed:
            parsed[file] = parse_safetensors(reader.preread[file], str(reader.directory / file))
        stored = parsed[file].get(name)
        if stored is not None and stored.shape == local.shape and stored.dtype == local.dtype:
            out[key] = stored
    return out


def _blank_copies(
    live: Mapping[str, torch.Tensor], stored: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Tensors like ``live`` (a DTensor: its local shard, on the same mesh and placements) for
    ``dcp.load`` to fill: the ``stored`` shard itself where there is one, else zeroed (a part
    the checkpoint's chunks leave uncovered reads as zeros). The zeroed host ones are carved
    out of one fresh buffer, each on a cache line: a copy of the live tensors (``clone``) took
    half the resume's time, most of it faulting in new pages one by one."""
    local = {k: t.to_local() if isinstance(t, DTensor) else t for k, t in live.items()}
    host = [k for k, t in local.items() if t.device.type == "cpu" and k not in stored]
    offsets, total = {}, 0
    for key in host:
        offsets[key] = total
        total = on_cache_line(total + local[key].numel() * local[key].element_size())
    block = fresh_buffer(total, zeroed=True)
    copies = {}
    for key, tensor in local.items():
        if key in stored:
            blank = stored[key]
        elif key in offsets:
            size = tensor.numel() * tensor.element_size()
            start = offsets[key]
            blank = block[start : start + size].view(tensor.dtype).view(tensor.shape)
        else:  # on an accelerator
            blank = torch.zeros_like(tensor)
        original = live[key]
        if isinstance(original, DTensor):
            blank = DTensor.from_local(
                blank,
                original.device_mesh,
                original.placements,
                run_check=False,
                shape=original.shape,
                stride=original.stride(),
            )
        copies[key] = blank
    return copies


def consolidated(path: Path, name: str = "model") -> dict[str, torch.Tensor]:
    """The full, unsharded state dict of state entry ``name`` (a model) of checkpoint ``path``,
    read in this one process: from DCP shards of any world size (DCP loads without a process
    group), or from a single-process checkpoint's tensors. Raises CorruptCheckpointError or
    StateMismatchError naming what is missing."""
    loaded = load_checkpoint(path, share=lambda manifest: manifest.files)  # each file read once
    doc = loaded.doc
    meta = doc.get("spotwise") if isinstance(doc, dict) else None
    if not isinstance(meta, dict):
        raise StateMismatchError(f"{path} was not written by spotwise.Run (no run state in it)")
    if "world" not in meta:
        saved = doc["state"].get(name) if isinstance(doc.get("state"), dict) else None
        if not isinstance(saved, dict) or not all(
            isinstance(t, torch.Tensor) for t in saved.values()
        ):
            raise StateMismatchError(
                f"{path} holds no model state named {name!r}",
                hint="name the Run's model entry (state= key), e.g. --state model",
            )
        return dict(saved)
    section = doc.get("dcp")
    if not isinstance(section, dict):
        raise CorruptCheckpointError(f"{path} holds no distributed state")
    prefix = f"{name}/"
    shapes = {
        key: spec
        for key, spec in dcp_tensors(section.get("metadata"), str(path)).items()
        if key.startswith(prefix)
    }
    if not shapes:
        raise StateMismatchError(
            f"{path} holds no distributed state named {name!r}",
            hint="name the Run's model entry (state= key), e.g. --state model",
        )
    state = {key: torch.empty(size, dtype=dtype) for key, (dtype, size) in shapes.items()}
    reader = SpotwiseReader(
        path, section["metadata"], loaded.manifest.files, str(path), loaded.members
    )
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": that is the point
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:
        raise CorruptCheckpointError(f"{path}: its distributed state does not load: {exc}") from exc
    reader.apply()
    return {key[len(prefix) :]: tensor for key, tensor in state.items()}
