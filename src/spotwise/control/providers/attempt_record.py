"""What a remote machine leaves in the job's object store when its command ends: the attempt's
exit record (``exit.json``) and output (``output.log``), written by
``python -m spotwise.control.providers.aws report`` from the machine's bootstrap script. A
controller that cannot see the machine's process reads its exit code here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spotwise.errors import StorageNotFoundError


def exit_record(store: Any) -> dict[str, Any] | None:
    """The attempt's exit record from ``store`` (an ``S3Storage`` at the attempt's prefix),
    or None while there is none (object stores write whole objects: a malformed one is not
    ours, so no exit is known)."""
    try:
        record: dict[str, Any] = json.loads(store.get_bytes("exit.json"))
        int(record["exit_code"]), float(record["ended_at"])
    except StorageNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None
    return record


def copy_log(store: Any, log: Path, n: int, where: str) -> None:
    """Append the attempt's uploaded output to the job log, once (``where``: the machine, as
    the log's header names it)."""
    marker = log.with_name(f".remote-log-{n}")
    if marker.exists():
        return
    try:
        text = store.get_bytes("output.log")
    except StorageNotFoundError:
        text = b""
    with open(log, "ab") as f:
        f.write(f"[spotwise] attempt {n} on {where}\n".encode() + text)
    marker.touch()
