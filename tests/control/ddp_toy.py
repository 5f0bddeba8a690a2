"""A tiny torch.distributed "training" for the multi-node tests (real gloo, real torchrun).

``python ddp_toy.py STEPS STEP_S [crash]``: counts steps, keeping the count in
``$SPOTWISE_CHECKPOINT_DIR/step.json`` (rank 0 writes it). A SIGTERM on any rank makes all ranks
agree at the next step (one all-reduce per step, as the runtime does), save and exit 75.
``crash-once``: rank 1 exits 3 at step 2 of the first run. Runs alone (no torchrun
environment) at world size 1.
"""

import signal

noticed = []  # first of all: a notice during start-up must not kill the rank unsaved
signal.signal(signal.SIGTERM, lambda *_: noticed.append(1))

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

steps, step_s = int(sys.argv[1]), float(sys.argv[2])
world = int(os.environ.get("WORLD_SIZE", "1"))
if world > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if world > 1 else 0
ckpt = os.environ.get("SPOTWISE_CHECKPOINT_DIR", ".")
os.makedirs(ckpt, exist_ok=True)
path = os.path.join(ckpt, "step.json")
step = 0
if os.path.exists(path):
    with open(path) as f:
        step = json.load(f)["step"]
crashed_before = os.path.join(ckpt, "crashed")
crash = sys.argv[3:] == ["crash-once"] and not os.path.exists(crashed_before)
print(f"rank {rank}/{world} starts at step {step}", flush=True)


def agree(flag: bool) -> bool:
    if world == 1:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t)
    return bool(t.item())


def leave(code: int) -> None:
    """Exit with ``code`` after tearing the process group down: left to the interpreter's exit,
    gloo's destructor may abort (SIGABRT, "terminate called without an active exception") once
    the peer has gone, and the rank would read as a crash."""
    if world > 1:
        dist.destroy_process_group()
    sys.exit(code)


def save() -> None:
    if rank == 0:
        with open(path + ".tmp", "w") as f:
            json.dump({"step": step, "world": world}, f)
        os.replace(path + ".tmp", path)
    if world > 1:
        dist.barrier()


while step < steps:
    if agree(bool(noticed)):
        save()
        print(f"rank {rank}/{world} saved at step {step}", flush=True)
        leave(75)
    if crash and rank == 1 and step == 2:
        print("rank 1 crashes", flush=True)
        open(crashed_before, "w").close()
        os._exit(3)
    time.sleep(step_s)
    step += 1
save()
print(f"rank {rank}/{world} done at step {step}", flush=True)
leave(0)
