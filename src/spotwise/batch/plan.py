"""The plan of a batch job: which items go in which shard, and what identifies the outputs.

A plan is written once, as ``batch.json`` at the top of the output location, before any shard.
Every later worker compares its own plan with it, so outputs of a different model, shard size,
dataset length or output kind are never mixed or overwritten: the mismatch is an error naming
the field, the stored value and the new one. Pure: no I/O here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from spotwise.errors import PlanMismatchError

PLAN_KEY = "batch.json"
LEDGER_PREFIX = "ledger/"
FORMAT = "spotwise-batch"
VERSION = 1
KINDS = {"tensors": "safetensors", "table": "parquet"}  # output kind -> file extension


@dataclass(frozen=True)
class Plan:
    items: int  # dataset length
    shard_size: int
    model: str  # fingerprint of the model (a hash of its weights, or a name the user chose)
    kind: str = "tensors"  # "tensors" (safetensors) or "table" (Parquet)

    def __post_init__(self) -> None:
        if self.items < 1:
            raise PlanMismatchError(f"the dataset is empty (length {self.items})")
        if self.shard_size < 1:
            raise PlanMismatchError(f"shard_size must be >= 1, got {self.shard_size}")
        if self.kind not in KINDS:
            raise PlanMismatchError(
                f"unknown output kind {self.kind!r}", hint=f"use one of {sorted(KINDS)}"
            )

    @property
    def shards(self) -> int:
        return -(-self.items // self.shard_size)

    def bounds(self, shard: int) -> tuple[int, int]:
        """Items ``[start, stop)`` of ``shard``; the last shard may be short."""
        start = shard * self.shard_size
        return start, min(start + self.shard_size, self.items)

    def shard_key(self, shard: int) -> str:
        return f"shard-{shard:06d}.{KINDS[self.kind]}"

    def ledger_key(self, shard: int) -> str:
        return f"{LEDGER_PREFIX}shard-{shard:06d}.json"

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, indent=1).encode()


def parse_plan(raw: bytes, where: str) -> Plan:
    try:
        doc = json.loads(raw)
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError("not a spotwise batch plan")
        return Plan(int(doc["items"]), int(doc["shard_size"]), str(doc["model"]), str(doc["kind"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PlanMismatchError(
            f"{where} is not a spotwise batch plan ({exc})",
            hint="point the batch job at a new or empty output location",
        ) from exc


def check_same(stored: Plan, new: Plan, where: str) -> None:
    """Raise naming every field in which ``new`` differs from the plan the outputs were made by."""
    labels = {"items": "dataset length", "shard_size": "shard size", "model": "model",
              "kind": "output kind"}  # fmt: skip
    diffs = [
        f"{label}: the outputs have {getattr(stored, f)!r}, this run has {getattr(new, f)!r}"
        for f, label in labels.items()
        if getattr(stored, f) != getattr(new, f)
    ]
    if diffs:
        raise PlanMismatchError(
            f"{where} holds outputs of a different batch job; nothing was overwritten:\n  "
            + "\n  ".join(diffs),
            hint="use a new output location, or run with the same model, dataset and shard size",
        )


def ledger_entry(shard: int, start: int, stop: int, size: int, crc: str) -> bytes:
    return json.dumps(
        {"shard": shard, "start": start, "stop": stop, "size": size, "crc32c": crc},
        sort_keys=True,
    ).encode()


def parse_ledger_entry(raw: bytes) -> dict[str, Any] | None:
    """A ledger entry, or None if it is torn or malformed (then the shard is simply redone)."""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            return None
        return {"shard": int(doc["shard"]), "start": int(doc["start"]), "stop": int(doc["stop"]),
                "size": int(doc["size"]), "crc32c": str(doc["crc32c"])}  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None
