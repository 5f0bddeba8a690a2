"""The Transformers Trainer callback with the real ``transformers`` package on CPU and real
processes (no downloads): a tiny GPT-2 in fp32 and a tiny BERT in bf16 (its masks drawn in the
loader's workers), built from configs, ``gradient_accumulation_steps=4`` (each epoch ends with a
shorter window of 2), ``dataloader_num_workers=2``. Killed at random moments (SIGKILL to the
main PID and SIGTERM to the process group for GPT-2, SIGKILL and SIGTERM to the process group
for BERT; a SIGTERM ends with exit 75 after a committed checkpoint) and restarted at once each
time, a run ends with the uninterrupted run's weights and the same loss at every micro-batch.
The Trainer's own ``resume_from_checkpoint`` on the same script is measured too, and does not.
TRL's ``SFTTrainer`` is checked the same way on the GPT-2 script.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .test_resume_shapes import EXIT_INTERRUPTED, final_hash, lines

pytest.importorskip("transformers")

CHILD = Path(__file__).with_name("_transformers_child.py")
WORKERS = 2
# each precision with a SIGKILL and the group SIGTERM; the three patterns in the file
CONFIGS = {
    ("gpt2", "fp32"): ("SIGKILL main", "SIGTERM group"),
    ("bert", "bf16"): ("SIGKILL group", "SIGTERM group"),
}
PLAIN = ("bert", "bf16")  # the Trainer's own resume, where workers draw random numbers

pytestmark = pytest.mark.e2e


def launch(
    run_dir: Path, trace: Path, mode: str, model: str, precision: str
) -> subprocess.Popen[str]:
    env = dict(os.environ, SPOTWISE_PLATFORM="none", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen(
        [
            sys.executable,
            str(CHILD),
            str(run_dir),
            str(trace),
            mode,
            model,
            precision,
            str(WORKERS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, like a job step
    )


def finish(child: subprocess.Popen[str]) -> str:
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err[-3000:]
    return out


def per_micro(records: list[dict[str, Any]]) -> dict[tuple[int, int], float]:
    """Loss per (step, micro-batch); a replayed micro-batch must equal its first run."""
    seen: dict[tuple[int, int], float] = {}
    for r in records:
        key = (r["step"], r["micro"])
        assert seen.setdefault(key, r["loss"]) == r["loss"], f"{key} differs on replay"
    return seen


def strike(child: subprocess.Popen[str], pattern: str) -> tuple[str, str]:
    signum = signal.SIGKILL if "KILL" in pattern else signal.SIGTERM
    if "group" in pattern:
        os.killpg(child.pid, signum)
    else:
        os.kill(child.pid, signum)
    return child.communicate(timeout=300)


def interrupted(
    tmp_path: Path, mode: str, model: str, precision: str, patterns: tuple[str, ...], seed: int
) -> tuple[str, list[dict[str, Any]]]:
    """Strike a run once per pattern at a random micro-batch of each start (after its first
    two steps), restarting it at once; then let it finish."""
    run_dir, trace = tmp_path / f"{mode}-{model}", tmp_path / f"{mode}-{model}.jsonl"
    rng = random.Random(seed)
    for pattern in patterns:
        start = len(lines(trace))
        target = rng.randint(9, 16)  # micro-batches of this start: inside the third to fourth step
        child = launch(run_dir, trace, mode, model, precision)
        while len(lines(trace)) - start < target:
            assert child.poll() is None, f"{model} ended before {pattern}: {child.stderr.read()}"  # type: ignore[union-attr]
            time.sleep(0.005)
        out, err = strike(child, pattern)
        if pattern == "SIGTERM group" and mode == "spotwise":
            assert child.returncode == EXIT_INTERRUPTED, err[-3000:]
            assert f"exiting with code {EXIT_INTERRUPTED}" in err
        elif "KILL" in pattern:
            assert child.returncode == -signal.SIGKILL, err[-3000:]
    out = finish(launch(run_dir, trace, mode, model, precision))
    assert "resumed-from: " in out
    return final_hash(out), lines(trace)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, list[dict]]]:
    """The uninterrupted runs, started together: with the callback for each model, and the
    plain Trainer for BERT."""
    root = tmp_path_factory.mktemp("references")
    runs = [("spotwise", model, precision) for model, precision in CONFIGS]
    runs.append(("plain", *PLAIN))
    children = {
        f"{mode}-{model}": launch(
            root / f"{mode}-{model}", root / f"{mode}-{model}.jsonl", mode, model, precision
        )
        for mode, model, precision in runs
    }
    return {
        name: (final_hash(finish(child)), lines(root / f"{name}.jsonl"))
        for name, child in children.items()
    }


@pytest.mark.parametrize(("model", "precision"), list(CONFIGS))
def test_killed_training_ends_like_the_uninterrupted_one(
    tmp_path: Path, references: dict[str, tuple[str, list[dict]]], model: str, precision: str
) -> None:
    digest, expected = references[f"spotwise-{model}"]
    patterns = CONFIGS[model, precision]
    final, records = interrupted(
        tmp_path, "spotwise", model, precision, patterns, seed=sum(map(ord, model))
    )
    assert per_micro(records) == per_micro(expected)
    assert final == digest
    assert len(records) > len(expected)  # the kills really replayed micro-batches


def test_the_trainers_own_resume_differs_on_the_same_script(
    tmp_path: Path, references: dict[str, tuple[str, list[dict]]]
) -> None:
    """``TrainingArguments(save_steps=2)`` and ``train(resume_from_checkpoint=True)`` after one
    SIGKILL in the middle of an epoch: training finishes, with other weights and losses. (On
    the GPT-2 script, whose workers draw nothing, transformers 5.24's own resume was measured
    bit-exact; BERT's masks are drawn in the workers, whose seeds its resume does not
    repeat.)"""
    model, precision = PLAIN
    digest, expected = references[f"plain-{model}"]
    final, records = interrupted(tmp_path, "plain", model, precision, ("SIGKILL main",), seed=7)
    resumed = {(r["step"], r["micro"]): r["loss"] for r in records}  # the last run of each
    reference = per_micro(expected)
    differing = sorted(k for k in reference if resumed.get(k) != reference[k])
    print(f"trainer-own-resume: {len(differing)} of {len(reference)} micro-batch losses differ")
    assert final != digest
    assert differing


def test_trls_sft_trainer_resumes_exactly(tmp_path: Path) -> None:
    """TRL's ``SFTTrainer`` (a Trainer subclass with its own loss, collator and tokenized
    dataset, the same loop) on the GPT-2 script: killed by SIGKILL and a group SIGTERM, it
    ends like the uninterrupted run."""
    pytest.importorskip("trl")
    reference = tmp_path / "reference"
    digest = final_hash(
        finish(launch(reference, tmp_path / "reference.jsonl", "spotwise", "gpt2-sft", "fp32"))
    )
    patterns = ("SIGKILL main", "SIGTERM group")
    final, records = interrupted(tmp_path, "spotwise", "gpt2-sft", "fp32", patterns, seed=5)
    assert per_micro(records) == per_micro(lines(tmp_path / "reference.jsonl"))
    assert final == digest
    assert len(records) > len(lines(tmp_path / "reference.jsonl"))


# --- settings spotwise cannot make exact: refused before training, naming the setting ---------
def tiny_trainer(tmp_path: Path, **arguments: Any) -> Any:
    import torch
    from transformers import Trainer, TrainingArguments

    from spotwise.integrations.transformers import SpotwiseCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": self.linear(x).pow(2).mean()}

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, use_cpu=True, report_to=[], **arguments
    )
    data = [{"x": torch.ones(2)} for _ in range(8)]
    callback = SpotwiseCallback(tmp_path / "run", every=1, notices=None)
    return Trainer(model=Model(), args=args, train_dataset=data, callbacks=[callback])


def test_resume_from_checkpoint_with_the_callback_is_refused(tmp_path: Path) -> None:
    from spotwise.errors import ConfigError

    trainer = tiny_trainer(tmp_path)
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint='out/checkpoint-2'") as error:
        trainer.train(resume_from_checkpoint="out/checkpoint-2")
    assert "remove resume_from_checkpoint=" in str(error.value.hint)
    assert not (tmp_path / "run").exists()  # refused before the Run opened its directory
    trainer.train()  # without it, the same Trainer trains
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == [
        "step-00000001",
        "step-00000002",
    ]


def test_the_trainers_sigterm_checkpoint_with_the_callback_is_refused(tmp_path: Path) -> None:
    from spotwise.errors import ConfigError

    before = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(ConfigError, match=r"TrainingArguments\(enable_jit_checkpoint=True\)"):
            tiny_trainer(tmp_path, enable_jit_checkpoint=True)
    finally:  # the Trainer installed its SIGTERM handler before the callback refused
        signal.signal(signal.SIGTERM, before)
