"""A Keras 3 training script that knows nothing of spotwise, for ``spotwise run``.

``model.fit`` with Keras' own ``BackupAndRestore`` (weights, optimizer, epoch) at every epoch's
end; nothing handles SIGTERM, so a notice that ``spotwise run`` passes on ends the process at
once (exit 75 from the wrapper all the same), and the next attempt restores the latest backup
and trains the interrupted epoch again. Runs on the JAX backend here (``KERAS_BACKEND``, default
``jax``; ``torch`` works too).

A resumed run ends bit-identical to an uninterrupted one because of two things in this script,
not in Keras: each epoch's batch order is a function of the epoch (``EpochStart``), and so are
the dropout layers' random states, which ``BackupAndRestore`` does not save (they are model
variables that ``save_weights`` leaves out). Keras' own ``shuffle=True`` draws from a global RNG
that a restart does not restore. A backup inside an epoch (``save_freq=N`` steps) would not be
exact either: Keras restores the epoch, not the position inside it, and starts it again.

Keras writes its backup in place, so a notice in the middle of a save leaves a torn
``latest.weights.h5``; ``double_checkpoint=True`` keeps the one before, which Keras restores
when the latest will not open. ``delete_checkpoint=False`` keeps the backup when ``fit`` ends:
a notice after that restores the last epoch instead of training again from the start (and no
kill can land in the middle of deleting it).

    pip install keras jax
    python train.py --backup-dir runs/keras                # alone
    spotwise run -- python train.py --backup-dir runs/keras

The last line is ``final-weights-sha256: <hex>`` over every weight's bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # after KERAS_BACKEND is set: it picks the backend at import
import numpy as np

SEED, BATCH = 0, 32


class Batches(keras.utils.PyDataset):
    """The training set in the order of the current epoch, set by :class:`EpochStart`."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__()
        self.x, self.y = x, y
        self.order = np.arange(len(x))

    def __len__(self) -> int:
        return len(self.x) // BATCH

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        idx = self.order[i * BATCH : (i + 1) * BATCH]
        return self.x[idx], self.y[idx]


class EpochStart(keras.callbacks.Callback):
    """Everything random in an epoch follows from (seed, epoch): a restart at any epoch draws
    what the uninterrupted run drew."""

    def __init__(self, batches: Batches) -> None:
        super().__init__()
        self.batches = batches
        self.first = True

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        if self.first and epoch > 0:  # BackupAndRestore restored the weights and the epoch
            print(f"resumed from the backup at epoch {epoch}", flush=True)
        self.first = False
        self.batches.order = np.random.default_rng([SEED, epoch]).permutation(len(self.batches.x))
        for variable in self.model.variables:  # each Dropout's keras.random.SeedGenerator
            if variable.path.endswith("seed_generator_state"):
                variable.assign(np.array([SEED + 1, epoch], dtype=variable.dtype))


class StepSleep(keras.callbacks.Callback):
    """Slows each step down, so a preemption lands in the middle of training."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backup-dir", required=True, type=Path)
    parser.add_argument("--epochs", type=int, default=6)  # of 32 steps
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32") + (x[:, 3] > 1).astype("int32")

    batches = Batches(x, y)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(
            keras.optimizers.schedules.CosineDecay(3e-3, args.epochs * len(batches))
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    backup = keras.callbacks.BackupAndRestore(
        str(args.backup_dir), save_freq="epoch", double_checkpoint=True, delete_checkpoint=False
    )
    model.fit(
        batches,
        epochs=args.epochs,
        shuffle=False,  # EpochStart shuffles; Keras would shuffle the batches from a global RNG
        verbose=0,
        callbacks=[EpochStart(batches), backup, StepSleep(args.step_sleep)],
    )
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.asarray(weight).tobytes())
    print(f"final-weights-sha256: {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
