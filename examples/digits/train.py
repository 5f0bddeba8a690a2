#!/usr/bin/env python
"""Train a small MLP on scikit-learn's bundled digits data with spotwise.Run (no download).

Kill it at any moment (SIGKILL, SIGTERM, a spot interruption) and run the same command again: it
resumes from the newest valid checkpoint and ends with exactly the same weights as a run that
was never interrupted. The last line it prints is

    final-weights-sha256: <hex>

(SHA-256 over the model's state_dict tensors' raw bytes in sorted key order). Run on a finished
run directory, it prints the same line and exits 0 without training. Exit code 75 means it was
interrupted by a notice, saved its state, and wants to be restarted.

    python examples/digits/train.py --run-dir runs/digits --steps 300 --save-every 50

Options: --workers K (DataLoader worker processes), --step-sleep S (sleep inside each step, so
interruption tests have time to act), --trace FILE (append one JSON line per step: epoch, a digest
of the batch and the exact loss, to compare runs step by step).

Under torchrun it trains on the CPU with DistributedDataParallel over gloo, or with FSDP2
(``fully_shard``) given --fsdp; rank 0 prints the hash of the full, unsharded weights:

    torchrun --standalone --nproc-per-node 2 examples/digits/train.py --run-dir runs/ddp

Without a shared file system (each node its own disk), give an object store as the run dir:
each rank stages in its own --local-dir and uploads its own files.

    torchrun --standalone --nproc-per-node 2 examples/digits/train.py \
        --run-dir s3://bucket/ddp --local-dir /tmp/spotwise-node{rank}
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from spotwise import CheckpointConfig, Run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="checkpoint directory (resumed if any)")
    parser.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    parser.add_argument("--save-every", default="50", help="steps between saves, or 'auto'")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", default=None, help="append per-step JSON lines to this file")
    parser.add_argument("--fsdp", action="store_true", help="under torchrun: FSDP2, not DDP")
    parser.add_argument("--hidden", type=int, default=128, help="width of the hidden layer")
    parser.add_argument(
        "--local-dir",
        default=None,
        help="local staging directory of an s3:// run dir; {rank} becomes the torchrun rank",
    )
    return parser.parse_args(argv)


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits (1,797 8x8 images), read straight from the CSV that
    scikit-learn ships, which saves importing scikit-learn itself (seconds per restart)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("this example needs scikit-learn: pip install 'spotwise[examples]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets/data/digits.csv.gz"
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for _, tensor in sorted(state.items()):
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def start_distributed(model: nn.Module, fsdp: bool) -> nn.Module:
    """Join the torchrun job (its environment names the rank, world size and rendezvous) and
    wrap the model: DDP replicates it, FSDP2 shards its parameters over the ranks. The model
    stays on the CPU, so the backend is gloo (a GPU script would pass "nccl")."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        return fully_shard(model)
    return nn.parallel.DistributedDataParallel(model)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole model's weights, unsharded, on rank 0 (None on the other ranks)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return state if dist.get_rank() == 0 else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # tiny model: threads cost more than they give, and stay repeatable

    x, y = load_digits()
    order = np.random.RandomState(0).permutation(len(x))  # fixed 80/20 train/test split
    test, train_idx = order[: len(x) // 5], order[len(x) // 5 :]
    x_train, y_train, x_test, y_test = x[train_idx], y[train_idx], x[test], y[test]
    train = TensorDataset(torch.tensor(x_train / 16.0, dtype=torch.float32), torch.tensor(y_train))
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model: nn.Module = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(args.hidden, 10)
    )
    if "LOCAL_RANK" in os.environ:  # started by torchrun
        model = start_distributed(model, args.fsdp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.7)
    every: int | str = "auto" if args.save_every == "auto" else int(args.save_every)
    local_dir = None
    if args.local_dir is not None:  # one staging directory per rank
        local_dir = args.local_dir.format(rank=os.environ.get("RANK", "0"))

    run = Run(
        args.run_dir,
        state={"model": model, "optimizer": optimizer, "scheduler": scheduler},
        loader=loader,
        steps=args.steps,
        checkpoint=CheckpointConfig(every=every, local_dir=local_dir),
    )
    if run.resumed_from is not None:
        print(f"resumed from step {run.step}", flush=True)
    trace = os.open(args.trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT) if args.trace else None
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for inputs, labels in run:
        loss = loss_fn(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        run.log(loss=loss.item())  # for the dashboard's loss chart and /metrics
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
        step = run.step + 1  # this step, once the loop body is done
        if trace is not None:
            batch = hashlib.sha1(inputs.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()
            record = {"step": step, "epoch": run.epoch, "batch": batch[:16]}
            record["loss"] = loss.item().hex()
            os.write(trace, (json.dumps(record) + "\n").encode())
        if step % 50 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} epoch {run.epoch} loss {loss.item():.4f}", flush=True)

    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor(x_test / 16.0, dtype=torch.float32))
        accuracy = (logits.argmax(1) == torch.tensor(y_test)).float().mean().item()
    weights = full_weights(model)
    if weights is not None:
        print(f"test-accuracy: {accuracy:.4f}", flush=True)
        print(f"final-weights-sha256: {weights_sha256(weights)}", flush=True)
    if "LOCAL_RANK" in os.environ:  # once no rank needs the group any more
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
