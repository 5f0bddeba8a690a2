"""Restoring a Run from its newest checkpoint that loads and fits its objects.

Everything that can be checked without touching the live objects is checked first, so a
checkpoint that does not fit leaves them as they were and the next one is tried; only when
checkpoints load and none of them fits does the Run refuse to start: then the objects are not
the ones that wrote the directory, and guessing would train the wrong thing.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from spotwise.errors import CorruptCheckpointError, StateMismatchError
from spotwise.runtime.commit import LoadedCheckpoint
from spotwise.runtime.cursor import LoaderCursor
from spotwise.runtime.saver.base import Saver
from spotwise.runtime.state import STATE_VERSION, check_module_state, check_run_state, restore_rng

log = logging.getLogger(__name__)


def newest_fitting(
    candidates: Iterable[LoadedCheckpoint],
    run_dir: Path,
    restore: Callable[[LoadedCheckpoint], None],
    *,
    stacklevel: int,
) -> None:
    """``restore`` the first of ``candidates`` (newest first) that fits. One that loads but does
    not fit (a dropped or reshaped tensor, a changed dtype, no run state) is skipped with a
    warning naming its step and the reason, like one that does not load."""
    unfit: list[tuple[int, StateMismatchError]] = []
    for loaded in candidates:
        try:
            restore(loaded)
            return
        except StateMismatchError as exc:
            unfit.append((loaded.info.step, exc))
            message = (
                f"skipping checkpoint {loaded.info.path.name}: it does not fit this Run "
                f"({exc.message}); falling back to an older one"
            )
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    if unfit:
        step, newest = unfit[0]
        raise StateMismatchError(
            f"none of the {len(unfit)} valid checkpoints in {run_dir} fits this Run; "
            f"the newest (step {step}): {newest.message}",
            hint=newest.hint
            or "pass the same objects as the run that wrote the checkpoints, or use a new "
            "run directory",
        ) from newest


def apply_checkpoint(
    loaded: LoadedCheckpoint,
    state: Mapping[str, Any],
    *,
    accumulate: int,
    cursor: LoaderCursor,
    saver: Saver,
) -> tuple[dict[str, int], dict[str, Any]]:
    """Check that the whole checkpoint fits, then load it into ``state``'s objects, the cursor
    and the RNGs; returns its counters and the document. Should applying still fail, the next
    checkpoint tried re-applies every object completely."""
    where = loaded.info.path
    doc = _upgrade_v1(loaded.doc)
    try:  # the checks that need no objects: a checkpoint Run wrote had them at loading
        counters = check_run_state(doc, loaded.info.step)
    except CorruptCheckpointError as exc:
        raise StateMismatchError(f"{where}: {exc.message}", hint=exc.hint) from exc
    saver.check_fits(where, doc)
    if counters["accumulate"] != accumulate:
        raise StateMismatchError(
            f"{where} was written with accumulate={counters['accumulate']}, this Run has "
            f"accumulate={accumulate}",
            hint="resume with the same accumulate=, or use a new run directory",
        )
    saved = doc["state"]
    if set(saved) != set(state) - set(saver.sharded):
        raise StateMismatchError(
            f"{where} holds state {sorted(saved)}, this Run was given {sorted(state)}",
            hint="pass the same objects as the run that wrote the checkpoint, or use a "
            "new run directory",
        )
    for name, obj in state.items():
        if name in saver.sharded:
            continue
        if isinstance(obj, torch.nn.Module):
            if not isinstance(saved[name], dict):
                raise StateMismatchError(f"{where} holds no state dict for model {name!r}")
            check_module_state(name, obj, saved[name])
        elif isinstance(obj, torch.optim.Optimizer):
            _check_optimizer_state(where, name, obj, saved[name])
    cursor.check(where, doc)
    try:
        cursor.load(doc)
        saver.load_sharded(loaded, doc)  # first: a collective, and the one read that can fail
        for name, obj in state.items():
            if name not in saver.sharded:
                obj.load_state_dict(saved[name])
        restore_rng(doc["rng"])  # last: a failing object leaves the RNGs untouched
    except StateMismatchError:
        raise
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise StateMismatchError(
            f"{where} does not fit this Run: {type(exc).__name__}: {exc}",
            hint="the objects differ from the run that wrote it; use a new run directory "
            "or restore the original configuration",
        ) from exc
    return counters, doc


_V1_SECTIONS = {
    "models": "model",
    "optimizers": "optimizer",
    "schedulers": "scheduler",
    "scalers": "scaler",
}


def _upgrade_v1(doc: Any) -> Any:
    """A version-1 document (objects in four fixed sections, ``main`` for a single one) in
    today's layout, so a run started before the upgrade resumes after it. Anything malformed
    is left as it is, for the checks that follow to refuse."""
    meta = doc.get("spotwise") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or meta.get("version") != 1:
        return doc
    sections = [doc.get(kind) for kind in _V1_SECTIONS]
    if not all(isinstance(section, dict) for section in sections):
        return doc
    state = {
        prefix if name == "main" else f"{prefix}.{name}": value
        for prefix, section in zip(_V1_SECTIONS.values(), sections, strict=True)
        for name, value in section.items()
    }
    upgraded = {k: v for k, v in doc.items() if k not in _V1_SECTIONS}
    upgraded["spotwise"] = {**meta, "version": STATE_VERSION, "accumulate": 1}
    upgraded["state"] = state
    return upgraded


def _check_optimizer_state(where: Path, name: str, optimizer: Any, saved: Any) -> None:
    """Refuse an optimizer state whose parameter groups differ from the live optimizer's (what
    ``load_state_dict`` would raise on), before any object has been modified."""
    live = optimizer.state_dict().get("param_groups")
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(live, list):  # not a torch optimizer: its own load_state_dict decides
        return
    if (
        not isinstance(groups, list)
        or not isinstance(saved.get("state"), dict)
        or len(groups) != len(live)
        or any(
            not isinstance(g, dict)
            or not isinstance(g.get("params"), list)
            or len(g["params"]) != len(ours["params"])
            for g, ours in zip(groups, live, strict=False)
        )
    ):
        raise StateMismatchError(
            f"{where} does not fit optimizer {name!r}: its parameter groups differ",
            hint="the optimizer differs from the run that wrote it; use a new run directory or "
            "restore the original configuration",
        )
