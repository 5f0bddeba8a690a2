"""Map a model over a dataset in fixed shards, exactly once, across kills and several workers.

    from spotwise.batch import run_batch
    result = run_batch(dataset, lambda x: {"logits": model(x)}, "outputs/preds",
                       model=model, shard_size=2000, batch_size=512)

Commit order for each shard, under a live lease: compute all its outputs in memory; write its
ledger entry (size and CRC32C of the bytes about to be written); write the output file (an
atomic put: a reader sees all of it or nothing); mark the lease finished. A shard is committed
when its output file matches its ledger entry, so a worker killed anywhere leaves each shard
either committed or redone later, and because the bytes depend only on the model and the
items, the redo is byte-identical. Puts go through :mod:`spotwise.storage` (local: temp file,
fsync, rename, directory fsync; S3: checksummed PUT), the one write path we have for objects.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import crc32c
import torch
from torch.utils.data import DataLoader, Subset

from spotwise.batch.codec import concat_tensors, encode_table, encode_tensors
from spotwise.batch.leases import LeaseBoard, open_leases
from spotwise.batch.plan import (
    LEDGER_PREFIX,
    PLAN_KEY,
    Plan,
    check_same,
    ledger_entry,
    parse_ledger_entry,
    parse_plan,
)
from spotwise.errors import ConfigError, StorageNotFoundError
from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.leases import Clock, Lease
from spotwise.notices.base import NoticeSource
from spotwise.notices.watcher import open_notices
from spotwise.storage import Storage, is_remote, open_storage
from spotwise.telemetry.events import EventLog

log = logging.getLogger(__name__)

LEASES_FILE = "leases.db"  # default lease board of a local output directory


@dataclass
class BatchResult:
    shards: int  # in the plan
    computed: list[int]  # shards this worker computed and committed
    items_computed: int
    seconds: float

    @property
    def items_per_s(self) -> float:
        return self.items_computed / self.seconds if self.seconds > 0 else 0.0


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 over the model's parameter names, shapes, dtypes and bytes: outputs of other
    weights are never mixed with these."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:32]


def committed_shards(
    storage: Storage, plan: Plan, cache: dict[str, dict[str, Any] | None] | None = None
) -> dict[int, dict[str, Any]]:
    """Shards whose output file exists with the size its ledger entry names (one listing).
    ``cache`` keeps ledger entries already read, so a worker reads each one once."""
    cache = {} if cache is None else cache
    sizes = {o.key: o.size for o in storage.list()}
    done: dict[int, dict[str, Any]] = {}
    for key in sizes:
        if not key.startswith(LEDGER_PREFIX):
            continue
        if key not in cache:
            cache[key] = parse_ledger_entry(storage.get(key))
        entry = cache[key]
        if entry is None or not 0 <= entry["shard"] < plan.shards:
            continue
        if sizes.get(plan.shard_key(entry["shard"])) == entry["size"]:
            done[entry["shard"]] = entry
    return done


def verify_outputs(storage: Storage, plan: Plan) -> list[int]:
    """Shards that are missing or whose bytes do not match the ledger's CRC32C (empty: all
    outputs are complete and intact)."""
    done = committed_shards(storage, plan)
    bad = []
    for shard in range(plan.shards):
        entry = done.get(shard)
        if (
            entry is None
            or f"{crc32c.crc32c(storage.get(plan.shard_key(shard))):08x}" != entry["crc32c"]
        ):
            bad.append(shard)
    return bad


def outputs_sha256(storage: Storage, plan: Plan) -> str:
    """SHA-256 over the output files' bytes in shard order."""
    digest = hashlib.sha256()
    for shard in range(plan.shards):
        digest.update(storage.get(plan.shard_key(shard)))
    return digest.hexdigest()


def read_plan(storage: Storage) -> Plan | None:
    try:
        raw = storage.get(PLAN_KEY)
    except StorageNotFoundError:
        return None
    return parse_plan(raw, f"{storage.uri}/{PLAN_KEY}")


def ensure_plan(storage: Storage, plan: Plan) -> None:
    """Write the plan if the location has none; otherwise it must be the same plan."""
    stored = read_plan(storage)
    if stored is None:
        foreign = [o.key for o in storage.list() if o.key != LEASES_FILE
                   and not o.key.startswith(LEASES_FILE)]  # fmt: skip
        if foreign:
            raise ConfigError(
                f"{storage.uri} is not empty and holds no {PLAN_KEY} "
                f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                "nothing was overwritten",
                hint="use a new or empty output location",
            )
        storage.put(PLAN_KEY, plan.to_json())  # same bytes from every worker: a race is fine
        return
    check_same(stored, plan, storage.uri)


