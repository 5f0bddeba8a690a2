"""The Lightning callback with the real ``lightning`` package on CPU and real processes: a
``LightningDataModule`` with two loader workers, bf16-mixed precision, dropout, AdamW and a
per-step LR schedule. Killed with SIGKILL to the main PID, SIGKILL to the process group and
SIGTERM (exit 75 after a committed checkpoint), restarted each time, it ends with the
uninterrupted run's weights and the same loss at every step; Lightning's own resume
(``ModelCheckpoint`` + ``ckpt_path="last"``) on the same script does not."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .test_resume_shapes import EXIT_INTERRUPTED, PATTERNS, final_hash, lines, strike

CHILD = Path(__file__).with_name("_lightning_child.py")
WORKERS = 2

pytestmark = pytest.mark.e2e


def launch(
    run_dir: Path, trace: Path, mode: str, data: str = "datamodule", workers: int = WORKERS
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(run_dir), str(trace), mode, str(workers), data],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SPOTWISE_PLATFORM="none"),
        start_new_session=True,
    )


def finish(child: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, err[-3000:]
    return out


def per_step(records: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[float, float]]:
    """(loss, batch sum) per (rank, global step); a replayed step must equal its first run."""
    seen: dict[tuple[int, int], tuple[float, float]] = {}
    for r in records:
        key, value = (r["rank"], r["step"]), (r["loss"], r["x"])
        assert seen.setdefault(key, value) == value, f"rank, step {key} differ on replay"
    return seen


def interrupted(
    tmp_path: Path, mode: str, at: tuple[int, ...], patterns: tuple[str, ...] = PATTERNS
) -> tuple[str, list[dict]]:
    """Kill a run of ``mode`` once per pattern, when its trace reaches the next of ``at``
    lines, restarting it each time; then let it finish."""
    run_dir, trace = tmp_path / mode, tmp_path / f"{mode}.jsonl"
    for pattern, target in zip(patterns, at, strict=True):
        child = launch(run_dir, trace, mode)
        while len(lines(trace)) < target:
            assert child.poll() is None, f"{mode} ended before {pattern}: {child.stderr.read()}"  # type: ignore[union-attr]
            time.sleep(0.005)
        out, err = strike(child, pattern)
        if mode == "spotwise" and pattern == "SIGTERM main":
            assert child.returncode == EXIT_INTERRUPTED, err[-3000:]
            assert f"exiting with code {EXIT_INTERRUPTED}" in err
        elif "KILL" in pattern:
            assert child.returncode == -signal.SIGKILL, err[-3000:]
    out = finish(launch(run_dir, trace, mode))
    assert "resumed-from: " in out
    return final_hash(out), lines(trace)


# trace lines at which to strike: mid-epoch (5 batches an epoch), then right after a
# checkpoint at an epoch's end (step 10), then mid-epoch again
STRIKES = (4, 9, 13)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """The uninterrupted run's final hash and (loss, batch sum) per step."""
    tmp = tmp_path_factory.mktemp("reference")
    out = finish(launch(tmp / "ref", tmp / "ref.jsonl", "spotwise"))
    return final_hash(out), per_step(lines(tmp / "ref.jsonl"))


def test_killed_fit_ends_like_the_uninterrupted_one(
    tmp_path: Path, reference: tuple[str, dict]
) -> None:
    digest, records = interrupted(tmp_path, "spotwise", STRIKES)
    assert per_step(records) == reference[1]
    assert digest == reference[0]
    assert len(records) > len(reference[1])  # the kills really replayed steps


