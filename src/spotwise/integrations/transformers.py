"""Hugging Face Transformers: a callback that gives ``Trainer.train()`` spotwise's exact resume
and notices.

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[SpotwiseCallback("runs/exp", every=50)])
    trainer.train()                  # unchanged; restarting the script resumes exactly

The callback drives one :class:`~spotwise.runtime.Run` (no loader of its own) one optimizer
step per ``on_step_end``. What Run saves: the model, the optimizer, the LR scheduler, the
accelerator's GradScaler, the Trainer's progress (global step, epoch, FLOs, tokens seen), the
train loader's position and Run's RNGs, at the step's end, before anything of the next step
ran (a partly accumulated window is therefore never saved: a kill inside one resumes from its
start).

Callbacks are not handed the Trainer, so the callback finds it once, in ``on_init_end`` (called
from ``Trainer.__init__``), and replaces four of its methods on that instance only:

- ``train``: refuses ``resume_from_checkpoint`` (the Trainer would load its own checkpoint over
  spotwise's);
- ``get_train_dataloader``: the Trainer's loader rebuilt around spotwise's resumable batch
  sampler (a permutation of (seed, epoch), each batch seeded in its worker, workers that ignore
  notice signals); after the Trainer's own mid-epoch resume, workers draw other numbers;
- ``_run_epoch``: after a resume the loop starts at epoch 0; the callback gives it the resumed
  epoch and the micro-batches already trained in it, so its counters (accumulation windows,
  the epoch's shorter last window) are those of the uninterrupted run;
- ``_evaluate``: evaluation leaves the RNGs as it found them, so a run that evaluated after a
  checkpoint and one resumed from it draw the same numbers.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Generator, Iterator, Mapping
from typing import Any, cast

from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from spotwise.errors import ConfigError
from spotwise.integrations._options import callback_run_options
from spotwise.notices.signals import watched_signals
from spotwise.registry import require
from spotwise.runtime.run import Run
from spotwise.runtime.sampler import ResumableBatchSampler, derive_seed, make_resumable
from spotwise.runtime.state import capture_rng, restore_rng
from spotwise.runtime.workers import LoaderWorkers, WorkerInit

_transformers = require("transformers", "transformers", "the Transformers integration")
_Callback: Any = _transformers.TrainerCallback
_Trainer: Any = _transformers.Trainer

# TrainerState fields that are progress (the rest is set from the arguments of this start)
_PROGRESS = ("global_step", "epoch", "total_flos", "num_input_tokens_seen")
_RUN_EPOCH_KEYWORDS = {"epoch", "train_dataloader", "epochs_trained"}
_RUN_EPOCH_KEYWORDS |= {"steps_trained_in_current_epoch", "resume_from_checkpoint"}


class _TrainerProgress:
    """The Trainer's counters as one stateful object of the Run."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        state = self.trainer.state
        return {name: getattr(state, name) for name in _PROGRESS}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        for name in _PROGRESS:
            setattr(self.trainer.state, name, saved[name])
        # the loss average the Trainer logs counts the steps since this start
        self.trainer._globalstep_last_logged = saved["global_step"]
        self.trainer._initial_global_step = saved["global_step"]


class _TrainLoader:
    """The train loader the Trainer iterates: the resumable copy of its own, started and read
    through :class:`~spotwise.runtime.workers.LoaderWorkers` (forked with notice signals
    blocked; a dead worker's error raised only while fetching). Attributes it does not have are
    the inner loader's, which is what the Trainer (and accelerate's ``skip_first_batches``)
    read."""

    def __init__(self, loader: DataLoader, sampler: ResumableBatchSampler) -> None:
        self.loader, self.sampler = loader, sampler
        self.workers = LoaderWorkers(loader)

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def position(self, epoch: int, first: int) -> None:
        """Start the next iterator at micro-batch ``first`` of ``epoch``, with the epoch's
        worker seed (never drawn from the global RNG)."""
        self.sampler.set_position(epoch, first)
        assert self.loader.generator is not None
        self.loader.generator.manual_seed(derive_seed(self.sampler.seed, epoch, "loader"))

    def arm_workers(self) -> None:
        """Workers of a loader the Trainer builds from this one (``skip_first_batches``) share
        its ``worker_init_fn``: make it ignore the notice signals as ours do."""
        init = self.loader.worker_init_fn
        if isinstance(init, WorkerInit):
            init.ignore, init.unblock, init.parent = watched_signals(), (), os.getpid()

    def __iter__(self) -> Iterator[Any]:
        iterator = self.workers.start()
        while True:
            try:
                yield self.workers.next(iterator)
            except StopIteration:
                return


