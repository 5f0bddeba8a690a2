#!/usr/bin/env python
"""Batch predictions of a digits MLP over the digits data repeated to >= 100,000 items, with
spotwise.batch: fixed shards, one safetensors file per shard, exactly once across kills.

Kill it at any moment (SIGKILL, SIGTERM, a spot interruption) and run the same command again:
it skips the committed shards and ends with output files byte-identical to an uninterrupted
run's. The last line it prints is

    outputs-sha256: <hex>

(SHA-256 over the output files' bytes in shard order). The model is trained in-process first,
full-batch and seeded (about a second, the same weights every time), so the example needs no
other step; the output location records its fingerprint and refuses outputs of other weights.

    python examples/digits/infer.py --out runs/preds --shard-size 2000 --workers 3

``--workers N`` runs N worker processes here that split the shards through the lease board
(SQLite in the output directory). Under ``spotwise infer`` every job is one worker
(``--workers 1 --worker NAME``) and the workers may be on different machines (``--out s3://``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset
from train import load_digits

from spotwise.batch import outputs_sha256, read_plan, run_batch
from spotwise.storage import open_storage


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory or s3://bucket/prefix")
    parser.add_argument("--shard-size", type=int, default=2000, help="items per output file")
    parser.add_argument("--workers", type=int, default=1, help="worker processes to run here")
    parser.add_argument("--worker", default=None, help="this worker's name (default host:pid)")
    parser.add_argument("--items", type=int, default=100_000, help="at least this many items")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--lease-ttl", type=float, default=30.0, help="lease seconds")
    parser.add_argument("--leases", default=None, help="lease board URI (default: next to --out)")
    parser.add_argument("--events", default=None, help="append JSON events to this file")
    parser.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--item-sleep",
        type=float,
        default=0.0,
        help="seconds to sleep per batch, so interruption tests can act",
    )
    return parser.parse_args(argv)


class Repeated(Dataset):
    """The digits images repeated until there are at least ``items`` of them."""

    def __init__(self, x: torch.Tensor, items: int) -> None:
        self.x = x
        self.n = len(x) * -(-items // len(x))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i % len(self.x)]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        """A whole batch in one indexing operation (the DataLoader uses it when present)."""
        return self.x[torch.tensor(indices) % len(self.x)]


def trained_model() -> tuple[nn.Module, torch.Tensor]:
    """A digits MLP trained full-batch for 150 seeded steps: the same weights on every run."""
    torch.manual_seed(0)
    x, y = load_digits()
    inputs = torch.tensor(x / 16.0, dtype=torch.float32)
    labels = torch.tensor(y)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        loss = nn.functional.cross_entropy(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), inputs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # tiny model: threads cost more than they give, and stay repeatable
    if args.workers > 1:  # run N copies of this script as workers, then report
        child = list(argv if argv is not None else sys.argv[1:])
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    *child,
                    "--workers",
                    "1",
                    "--worker",
                    f"local-{i}",
                    "--no-report",
                ]
            )
            for i in range(args.workers)
        ]
        codes = [p.wait() for p in procs]
        bad = [c for c in codes if c != 0]
        if bad:
            return 75 if all(c == 75 for c in bad) else bad[0]
    else:
        model, inputs = trained_model()
        dataset = Repeated(inputs, args.items)

        def predict(batch: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = model(batch)
            if args.item_sleep > 0:
                import time

                time.sleep(args.item_sleep)
            return {"logits": logits, "label": logits.argmax(1)}

        result = run_batch(
            dataset,
            predict,
            args.out,
            model=model,
            shard_size=args.shard_size,
            batch_size=args.batch_size,
            leases=args.leases,
            name=args.worker,
            lease_ttl_s=args.lease_ttl,
            events=args.events,
            collate_fn=_as_batch,
        )
        print(
            f"worker {args.worker or os.getpid()}: {len(result.computed)} shard(s) computed, "
            f"{result.items_computed} items at {result.items_per_s:.0f} items/s",
            flush=True,
        )
        if args.no_report:
            return 0
    storage = open_storage(args.out)
    plan = read_plan(storage)
    assert plan is not None
    labels = np.concatenate(
        [  # a human check: the predictions are of a trained model
            _labels(storage.get(plan.shard_key(s))) for s in range(min(plan.shards, 1))
        ]
    )
    print(
        f"items: {plan.items} in {plan.shards} shards; first shard predicts "
        f"{np.bincount(labels, minlength=10).tolist()} per class",
        flush=True,
    )
    print(f"outputs-sha256: {outputs_sha256(storage, plan)}", flush=True)
    return 0


def _as_batch(batch: torch.Tensor) -> torch.Tensor:
    return batch  # __getitems__ already returns the stacked batch


def _labels(raw: bytes) -> np.ndarray:
    from safetensors.torch import load

    return load(raw)["label"].numpy()


if __name__ == "__main__":
    sys.exit(main())
