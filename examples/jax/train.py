"""A JAX/Flax training script that knows nothing of spotwise, for ``spotwise run``.

It checkpoints with Orbax (parameters, optimizer state, step) and stops at a step boundary on
SIGTERM, which is how ``spotwise run -- python train.py`` passes on a spot notice. Every
random draw is a function of the step (``jax.random.fold_in``), so a resumed run needs no
loader or RNG state beyond the step.

    pip install jax flax orbax-checkpoint
    python train.py --ckpt-dir runs/jax --steps 200          # alone
    spotwise run -- python train.py --ckpt-dir runs/jax      # as a job's training process

The last line is ``final-weights-sha256: <hex>`` over every parameter's bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import time
from pathlib import Path

# Installed before the slow imports, so a notice during them is acted on at the first step
# boundary instead of ending the process; stop only at a step boundary.
stop: list[bool] = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from flax import linen as nn  # noqa: E402


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        x = nn.relu(nn.Dense(64)(x))
        x = nn.Dropout(0.2, deterministic=not train)(x)
        return nn.Dense(3)(x)


def save_now(manager: ocp.CheckpointManager, step: int, state: dict) -> None:
    """Save ``step`` unless the periodic save already did, and wait until it is committed."""
    if manager.latest_step() != step:
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
    manager.wait_until_finished()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True, type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()

    key = jax.random.PRNGKey(0)
    data_key, init_key, dropout_key = jax.random.split(key, 3)
    x = jax.random.normal(data_key, (1024, 16))
    y = (x[:, :3].sum(axis=1) > 0).astype(jnp.int32) + (x[:, 3] > 1).astype(jnp.int32)

    model = MLP()
    params = model.init(init_key, x[:1], train=False)["params"]
    tx = optax.adamw(optax.cosine_decay_schedule(3e-3, args.steps))
    state = {"params": params, "opt_state": tx.init(params), "step": jnp.array(0)}

    manager = ocp.CheckpointManager(
        args.ckpt_dir.resolve(), options=ocp.CheckpointManagerOptions(max_to_keep=2)
    )
    if manager.latest_step() is not None:
        state = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(state))
        print(f"resumed from step {int(state['step'])}", flush=True)

    @jax.jit
    def train_step(state: dict, step: jax.Array) -> tuple[dict, jax.Array]:
        order = jax.random.permutation(jax.random.fold_in(data_key, step // 32), 1024)
        idx = jax.lax.dynamic_slice(order, ((step % 32) * 32,), (32,))

        def loss_fn(p: dict) -> jax.Array:
            rngs = {"dropout": jax.random.fold_in(dropout_key, step)}
            logits = model.apply({"params": p}, x[idx], train=True, rngs=rngs)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y[idx]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "step": step + 1}, loss

    step = int(state["step"])
    while step < args.steps:
        if stop:
            save_now(manager, step, state)
            print(f"saved at step {step} on the notice", flush=True)
            return  # exit 0: spotwise run reports 75 because a notice came
        state, _ = train_step(state, jnp.array(step))
        step += 1
        if step % args.save_every == 0:
            manager.save(step, args=ocp.args.StandardSave(state))  # in the background
        time.sleep(args.step_sleep)
    save_now(manager, step, state)
    # (of the final weights on all the data: defined too when a relaunch resumed at the end)
    logits = model.apply({"params": state["params"]}, x, train=False)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(state["params"]):
        digest.update(np.asarray(leaf).tobytes())
    print(f"loss: {float(loss):.6f}")
    print(f"final-weights-sha256: {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
