"""PyTorch Lightning: a callback that gives ``trainer.fit`` spotwise's exact resume and notices.

    trainer = Trainer(max_steps=1000, callbacks=[SpotwiseCallback("runs/exp", every=50)])
    trainer.fit(model, datamodule)          # unchanged; restarting it resumes exactly

The callback drives one :class:`~spotwise.runtime.Run` (no loader of its own) one optimizer
step per training batch. What Run saves is Lightning's own checkpoint document (model,
optimizers, schedulers, precision plugin, loops' progress, callbacks, datamodule), captured with
``dump_checkpoint`` and handed back to Lightning's checkpoint connector before it restores, plus
the position of the train loader, which the callback replaces by one around spotwise's
resumable batch sampler (Lightning replays a plain loader from its start after a mid-epoch
resume), and Run's RNGs. Its workers are forked as Run forks its own
(:mod:`spotwise.runtime.workers`): a SIGTERM to the whole process group reaches only the
training process, which saves and exits 75.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Generator, Mapping
from typing import Any, cast

from torch.utils.data import DataLoader

from spotwise.errors import ConfigError
from spotwise.integrations._options import callback_run_options
from spotwise.notices.signals import SignalDetector
from spotwise.registry import require
from spotwise.runtime.run import Run
from spotwise.runtime.sampler import ResumableBatchSampler, derive_seed, make_resumable
from spotwise.runtime.workers import LoaderWorkers

_lightning = require("lightning", "lightning", "the Lightning integration")
_Callback: Any = _lightning.Callback
_DataLoaderSource: Any = require(
    "lightning.pytorch.trainer.connectors.data_connector", "lightning", "the Lightning integration"
)._DataLoaderSource


class _TrainerState:
    """Lightning's checkpoint document as one stateful object of the Run. Loading hands it to
    the trainer's checkpoint connector, which restores it with Lightning's own code."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return dict(self.trainer._checkpoint_connector.dump_checkpoint(weights_only=False))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.trainer._checkpoint_connector._loaded_checkpoint = dict(state)


