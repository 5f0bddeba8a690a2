"""Run's flat keywords of 0.1, mapped onto ``state=`` and ``checkpoint=``.

``Run(model=m, optimizer=o, every=50)`` is ``Run(state={"model": m, "optimizer": o},
checkpoint=CheckpointConfig(every=50))``; the flat spellings keep working for one release and
warn (DeprecationWarning) with the replacement. ``state=`` itself is checked here too: every
object must have ``state_dict()``/``load_state_dict()``.

``mirror=`` and ``local_dir=`` were Run's own keywords beside ``checkpoint=`` until they moved
into it, so code of that time passes both: they are merged into ``checkpoint=`` (with the same
warning) unless it sets them too. For 0.1's keywords it stays either one or the other.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from spotwise.errors import ConfigError
from spotwise.runtime.config import CheckpointConfig, checkpoint_config
from spotwise.runtime.sampler import has_state

STATE_SPELLINGS = ("model", "optimizer", "scheduler", "scaler")
CHECKPOINT_FIELDS = tuple(f.name for f in dataclasses.fields(CheckpointConfig) if f.init)
BESIDE_CHECKPOINT = ("mirror", "local_dir")  # Run keywords next to checkpoint=, moved into it


def settle(
    state: Mapping[str, Any] | None,
    checkpoint: CheckpointConfig | None,
    flat: Mapping[str, Any],
    *,
    stacklevel: int,
) -> tuple[dict[str, Any], CheckpointConfig]:
    """The state mapping and the checkpoint config from Run's keywords and the deprecated
    ``flat`` ones (a name that is neither is a TypeError, as for any function)."""
    unknown = sorted(set(flat) - set(STATE_SPELLINGS) - set(CHECKPOINT_FIELDS))
    if unknown:
        raise TypeError(f"Run() got an unexpected keyword argument {unknown[0]!r}")
    if flat:
        warnings.warn(_deprecation(flat), DeprecationWarning, stacklevel=stacklevel + 1)
    spelled = {k: flat[k] for k in STATE_SPELLINGS if k in flat}
    fields = {k: flat[k] for k in CHECKPOINT_FIELDS if k in flat and k not in BESIDE_CHECKPOINT}
    config = checkpoint_config(checkpoint, fields)
    beside = {k: flat[k] for k in BESIDE_CHECKPOINT if flat.get(k) is not None}
    for key in beside:
        if getattr(config, key) is not None:
            raise ConfigError(
                f"{key}= is given twice: to Run and in checkpoint=CheckpointConfig({key}=...)",
                hint=f"keep only CheckpointConfig({key}=...)",
            )
    return stateful(state, **spelled), dataclasses.replace(config, **beside) if beside else config


def _deprecation(flat: Mapping[str, Any]) -> str:
    spelled = [k for k in STATE_SPELLINGS if k in flat]
    fields = [k for k in CHECKPOINT_FIELDS if k in flat]
    moves = []
    if spelled:
        names = ", ".join(f'"{k}": ...' for k in spelled)
        moves.append(f"{', '.join(f'{k}=' for k in spelled)} -> state={{{names}}}")
    if fields:
        given = ", ".join(f"{k}=..." for k in fields)
        keys = ", ".join(f"{k}=" for k in fields)
        moves.append(f"{keys} -> checkpoint=CheckpointConfig({given})")
    return f"Run's flat keywords are deprecated and go in the next release: {'; '.join(moves)}"


def stateful(state: Mapping[str, Any] | None, **spelled: Any) -> dict[str, Any]:
    """The one mapping of checkpointed objects: ``state=`` plus the keyword spellings
    (``model=m`` is ``state={"model": m}``; a dict or list of them becomes ``model.<key>``)."""
    if state is not None and not isinstance(state, Mapping):
        raise ConfigError(
            f"state= takes a mapping of names to objects, got {type(state).__name__}",
            hint='pass state={"model": model, "optimizer": opt}',
        )
    named = {str(k): v for k, v in (state or {}).items()}
    for kind, obj in spelled.items():
        if obj is None:
            continue
        if isinstance(obj, Mapping):
            entries = {f"{kind}.{k}": v for k, v in obj.items()}
        elif isinstance(obj, (list, tuple)):
            entries = {f"{kind}.{i}": v for i, v in enumerate(obj)}
        else:
            entries = {kind: obj}
        for name, value in entries.items():
            if name in named:
                raise ConfigError(
                    f"two objects are named {name!r} (state= and {kind}=)",
                    hint="give each checkpointed object its own name",
                )
            named[name] = value
    for name, value in named.items():
        if not has_state(value):
            raise ConfigError(
                f"{name!r} ({type(value).__name__}) has no state_dict/load_state_dict",
                hint="pass torch models, optimizers, schedulers, scalers or other objects with "
                "state_dict()/load_state_dict(), or a dict/list of them",
            )
    return named
