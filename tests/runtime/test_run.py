"""Run with real (tiny) training: bit-exact resume, fallback, notices, errors, retention."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from spotwise.checkpoint.format import MANIFEST, TENSORS_FILE
from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.writeway import WriteWay, way_name
from spotwise.errors import CheckpointError, ConfigError, SaveError, StateMismatchError
from spotwise.notices.base import NoticeKind
from spotwise.runtime import CheckpointConfig, Run, list_checkpoints, load_checkpoint
from spotwise.telemetry.events import EVENTS_FILE, read_events

STEPS = 40  # 9 batches per epoch: resumes land mid-epoch


def assert_same_history(reference: list, *pieces: list) -> None:
    """Every recorded step (including steps redone after a resume) equals the reference."""
    expected = {r[0]: r for r in reference}
    for piece in pieces:
        for record in piece:
            step = record[0]
            assert record == expected[step], (
                f"diverged at step {step}: got (epoch, batch, loss) {record[1:]}, "
                f"uninterrupted run had {expected[step][1:]}"
            )


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_is_bit_exact(tmp_path: Path, trainer: Any, workers: int) -> None:
    reference = trainer(tmp_path / "ref", STEPS, workers=workers)
    first = trainer(tmp_path / "run", STEPS, workers=workers, stop_after=13)
    second = trainer(tmp_path / "run", STEPS, workers=workers, stop_after=27)
    last = trainer(tmp_path / "run", STEPS, workers=workers)
    assert second.records[0][0] == 11 and second.run.resumed_from.step == 10
    assert last.records[0][0] == 26  # 25 was the last save before the stop at 27
    assert second.records[0][1] == 1  # resumed inside epoch 1 (batch 2 of 9)
    assert_same_history(reference.records, first.records, second.records, last.records)
    assert last.weights == reference.weights


def test_sync_saves_and_auto_interval_resume_exactly(tmp_path: Path, trainer: Any) -> None:
    reference = trainer(tmp_path / "ref", 20, checkpoint=CheckpointConfig(every=None))
    trainer(
        tmp_path / "sync", 20, stop_after=12, checkpoint=CheckpointConfig(every=5, async_save=False)
    )
    resumed = trainer(tmp_path / "sync", 20, checkpoint=CheckpointConfig(every=5, async_save=False))
    assert resumed.weights == reference.weights
    auto = trainer(tmp_path / "auto", 20, checkpoint=CheckpointConfig(every="auto"), stop_after=9)
    assert auto.run.save_cost_s is not None and auto.run.save_cost_s > 0
    assert [c.step for c in list_checkpoints(tmp_path / "auto")] == [1]  # first boundary
    assert (
        trainer(tmp_path / "auto", 20, checkpoint=CheckpointConfig(every="auto")).weights
        == reference.weights
    )


def corrupt_flip(path: Path) -> None:
    data = bytearray((path / TENSORS_FILE).read_bytes())
    data[len(data) // 2] ^= 0x40
    (path / TENSORS_FILE).write_bytes(bytes(data))


def corrupt_truncate(path: Path) -> None:
    os.truncate(path / TENSORS_FILE, (path / TENSORS_FILE).stat().st_size // 2)


def corrupt_manifest(path: Path) -> None:
    (path / MANIFEST).unlink()


@pytest.mark.parametrize("corrupt", [corrupt_flip, corrupt_truncate, corrupt_manifest])
def test_corrupt_newest_falls_back_and_finishes_identically(
    tmp_path: Path, trainer: Any, corrupt: Any
) -> None:
    reference = trainer(tmp_path / "ref", 30, checkpoint=CheckpointConfig(every=None))
    trainer(tmp_path / "run", 20)  # checkpoints 10, 15 and the final 20
    corrupt(tmp_path / "run" / "step-00000020")
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step-00000020"):
        resumed = trainer(tmp_path / "run", 30)
    assert resumed.run.resumed_from.step == 15
    assert resumed.weights == reference.weights


def test_finished_run_does_not_train_again(tmp_path: Path, trainer: Any) -> None:
    done = trainer(tmp_path, 12)
    again = trainer(tmp_path, 12)
    assert again.records == [] and again.weights == done.weights and again.run.done


def test_terminate_notice_saves_acknowledges_and_exits_75(
    tmp_path: Path, trainer: Any, scripted_notices: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    source_cls, make_notice = scripted_notices
    notice = make_notice(NoticeKind.TERMINATE)
    source = source_cls(at_call={7: notice})
    with pytest.raises(SystemExit) as exit_info:
        trainer(tmp_path / "run", STEPS, notices=source)
    assert exit_info.value.code == 75
    assert source.acknowledged == [notice] and source.closed
    assert [c.step for c in list_checkpoints(tmp_path / "run", deep=True) if c.valid][-1] == 7
    assert "exiting with code 75" in capsys.readouterr().err
    interrupted = read_events(tmp_path / "run" / "events.jsonl", "interrupted")
    assert interrupted[0]["step"] == 7 and interrupted[0]["exit_code"] == 75
    resumed = trainer(tmp_path / "run", STEPS)
    assert resumed.run.resumed_from.step == 7
    assert resumed.weights == trainer(tmp_path / "ref", STEPS).weights


def test_advisory_notice_saves_once_and_continues(
    tmp_path: Path, trainer: Any, scripted_notices: Any
) -> None:
    source_cls, make_notice = scripted_notices
    advisory = make_notice(NoticeKind.ADVISORY)
    # the same advisory seen at steps 3 and 4, a new one at step 8
    second = make_notice(NoticeKind.ADVISORY, 2.0)
    source = source_cls(at_call={3: advisory, 4: advisory, 8: second})
    trainer(tmp_path, 12, notices=source, checkpoint=CheckpointConfig(every=None, keep_last=10))
    saved = [e["step"] for e in read_events(tmp_path / "events.jsonl", "checkpoint")]
    assert saved == [3, 8, 12]
    assert source.acknowledged == []


class FailingMirror:
    def __init__(self) -> None:
        self.restored: list[Path] = []
        self.committed_steps: list[int] = []
        self.flushed = 0

    def restore(self, run_dir: Path) -> None:
        self.restored.append(run_dir)

    def committed(self, checkpoint: CheckpointInfo, deleted: Any) -> None:
        self.committed_steps.append(checkpoint.step)
        if checkpoint.step == 10:
            raise OSError(28, "No space left on device (remote)")

    def flush(self) -> None:
        self.flushed += 1


def test_background_failure_is_raised_at_a_later_step(tmp_path: Path, trainer: Any) -> None:
    mirror = FailingMirror()
    with pytest.raises(SaveError, match=r"background save failed.*No space left"):
        trainer(tmp_path, STEPS, checkpoint=CheckpointConfig(every=5, mirror=mirror))
    assert mirror.restored == [tmp_path] and mirror.committed_steps == [5, 10]
    assert [c.step for c in list_checkpoints(tmp_path, deep=True) if c.valid] == [5, 10]


def test_mirror_hooks_run_in_order(tmp_path: Path, trainer: Any) -> None:
    class Recorder(FailingMirror):
        def committed(self, checkpoint: CheckpointInfo, deleted: Any) -> None:
            self.committed_steps.append(checkpoint.step)

    mirror = Recorder()
    trainer(tmp_path, 12, checkpoint=CheckpointConfig(every=5, mirror=mirror))
    assert mirror.committed_steps == [5, 10, 12] and mirror.flushed == 1


def test_the_mirror_gets_each_commit_before_retention_deletes_anything(
    tmp_path: Path, trainer: Any
) -> None:
    """Its upload (which an exit on a notice waits for) must not wait for the deletions."""
    seen: list[tuple[int, list[int], list[int]]] = []

    class Recorder(FailingMirror):
        def committed(self, checkpoint: CheckpointInfo, deleted: Any) -> None:
            on_disk = [c.step for c in list_checkpoints(tmp_path) if c.valid]
            seen.append((checkpoint.step, [d.step for d in deleted], on_disk))

    trainer(tmp_path, 15, checkpoint=CheckpointConfig(every=5, keep_last=1, mirror=Recorder()))
    assert seen == [(5, [], [5]), (10, [5], [5, 10]), (15, [10], [10, 15])]
    assert [c.step for c in list_checkpoints(tmp_path)] == [15]
    events = [e for e in read_events(tmp_path / EVENTS_FILE, "checkpoint")]
    assert [(e["step"], e["deleted"]) for e in events] == [(5, []), (10, [5]), (15, [10])]


def test_a_mirror_refusing_a_commit_keeps_its_event_and_what_it_would_have_deleted(
    tmp_path: Path, trainer: Any
) -> None:
    with pytest.raises(SaveError, match=r"background save failed.*No space left"):
        trainer(tmp_path, STEPS, checkpoint=CheckpointConfig(every=5, keep_last=1,
                                                             mirror=FailingMirror()))  # fmt: skip
    assert [c.step for c in list_checkpoints(tmp_path, deep=True)] == [5, 10]
    events = [e for e in read_events(tmp_path / EVENTS_FILE, "checkpoint")]
    assert [(e["step"], e["deleted"]) for e in events] == [(5, []), (10, [])]


def test_checkpoint_of_a_different_model_is_refused_untouched(tmp_path: Path, trainer: Any) -> None:
    trainer(tmp_path, 10)
    before = {c.step: c.as_dict() for c in list_checkpoints(tmp_path, deep=True)}
    with pytest.raises(StateMismatchError, match=r"does not fit model 'model'.*mismatched") as err:
        trainer(tmp_path, 20, hidden=32)
    assert "new run directory" in str(err.value)
    assert {c.step: c.as_dict() for c in list_checkpoints(tmp_path, deep=True)} == before
    assert trainer(tmp_path, 12).run.resumed_from.step == 10  # lock released, still usable


def test_retention_during_a_run(tmp_path: Path, trainer: Any) -> None:
    trainer(tmp_path, 30, checkpoint=CheckpointConfig(every=5, keep_last=2, keep_every=10))
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 20, 25, 30]


def test_extras_and_metrics_survive(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    with Run(
        tmp_path,
        state={"model": model},
        steps=3,
        checkpoint=CheckpointConfig(every=1),
        notices=None,
    ) as run:
        for step in run:
            run.extras["best"] = {"value": 0.5 - step, "at": (step, "x")}
            run.extras["ema"] = torch.full((2,), float(step))
            run.log(loss=1.0 / (step + 1))
    assert load_checkpoint(tmp_path / "step-00000003").info.metrics == {"loss": 1 / 3}
    with Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, steps=3, notices=None) as again:
        assert again.extras["best"] == {"value": -1.5, "at": (2, "x")}
        assert torch.equal(again.extras["ema"], torch.full((2,), 2.0))
        assert list(again) == []


def test_plain_step_loop_without_loader(tmp_path: Path) -> None:
    with Run(
        tmp_path,
        state={"model": torch.nn.Linear(2, 1)},
        steps=4,
        checkpoint=CheckpointConfig(every=2),
        notices=None,
    ) as run:
        assert list(run) == [0, 1, 2, 3]
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 4]


def test_bad_run_directories(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ConfigError, match="ftp://"):
        Run("ftp://host/run", state={"model": model}, notices=None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        Run(tmp_path / "file", state={"model": model}, notices=None)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("x")
    with pytest.raises(ConfigError, match=r"not a spotwise run directory.*thesis\.tex"):
        Run(tmp_path / "home", state={"model": model}, notices=None)
    with pytest.raises(ConfigError, match="state_dict"):
        Run(tmp_path / "new", state={"model": object()}, notices=None)
    with pytest.raises(ConfigError, match="steps=N"):
        iter(Run(tmp_path / "nosteps", state={"model": model}, notices=None)).__next__()


def test_one_run_per_directory(tmp_path: Path) -> None:
    first = Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None)
    with pytest.raises(CheckpointError, match="another process"):
        Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None)
    first.close()
    Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None).close()


def test_auto_notices_use_the_environment_watcher(tmp_path: Path) -> None:
    run = Run(
        tmp_path,
        state={"model": torch.nn.Linear(2, 1)},
        steps=2,
        checkpoint=CheckpointConfig(every=None),
    )  # notices="auto"
    assert run._notices is not None and callable(run._notices.current)
    assert list(run) == [0, 1]  # closes the watcher and finishes normally


def test_grad_scaler_and_two_models_resume_exactly(tmp_path: Path) -> None:
    def train(name: str, stop_after: int | None = None) -> tuple[list[float], dict]:
        torch.manual_seed(0)
        student, teacher = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
        losses = []
        with Run(
            tmp_path / name,
            state={"student": student, "teacher": teacher, "optimizer": opt, "scaler": scaler},
            steps=12,
            checkpoint=CheckpointConfig(every=4),
            notices=None,
        ) as run:
            for step in run:
                x = torch.randn(8, 4)
                loss = ((student(x) - teacher(x).detach()) ** 2).mean()
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                losses.append(loss.item())
                if step + 1 == stop_after:
                    break
        return losses, {"scale": scaler.get_scale(), **student.state_dict()}

    reference_losses, reference = train("ref")
    train("run", stop_after=6)
    resumed_losses, resumed = train("run")
    assert resumed_losses == reference_losses[4:]  # resumed from step 4
    assert resumed["scale"] == reference["scale"] > 2.0**10  # the scaler grew and was restored
    assert all(torch.equal(resumed[k], reference[k]) for k in ("weight", "bias"))


def test_terminate_notice_with_time_to_spare_trains_on_then_exits_near_the_deadline(
    tmp_path: Path, trainer: Any, scripted_notices: Any
) -> None:
    import dataclasses
    import time as _time

    source_cls, make_notice = scripted_notices
    base = make_notice(NoticeKind.TERMINATE)
    far = dataclasses.replace(base, deadline_monotonic=_time.monotonic() + 3600.0)  # GPU host
    near = dataclasses.replace(base, received_monotonic=2.0, deadline_monotonic=_time.monotonic())
    source = source_cls(at_call={**{n: far for n in range(3, 9)}, 9: near})
    with pytest.raises(SystemExit) as exit_info:
        trainer(
            tmp_path,
            STEPS,
            notices=source,
            checkpoint=CheckpointConfig(every=2, keep_last=10, notice_margin_s=30.0),
        )
    assert exit_info.value.code == 75
    saved = [e["step"] for e in read_events(tmp_path / "events.jsonl", "checkpoint")]
    # the schedule's first save measures the cost; an early save when the far notice first
    # appears, training and the schedule go on, then the emergency save near the deadline
    assert saved == [2, 3, 4, 6, 8, 9]
    assert source.acknowledged == [near]


def test_large_saves_try_the_page_cache_and_keep_the_faster_way(
    tmp_path: Path, trainer: Any, scripted_notices: Any
) -> None:
    """A state of about 43 MiB: the first save is written directly, the next through the page
    cache, each later one the way that was faster as this Run measured it, the save on a notice
    never the one to try; the checkpoints kept pass every check, and the resume from the
    notice's save ends bit-exact."""
    source_cls, make_notice = scripted_notices
    big = {"hidden": 300_000, "checkpoint": CheckpointConfig(every=3, keep_last=2)}
    source = source_cls(at_call={17: make_notice(NoticeKind.TERMINATE)})
    with pytest.raises(SystemExit):
        trainer(tmp_path / "run", 24, notices=source, **big)
    saves = read_events(tmp_path / "run" / EVENTS_FILE, "checkpoint")
    assert [(e["step"], e["reason"]) for e in saves][-1] == (17, "notice")
    assert [e["written"] for e in saves][:2] == ["direct", "page cache"]
    way = WriteWay()  # what the Run was told, replayed: it must have chosen the same each time
    for event in saves:
        direct = way.direct(may_try=event["reason"] != "notice")
        assert event["written"] == way_name(direct), event
        way.record(direct, event["bytes"], event["write_s"])
    kept = list_checkpoints(tmp_path / "run", deep=True)
    assert [c.step for c in kept] == [15, 17] and all(c.valid for c in kept)
    assert (
        trainer(tmp_path / "run", 24, **big).weights == trainer(tmp_path / "ref", 24, **big).weights
    )
