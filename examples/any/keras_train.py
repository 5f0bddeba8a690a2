"""A Keras 3 training script that knows nothing of spotwise, for ``spotwise run``.

``model.fit`` with Keras' own ``BackupAndRestore`` (weights, optimizer, epoch and step, every
``--save-every`` steps); nothing handles SIGTERM, so a notice that ``spotwise run`` passes on ends
the process at once (exit 75 from the wrapper all the same), and the next attempt restores the
latest backup. Runs on the JAX backend here (``KERAS_BACKEND``, default ``jax``).

    pip install keras jax
    python keras_train.py --backup-dir runs/keras                # alone
    spotwise run -- python keras_train.py --backup-dir runs/keras

The last line is ``final-weights-sha256: <hex>`` over every weight's bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # after KERAS_BACKEND is set: it picks the backend at import
import numpy as np


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
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 16)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32") + (x[:, 3] > 1).astype("int32")

    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    backup = keras.callbacks.BackupAndRestore(str(args.backup_dir), save_freq=args.save_every)
    metadata = args.backup_dir / "training_metadata.json"
    if metadata.exists():  # what BackupAndRestore restores: the weights and the epoch
        saved = json.loads(metadata.read_text())
        print(
            f"resumed from the backup at epoch {saved['epoch']}, batch {saved['batch']} "
            f"(Keras starts epoch {saved['epoch']} again)",
            flush=True,
        )
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=args.epochs,
        shuffle=True,
        verbose=0,
        callbacks=[backup, StepSleep(args.step_sleep)],
    )
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.asarray(weight).tobytes())
    print(f"final-weights-sha256: {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
