"""Hugging Face Accelerate: a :class:`~spotwise.runtime.Run` that follows an ``Accelerator``.

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    run = accelerated_run(accelerator, "runs/exp", model=model, optimizer=opt,
                          scheduler=sched, loader=loader, steps=1000)   # loader NOT prepared
    for x, y in run:
        with accelerator.accumulate(model):
            accelerator.backward(loss_fn(model(x), y))
            opt.step(); sched.step(); opt.zero_grad()

Why the loader stays unprepared: Run rebuilds it around a resumable sampler, and a prepared
loader ends accumulation windows at each epoch's end on its own, which would put Accelerate's
optimizer steps where Run does not count them. Without one, ``accelerator.accumulate`` syncs
every ``gradient_accumulation_steps``-th micro-batch, exactly where Run's step boundaries are,
and a resume (which always starts at a boundary) keeps the two aligned. With several processes
the Accelerator has initialised torch.distributed, so the Run takes its distributed path (the
loader's samples dealt across the ranks, notices agreed, one manifest for every rank's files).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from spotwise.errors import ConfigError
from spotwise.registry import require
from spotwise.runtime.run import Run


def accelerated_run(
    accelerator: Any,
    run_dir: str | os.PathLike[str],
    *,
    state: Mapping[str, Any] | None = None,
    loader: Any = None,
    **options: Any,
) -> Run:
    """A Run with ``accumulate`` taken from the accelerator, its GradScaler and the objects
    given to ``accelerator.register_for_checkpointing`` added to the state; ``options`` are
    Run's keywords (``steps=``, ``checkpoint=``, ``notices=``...)."""
    accelerate = require("accelerate", "accelerate", "the Accelerate integration")
    if not isinstance(accelerator, accelerate.Accelerator):
        raise ConfigError(f"accelerator is a {type(accelerator).__name__}, not an Accelerator")
    if "accumulate" in options:
        raise ConfigError(
            "accumulate= comes from the Accelerator",
            hint="set Accelerator(gradient_accumulation_steps=K) instead",
        )
    if type(loader).__module__.startswith("accelerate."):
        raise ConfigError(
            f"the loader was passed through accelerator.prepare ({type(loader).__name__})",
            hint="pass the DataLoader before prepare(): Run makes it resumable, and a prepared "
            "one ends accumulation windows at epoch ends where Run does not",
        )
    objects = dict(state or {})
    if accelerator.scaler is not None:
        objects.setdefault("accelerate.scaler", accelerator.scaler)
    for i, custom in enumerate(accelerator._custom_objects):  # register_for_checkpointing
        objects.setdefault(f"accelerate.custom.{i}", custom)
    return Run(
        run_dir,
        state=objects,
        loader=loader,
        accumulate=accelerator.gradient_accumulation_steps,
        **options,
    )


__all__ = ["accelerated_run"]