@pytest.mark.parametrize("data", ["datamodule", "loaders"])
def test_a_group_sigterm_saves_despite_the_loader_workers(
    tmp_path: Path, reference: tuple[str, dict], data: str
) -> None:
    """SIGTERM to the whole process group (a container stop, SLURM signalling every process):
    the loader's two workers get it too, and must leave the notice to the training process,
    with persistent workers (the datamodule's) and without (``train_dataloaders=``)."""
    run_dir, trace = tmp_path / "run", tmp_path / "run.jsonl"
    child = launch(run_dir, trace, "spotwise", data)
    while len(lines(trace)) < 6:  # mid-epoch, past the first checkpoints
        assert child.poll() is None, child.communicate()[1][-3000:]
        time.sleep(0.005)
    os.killpg(child.pid, signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert f"exiting with code {EXIT_INTERRUPTED}" in err and "DataLoader worker" not in err
    out = finish(launch(run_dir, trace, "spotwise", data))
    assert "resumed-from: " in out
    assert per_step(lines(trace)) == reference[1]
    assert final_hash(out) == reference[0]


def test_plain_lightning_resume_differs_on_the_same_script(tmp_path: Path) -> None:
    reference = finish(launch(tmp_path / "ref", tmp_path / "ref.jsonl", "plain"))
    expected = {r["step"]: (r["loss"], r["x"]) for r in lines(tmp_path / "ref.jsonl")}
    digest, records = interrupted(tmp_path, "plain", STRIKES[:1], PATTERNS[:1])
    resumed = {r["step"]: (r["loss"], r["x"]) for r in records}  # the last run of each step
    assert digest != final_hash(reference)
    assert resumed != expected


DDP_TIMEOUT_S = 300  # two processes importing Lightning on a loaded 2-core machine


def rank_one(child: subprocess.Popen[str], timeout: float = 120) -> int:
    """The pid of DDP rank 1: Lightning's launcher starts it as a child of rank 0 (the script
    run again with LOCAL_RANK=1 in its environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"LOCAL_RANK=1" in environ:
                return int(pid)
        assert child.poll() is None, child.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError("Lightning started no rank 1")


def wait_lines(trace: Path, count: int, child: subprocess.Popen[str]) -> None:
    while len(lines(trace)) < count:
        assert child.poll() is None, child.communicate()[1][-3000:]
        time.sleep(0.005)


def test_ddp_two_processes_survive_a_group_sigkill_and_a_notice_to_one_rank(
    tmp_path: Path,
) -> None:
    """``strategy="ddp"`` with 2 CPU processes (gloo) started by Lightning's own launcher, one
    loader worker each: the whole group SIGKILLed mid-epoch, restarted at once, then SIGTERM
    to rank 1 alone (rank 0 learns of it through Run's agreement): both ranks save the same
    step and exit 75; the last restart ends with the uninterrupted run's weights and the same
    loss and batch on each rank at every step."""
    ref_trace = tmp_path / "ref.jsonl"
    ref = launch(tmp_path / "ref", ref_trace, "spotwise", "ddp", 1)
    reference = final_hash(finish(ref, DDP_TIMEOUT_S))
    expected = per_step(lines(ref_trace))
    assert {rank for rank, _ in expected} == {0, 1}

    run_dir, trace = tmp_path / "run", tmp_path / "run.jsonl"
    child = launch(run_dir, trace, "spotwise", "ddp", 1)
    wait_lines(trace, 2 * 4, child)  # step 3 on both ranks: mid-epoch, past a checkpoint
    os.killpg(child.pid, signal.SIGKILL)  # rank 1 is in the launcher's process group
    child.communicate(timeout=DDP_TIMEOUT_S)
    assert child.returncode == -signal.SIGKILL

    child = launch(run_dir, trace, "spotwise", "ddp", 1)
    rank1 = rank_one(child)
    wait_lines(trace, len(lines(trace)) + 2 * 3, child)
    os.kill(rank1, signal.SIGTERM)
    _, err = child.communicate(timeout=DDP_TIMEOUT_S)
    assert child.returncode == EXIT_INTERRUPTED, err[-3000:]
    # the ranks share one pipe: their lines may run together
    saved = re.findall(r"saved step (\d+) in \S+; exiting with code 75", err)
    assert len(saved) == 2 and saved[0] == saved[1], err[-3000:]  # both ranks, one step
    assert "signal notice" in err and "another rank's notice" in err, err[-3000:]

    out = finish(launch(run_dir, trace, "spotwise", "ddp", 1), DDP_TIMEOUT_S)
    assert re.findall(r"resumed-from: (\d+)", out) == [saved[0]] * 2, out
    assert per_step(lines(trace)) == expected
    assert final_hash(out) == reference


# --- settings spotwise cannot make exact: refused at start, naming the setting and the fix ------
def tiny_fit(
    tmp_path: Path,
    loader: Any,
    fit: dict[str, Any],
    *,
    callback: bool = True,
    notices: str | None = None,
    **trainer: Any,
) -> Any:
    import lightning as L
    import torch
    from torch import nn

    from spotwise.integrations.lightning import SpotwiseCallback

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    fitted = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        callbacks=[SpotwiseCallback(tmp_path / "run", every=1, notices=notices)]
        if callback
        else [],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **trainer,
    )
    fitted.fit(Net(), train_dataloaders=loader, **fit)
    return fitted


def loader(**kwargs: Any) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    return DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=2, **kwargs)


def test_ckpt_path_with_the_callback_is_refused(tmp_path: Path) -> None:
    from spotwise.errors import ConfigError

    lightning_checkpoint = tmp_path / "plain.ckpt"
    tiny_fit(tmp_path, loader(), {}, callback=False).save_checkpoint(lightning_checkpoint)
    with pytest.raises(ConfigError, match=r"ckpt_path=.*SpotwiseCallback") as caught:
        tiny_fit(tmp_path, loader(), {"ckpt_path": str(lightning_checkpoint)})
    assert "remove ckpt_path= from fit()" in str(caught.value.hint)


def test_a_sampler_without_state_is_refused(tmp_path: Path) -> None:
    import torch
    from torch.utils.data import WeightedRandomSampler

    from spotwise.errors import ConfigError

    sampler = WeightedRandomSampler(torch.ones(8), num_samples=8)
    with pytest.raises(ConfigError, match="custom samplers") as caught:
        tiny_fit(tmp_path, loader(sampler=sampler), {})
    assert "StatefulDataLoader" in str(caught.value.hint)


def test_gradient_accumulation_in_the_trainer_is_refused(tmp_path: Path) -> None:
    from spotwise.errors import ConfigError

    with pytest.raises(ConfigError, match="accumulate_grad_batches=2"):
        tiny_fit(tmp_path, loader(), {}, accumulate_grad_batches=2)


def test_sigterm_is_left_as_it_was_after_fit(tmp_path: Path) -> None:
    """The callback takes SIGTERM from Lightning for the fit (Lightning's handler would exit 0
    without saving); afterwards the process's own handler is back, not a closed watcher's."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    tiny_fit(tmp_path, loader(), {}, notices="auto")
    # SIGINT too: Lightning's teardown once put the closed watcher's handler back (Ctrl-C dead)
    assert {s: signal.getsignal(s) for s in before} == before
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*"))[-1] == "step-00000002"