class _LoaderPosition:
    """The train loader's place: the resumable sampler's state at the next batch to train. The
    sampler exists only once Lightning has built the loader, after the Run has resumed, so a
    loaded state waits here until then."""

    def __init__(self) -> None:
        self.sampler: ResumableBatchSampler | None = None
        self.epoch = 0
        self.next_batch = 0
        self.loaded: Mapping[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        if self.sampler is None:
            return {}
        return self.sampler.state_dict(self.epoch, self.next_batch)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loaded = dict(state) if state else None


class _ResumableSource(_DataLoaderSource):
    """The fit loop's train-loader source, answering with the callback's resumable loader."""

    def __init__(self, source: Any, callback: SpotwiseCallback) -> None:
        super().__init__(source.instance, source.name)
        self.callback = callback

    def dataloader(self) -> Any:
        return self.callback._resumable(super().dataloader())


class SpotwiseCallback(_Callback):
    """Exact resume, background saves and interruption notices for ``Trainer.fit``.

    ``run_dir``, ``every``, ``keep_last`` and any other ``options`` are
    :class:`~spotwise.runtime.Run`'s (``checkpoint=``, ``notices=``...)."""

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
        self._steps: Generator[Any, None, None] | None = None
        self._position = _LoaderPosition()
        self._loader: Any = None
        self._shard = (0, 1)  # (rank, world size): under DDP each rank trains its share

    # --- before training: refuse what cannot be exact, resume ------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.world_size > 1:
            _check_strategy(trainer.strategy)
            self._shard = (trainer.global_rank, trainer.world_size)
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) with "
                "SpotwiseCallback: Lightning ends accumulation windows at epoch ends, where "
                "spotwise does not count optimizer steps",
                hint="remove accumulate_grad_batches= (or use spotwise.Run(accumulate=K))",
            )
        self.run = Run(
            self.run_dir,
            state={"lightning": _TrainerState(trainer), "loader": self._position},
            **self.options,
        )
        trainer.fit_loop._data_source = _ResumableSource(trainer.fit_loop._data_source, self)
        if trainer.world_size > 1:
            self._keep_sampler(trainer)

    def _keep_sampler(self, trainer: Any) -> None:
        """Under DDP Lightning would put a ``DistributedSampler`` into every loader; the train
        loader's resumable sampler deals each step's samples across the ranks itself (as
        ``Run`` does under torchrun), so that one loader is left as it is. Validation and test
        loaders get Lightning's sampler as before."""
        connector = trainer._data_connector
        requires = connector._requires_distributed_sampler
        connector._requires_distributed_sampler = lambda loader: (
            loader is not self._loader and requires(loader)
        )

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Refuse ``fit(ckpt_path=...)``: Lightning has just loaded that file over the spotwise
        checkpoint (it learns the path only after ``setup``); raising here stops before its
        loops and optimizers take over from it."""
        if trainer.ckpt_path is not None:
            raise ConfigError(
                f"trainer.fit(ckpt_path={trainer.ckpt_path!r}) together with SpotwiseCallback",
                hint="remove ckpt_path= from fit(): the callback restores the newest spotwise "
                f"checkpoint in {os.fspath(self.run_dir)} itself",
            )

    def _resumable(self, loader: Any) -> Any:
        """The train loader rebuilt around a resumable sampler at the run's position, with its
        worker seed set; Lightning asks for the loader (and iterates it once) before any
        training hook runs."""
        run = self.run
        assert run is not None
        if not isinstance(loader, DataLoader):
            raise ConfigError(
                f"SpotwiseCallback resumes one train DataLoader, got a {type(loader).__name__}",
                hint="return a single torch DataLoader from train_dataloader()",
            )
        rank, world = self._shard
        resumable, sampler = make_resumable(loader, run.seed, rank=rank, world=world)
        # Lightning iterates it: its workers must still ignore a notice sent to the whole
        # process group (a container stop), or they die and fail the step or the save
        LoaderWorkers(resumable).protect_iterators()
        self._loader, self._position.sampler = resumable, sampler
        if self._position.loaded is not None:
            sampler.load_state_dict(self._position.loaded)
            epoch, position = sampler.epoch, sampler.position
            if position >= len(sampler):  # saved after an epoch's last batch
                epoch, position = epoch + 1, 0
            self._position.epoch, self._position.next_batch = epoch, position
        sampler.set_position(self._position.epoch, self._position.next_batch)
        self._seed_workers()
        return resumable

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Set the Run's length from the Trainer's and take it to the resumed step."""
        run, sampler = self.run, self._position.sampler
        assert run is not None and sampler is not None
        if trainer.limit_train_batches not in (1.0, None):
            raise ConfigError(
                f"Trainer(limit_train_batches={trainer.limit_train_batches}) with "
                "SpotwiseCallback: a resumed epoch would not end where it did",
                hint="remove limit_train_batches=",
            )
        if trainer.max_steps > 0:
            run.total_steps = trainer.max_steps
        elif trainer.max_epochs is not None and trainer.max_epochs > 0:
            run.total_steps = trainer.max_epochs * len(sampler)
        else:
            raise ConfigError(
                "the Trainer has no end (max_steps and max_epochs unset)",
                hint="set Trainer(max_steps=N) or Trainer(max_epochs=N)",
            )
        self._own_sigterm(trainer)
        self._steps = cast(Generator[Any, None, None], iter(run))  # Run.__iter__ is one
        try:
            next(self._steps)  # at the resumed step; nothing is saved until the next boundary
        except StopIteration:  # resumed from the final checkpoint: nothing left to train
            self._steps = None

    @staticmethod
    def _own_sigterm(trainer: Any) -> None:
        """Give SIGTERM back to spotwise's notice watcher. Lightning's handler (installed over
        it) makes the loop raise ``SIGTERMException`` after the batch hooks, which ends the
        process with exit 0 and without saving the step that just completed; the watcher's
        notice is acted on at the next step boundary: save, then exit 75."""
        originals = trainer._signal_connector._original_handlers
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.SIGTERM in originals:
            signal.signal(signal.SIGTERM, originals.pop(signal.SIGTERM))
        # Lightning's teardown puts back every handler it saw at the start of the fit; for the
        # signals the watcher holds (SIGTERM, SIGINT, SLURM's) that would re-install the closed
        # watcher's handler after the Run restored the ones from before the fit, leaving Ctrl-C
        # dead. Popped, they are the Run's to restore.
        for signum in [
            n
            for n, h in originals.items()
            if isinstance(getattr(h, "__self__", None), SignalDetector)
        ]:
            originals.pop(signum)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """A new epoch: its permutation and worker seeds follow from (seed, epoch), never from
        the global RNG. (The loader was positioned already for the first epoch of a run.)"""
        assert self._position.sampler is not None
        if trainer.current_epoch == self._position.epoch:
            return
        self._position.epoch, self._position.next_batch = trainer.current_epoch, 0
        self._position.sampler.set_position(trainer.current_epoch, 0)
        self._seed_workers()

    def _seed_workers(self) -> None:
        assert self._position.sampler is not None and self._loader is not None
        seed = derive_seed(self._position.sampler.seed, self._position.epoch, "loader")
        self._loader.generator.manual_seed(seed)

    # --- each step: Run's boundary (saves, failed background saves, notices) ---------------------
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._position.next_batch = batch_idx + 1
        assert self._steps is not None
        try:
            next(self._steps)
        except StopIteration:  # the final checkpoint is committed and the run closed
            self._steps = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Training failed (or a notice ends it with exit 75): stop the Run without saving a
        half-finished step, keeping the committed checkpoints."""
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        if self.run is not None:
            self.run.__exit__(type(exception), exception, None)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._steps is not None:  # fit ended before max steps (e.g. early stopping)
            self._steps.close()
            self._steps = None
        if self.run is not None:
            self.run.close()


def _check_strategy(strategy: Any) -> None:
    """Several processes resume exactly under DDP started by Lightning's own launcher or by
    torchrun: every rank holds the whole model and optimizer, so rank 0's checkpoint document
    is every rank's. Sharded strategies (FSDP, DeepSpeed) and spawned processes are refused."""
    ddp = require("lightning.pytorch.strategies", "lightning", "the Lightning integration")
    if type(strategy) is not ddp.DDPStrategy or strategy._start_method != "popen":
        name = type(strategy).__name__
        method = getattr(strategy, "_start_method", None)
        raise ConfigError(
            f"SpotwiseCallback with {name}"
            + (f"(start_method={method!r})" if method not in (None, "popen") else "")
            + ": several processes resume exactly under strategy='ddp' only",
            hint="use Trainer(strategy='ddp', devices=N) (started by Lightning or by torchrun)",
        )


__all__ = ["SpotwiseCallback"]