class _LoaderPosition:
    """The train loader's place, derived from the Trainer's global step as the Trainer's own
    resume does (``global_step // update steps per epoch``)."""

    def __init__(self, callback: SpotwiseCallback) -> None:
        self.callback = callback

    def state_dict(self) -> dict[str, Any]:
        loader = self.callback._loader
        assert loader is not None
        return loader.sampler.state_dict(*self.callback._place())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check that the data is the one the checkpoint was written with (a changed dataset or
        batch size is refused) and continue its seed; the position itself follows from the
        global step, and the Trainer's loop starts the epoch at it."""
        loader = self.callback._loader
        assert loader is not None
        live = loader.sampler
        check = ResumableBatchSampler(
            live.size, live.batch_size, shuffle=live.shuffle, drop_last=live.drop_last, seed=0
        )
        check.load_state_dict(state)
        live.seed = check.seed


class SpotwiseCallback(_Callback):
    """Exact resume, background saves and interruption notices for ``Trainer.train()``.

    ``run_dir``, ``every``, ``keep_last`` and any other ``options`` are
    :class:`~spotwise.runtime.Run`'s (``checkpoint=``, ``notices=``...). Pass it in
    ``Trainer(callbacks=[...])``."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        every: int | str | None = "auto",
        keep_last: int = 3,
        **options: Any,
    ) -> None:
        self.run_dir = run_dir
        self.options = callback_run_options(every, keep_last, options)
        self.run: Run | None = None
        self.trainer: Any = None
        self._loader: _TrainLoader | None = None
        self._steps: Generator[Any, None, None] | None = None
        self._first_epoch: int | None = None  # the data epoch of the Trainer loop's epoch 0
        self._gas = 1

    # --- at Trainer(...): find the trainer, refuse what cannot be exact ------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = _calling_trainer()
        _refuse_settings(args)
        run_epoch = getattr(trainer, "_run_epoch", None)
        if (
            run_epoch is None
            or not callable(getattr(trainer, "_evaluate", None))
            or not set(inspect.signature(run_epoch).parameters) >= _RUN_EPOCH_KEYWORDS
        ):
            raise ConfigError(
                f"transformers {_transformers.__version__}: this Trainer's loop has no "
                "_run_epoch(epoch, epochs_trained, steps_trained_in_current_epoch, ...) and "
                "_evaluate(...)",
                hint="use transformers 5.x, whose Trainer SpotwiseCallback was built for",
            )
        self.trainer = trainer
        self._wrap(trainer)

    def _wrap(self, trainer: Any) -> None:
        train, get_loader = trainer.train, trainer.get_train_dataloader
        run_epoch, evaluate = trainer._run_epoch, trainer._evaluate

        def refusing_train(resume_from_checkpoint: Any = None, *args: Any, **kw: Any) -> Any:
            if resume_from_checkpoint not in (None, False):
                raise ConfigError(
                    f"trainer.train(resume_from_checkpoint={resume_from_checkpoint!r}) "
                    "together with SpotwiseCallback",
                    hint="remove resume_from_checkpoint=: the callback restores the newest "
                    f"spotwise checkpoint in {os.fspath(self.run_dir)} itself",
                )
            return train(None, *args, **kw)

        def resumable_loader() -> Any:
            self._loader = self._resumable(get_loader())
            return self._loader

        def positioned_epoch(**kw: Any) -> Any:
            return self._run_epoch(run_epoch, kw)

        def rng_neutral_evaluate(*args: Any, **kw: Any) -> Any:
            saved = capture_rng()
            try:
                return evaluate(*args, **kw)
            finally:
                restore_rng(saved)

        trainer.train = refusing_train
        trainer.get_train_dataloader = resumable_loader
        trainer._run_epoch = positioned_epoch
        trainer._evaluate = rng_neutral_evaluate

    def _resumable(self, prepared: Any) -> _TrainLoader:
        """The Trainer's (accelerate-prepared) train loader as a plain one around a resumable
        sampler, with the same dataset, collator, workers and seeding."""
        inner = getattr(prepared, "batch_sampler", None)
        if isinstance(getattr(prepared, "dataset", None), IterableDataset) or inner is None:
            raise ConfigError(
                "SpotwiseCallback resumes a map-style train_dataset (one with __len__ and "
                "__getitem__); this one is iterable",
                hint="pass a map-style dataset (a datasets.Dataset, not an IterableDataset)",
            )
        args = self.trainer.args
        plain = DataLoader(
            prepared.dataset,
            batch_size=inner.batch_size,
            shuffle=isinstance(getattr(inner, "sampler", None), RandomSampler),
            drop_last=inner.drop_last,
            num_workers=prepared.num_workers,
            collate_fn=prepared.collate_fn,
            pin_memory=prepared.pin_memory,
            timeout=prepared.timeout,
            worker_init_fn=prepared.worker_init_fn,
            multiprocessing_context=prepared.multiprocessing_context,
            prefetch_factor=prepared.prefetch_factor if prepared.num_workers else None,
            persistent_workers=prepared.persistent_workers,
        )
        seed = args.data_seed if args.data_seed is not None else args.seed
        loader, sampler = make_resumable(plain, derive_seed(seed, "trainer-data"))
        return _TrainLoader(loader, sampler)

    # --- train begins: resume ------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        trainer = self.trainer
        if trainer is None or self._loader is None:
            raise ConfigError(
                "SpotwiseCallback was added after the Trainer was built",
                hint="pass it as Trainer(..., callbacks=[SpotwiseCallback(...)]): the train "
                "loader is made resumable when the Trainer builds it",
            )
        self._gas = args.gradient_accumulation_steps
        objects: dict[str, Any] = {
            "model": trainer.model,
            "optimizer": trainer.optimizer,
            "scheduler": trainer.lr_scheduler,
            "trainer": _TrainerProgress(trainer),
            "loader": _LoaderPosition(self),
        }
        if trainer.accelerator.scaler is not None:
            objects["scaler"] = trainer.accelerator.scaler
        self.run = Run(
            self.run_dir,
            state=objects,
            steps=state.max_steps,
            seed=self._loader.sampler.seed,
            **self.options,
        )
        assert self.run.step == state.global_step  # both restored from the same checkpoint
        self._first_epoch = self._place()[0]
        self._steps = cast(Generator[Any, None, None], iter(self.run))  # Run.__iter__ is one
        try:
            next(self._steps)  # at the resumed step; nothing is saved until the next boundary
        except StopIteration:  # resumed from the final checkpoint: nothing left to train
            self._steps = None
            control.should_training_stop = True
        return control

    def _place(self) -> tuple[int, int]:
        """(epoch, micro-batch) where the step after the Trainer's global step starts."""
        assert self._loader is not None
        per_epoch = max(-(-len(self._loader) // self._gas), 1)
        epoch, update = divmod(self.trainer.state.global_step, per_epoch)
        return epoch, update * self._gas

    def _run_epoch(self, run_epoch: Any, kw: dict[str, Any]) -> Any:
        """One epoch of the Trainer's loop, at the data epoch it stands for; the first one after
        a resume through the Trainer's own mid-epoch path, which counts the micro-batches
        already trained (the loader skips them as index lists, without loading them)."""
        loader = self._loader
        if self._steps is None or self._first_epoch is None or loader is None:
            return None  # the run is complete
        epoch = self._first_epoch + kw["epoch"]
        start = self._place()[1] if kw["epoch"] == 0 else 0
        loader.position(epoch, 0)
        kw.update(epoch=epoch, epochs_trained=epoch, steps_trained_in_current_epoch=start)
        # only a real mid-epoch start takes the Trainer's resume path; its RNG file is not in
        # the run directory, so the Trainer restores nothing: Run restored the RNGs
        kw["resume_from_checkpoint"] = os.fspath(self.run_dir) if start else None
        if start:
            loader.arm_workers()
        return run_epoch(**kw)

    # --- each optimizer step: Run's boundary (saves, failed background saves, notices) ---------
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._steps is None:
            return
        try:
            next(self._steps)
        except StopIteration:  # the final checkpoint is committed and the run closed
            self._steps = None
        except BaseException:  # exit 75 after a notice, or a failed save: workers go too
            self._steps = None
            self._close_loader()
            raise

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._steps is not None:  # training ended before max steps
            self._steps.close()
            self._steps = None
        if self.run is not None:
            self.run.close()
        self._close_loader()

    def _close_loader(self) -> None:
        if self._loader is not None:
            self._loader.workers.close()


def _calling_trainer() -> Any:
    """The ``Trainer`` whose ``__init__`` is running ``on_init_end`` (callbacks are not handed
    it)."""
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, _Trainer):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    raise ConfigError(
        "SpotwiseCallback.on_init_end was not called by a transformers Trainer",
        hint="pass it as Trainer(..., callbacks=[SpotwiseCallback(...)])",
    )


def _refuse_settings(args: Any) -> None:
    """TrainingArguments under which no resume can repeat the uninterrupted run."""
    refused = {
        "enable_jit_checkpoint": (
            True,
            "its SIGTERM handler saves the Trainer's own checkpoint; spotwise handles SIGTERM "
            "and cloud notices itself",
        ),
        "ignore_data_skip": (True, "a resumed epoch would start again at its first batch"),
        "auto_find_batch_size": (True, "a retry changes the batch size and the data order"),
    }
    for name, (value, why) in refused.items():
        if getattr(args, name, None) == value:
            raise ConfigError(
                f"TrainingArguments({name}={value!r}) with SpotwiseCallback: {why}",
                hint=f"remove {name}=",
            )
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy not in ("random", "sequential"):
        raise ConfigError(
            f"TrainingArguments(train_sampling_strategy={strategy!r}) with SpotwiseCallback: "
            "its sampler cannot be resumed in the middle of an epoch",
            hint="use train_sampling_strategy='random' (the default)",
        )
    if args.world_size > 1:
        raise ConfigError(
            f"the Trainer runs {args.world_size} processes; SpotwiseCallback resumes one",
            hint="launch a single process (multi-process training is not handled yet)",
        )


__all__ = ["SpotwiseCallback"]