def default_leases(out: str) -> str:
    """Leases next to the outputs: a SQLite file in a local directory, objects under
    ``<prefix>/leases/`` in a bucket."""
    if is_remote(out):
        return out.rstrip("/") + "/leases"
    path = Path(out[len("file://") :] if out.startswith("file://") else out)
    return str(path.expanduser().absolute() / LEASES_FILE)


def _open_board(leases: str | None, out: str, clock: Clock) -> LeaseBoard:
    return open_leases(leases or default_leases(out), clock=clock)


def _check_sizes(lease_ttl_s: float, batch_size: int) -> None:
    if lease_ttl_s <= 0:
        raise ConfigError(f"lease_ttl_s must be > 0, got {lease_ttl_s}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")


def run_batch(
    dataset: Any,
    fn: Callable[[Any], Any],
    out: str | os.PathLike[str],
    *,
    model: torch.nn.Module | str,
    shard_size: int,
    batch_size: int = 256,
    kind: str = "tensors",
    leases: str | LeaseBoard | None = None,
    name: str | None = None,
    lease_ttl_s: float = 60.0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    events: str | os.PathLike[str] | None = None,
    notices: NoticeSource | str | None = "auto",
    verify: bool = True,
    clock: Clock = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> BatchResult:
    """Compute every shard of ``dataset`` not yet committed under ``out``; returns once all
    shards (this worker's and the others') are committed. ``fn`` maps one batch to a dict of
    tensors (one row per item; ``kind="tensors"``) or to a pyarrow Table / dict of columns
    (``kind="table"``). A terminate notice stops the worker between batches with exit code 75
    (its lease is handed back at once); nothing partial is written."""
    _check_sizes(lease_ttl_s, batch_size)
    out = os.fspath(out)
    storage = open_storage(out)
    fingerprint = model if isinstance(model, str) else model_fingerprint(model)
    plan = Plan(len(dataset), shard_size, fingerprint, kind)
    ensure_plan(storage, plan)
    board = leases if isinstance(leases, LeaseBoard) else _open_board(leases, out, clock)
    holder = name or f"{socket.gethostname()}:{os.getpid()}"
    log_events = EventLog(events) if events is not None else None
    source = open_notices(notices)  # the same notice sources as spotwise.Run
    worker = _Worker(
        dataset,
        fn,
        storage,
        plan,
        board,
        holder,
        lease_ttl_s,
        batch_size,
        collate_fn,
        log_events,
        source,
        clock,
    )
    started = time.perf_counter()
    try:
        worker.run(verify, sleep)
    finally:
        worker.abandon()
        if source is not None:
            source.close()
    if log_events is not None:
        log_events.emit("batch-done", holder=holder, computed=worker.computed)
    return BatchResult(plan.shards, worker.computed, worker.items, time.perf_counter() - started)


class _Worker:
    """One worker's handling of a leased shard."""

    def __init__(
        self,
        dataset: Any,
        fn: Callable[[Any], Any],
        storage: Storage,
        plan: Plan,
        board: LeaseBoard,
        holder: str,
        ttl_s: float,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any] | None,
        events: EventLog | None,
        notices: NoticeSource | None,
        clock: Clock,
    ) -> None:
        self.dataset, self.fn, self.storage, self.plan = dataset, fn, storage, plan
        self.board, self.holder, self.ttl_s, self.batch_size = board, holder, ttl_s, batch_size
        self.collate_fn, self.events, self.notices, self.clock = collate_fn, events, notices, clock
        self.computed: list[int] = []
        self.items = 0
        self.ledger: dict[str, dict[str, Any] | None] = {}
        self._pending: tuple[threading.Thread, Lease, int, str, list[BaseException]] | None = None

    def run(self, verify: bool, sleep: Callable[[float], None]) -> None:
        """Claim and compute shards until every shard is committed (by this worker or others),
        then, with ``verify``, redo any whose output no longer matches its ledger entry."""
        storage, plan, board, ledger = self.storage, self.plan, self.board, self.ledger
        while True:
            done = committed_shards(storage, plan, ledger)
            todo = [s for s in range(plan.shards) if s not in done]
            if not todo and verify:
                self.flush()
                todo = verify_outputs(storage, plan)
                for shard in todo:  # damaged since: drop the entry so the shard is redone
                    log.warning("shard %d does not match its ledger entry; redoing it", shard)
                    storage.delete(plan.ledger_key(shard))
                    ledger.pop(plan.ledger_key(shard), None)
                    board.reopen(shard)
            if not todo:
                break
            lease = board.claim(self.holder, todo, self.ttl_s)
            if lease is None:  # the rest is leased by live workers: wait for them or expiry
                if self.pending:
                    self.flush()  # our own shard being written may be all that is left
                    continue
                self.check_notice(None)
                sleep(min(1.0, self.ttl_s / 4))
                continue
            self.do(lease)
        self.flush()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, holder=self.holder, **fields)

    def do(self, lease: Lease) -> None:
        self._emit(
            "lease", shard=lease.key, token=lease.token, until=lease.expires_at, pid=os.getpid()
        )
        start, stop = self.plan.bounds(lease.key)
        loader = DataLoader(
            Subset(self.dataset, range(start, stop)),
            batch_size=self.batch_size,
            shuffle=False,
            collate_fn=self.collate_fn,
        )
        parts = []
        held: Lease | None = lease
        with torch.no_grad():
            for batch in loader:
                self.check_notice(held)
                held = self._keep(held)
                if held is None:
                    return
                parts.append(self.fn(batch))
        data = (
            encode_tensors(concat_tensors(parts, stop - start))
            if self.plan.kind == "tensors"
            else encode_table(parts, stop - start)
        )
        held = self._keep(held)  # still ours (renewed if a third of it has passed)
        if held is None:
            return
        self.flush()
        crc = f"{crc32c.crc32c(data):08x}"
        entry = ledger_entry(lease.key, start, stop, len(data), crc)
        errors: list[BaseException] = []
        writer = threading.Thread(target=self._write, args=(lease.key, entry, data, errors),
                                  name="spotwise-batch-commit")  # fmt: skip
        writer.start()  # the next shard is computed while this one is written
        self._pending = (writer, held, stop - start, crc, errors)

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def abandon(self) -> None:
        """On an error: let a write under way end, without marking its lease finished."""
        if self._pending is not None:
            self._pending[0].join()
            self._pending = None

    def _write(self, shard: int, entry: bytes, data: bytes, errors: list[BaseException]) -> None:
        try:
            self.storage.put(self.plan.ledger_key(shard), entry)
            self.storage.put(self.plan.shard_key(shard), data)
        except BaseException as exc:  # raised on the worker's thread by flush()
            errors.append(exc)

    def flush(self) -> None:
        """Wait for the shard being written and mark its lease finished."""
        if self._pending is None:
            return
        writer, lease, items, crc, errors = self._pending
        self._pending = None
        writer.join()
        if errors:
            raise errors[0]
        self.ledger.pop(self.plan.ledger_key(lease.key), None)  # re-read: it was rewritten
        self.board.finish(lease)
        self.computed.append(lease.key)
        self.items += items
        self._emit("shard-written", shard=lease.key, token=lease.token, crc32c=crc)
        log.info("shard %d/%d committed (%d by this worker)", lease.key + 1, self.plan.shards,
                 len(self.computed))  # fmt: skip

    def _keep(self, lease: Lease | None) -> Lease | None:
        """Renew the lease once a third of it has passed; None if it was lost."""
        if lease is None:
            return None
        if lease.expires_at - self.clock() > self.ttl_s * 2 / 3:
            return lease
        renewed = self.board.renew(lease, self.ttl_s)
        if renewed is None:
            log.warning(
                "lost the lease on shard %d (it expired); leaving it to its new holder", lease.key
            )
            self._emit("lease-lost", shard=lease.key, token=lease.token)
            return None
        self._emit("renew", shard=lease.key, token=lease.token, until=renewed.expires_at)
        return renewed

    def check_notice(self, lease: Lease | None) -> None:
        if self.notices is None:
            return
        notice = self.notices.current()
        if notice is None or not notice.is_terminate:
            return
        self.flush()  # the shard being written is committed: that work is kept
        if lease is not None:  # hand the shard back now instead of at expiry
            released = self.board.renew(lease, 0.0)
            if released is not None:
                self._emit("release", shard=lease.key, token=lease.token, until=released.expires_at)
        self.notices.acknowledge(notice)
        self._emit("interrupted", source=notice.source)
        print(
            f"spotwise: {notice.source} notice: stopping batch worker {self.holder} after "
            f"{len(self.computed)} shard(s); exiting with code {EXIT_INTERRUPTED} "
            "(restart to continue)",
            file=sys.stderr,
            flush=True,
        )
        self.notices.close()
        raise SystemExit(EXIT_INTERRUPTED)


def describe(storage: Storage) -> Mapping[str, Any] | None:
    """Progress of the batch job stored at ``storage``: shards done of all, items done."""
    plan = read_plan(storage)
    if plan is None:
        return None
    done = committed_shards(storage, plan)
    items = sum(e["stop"] - e["start"] for e in done.values())
    return {"shards": plan.shards, "done": len(done), "items": plan.items, "items_done": items}
