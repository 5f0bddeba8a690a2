"""The driver's workers: a woken job's tick (urgent) runs before the periodic ticks and
adoptions queued before it, and has threads that take nothing else."""

from __future__ import annotations

import threading

from spotwise.server.workers import Workers

WAIT_S = 30.0  # generous: only a broken queue waits this long


def test_an_urgent_task_runs_before_the_normal_ones_queued_before_it() -> None:
    workers = Workers(1, 0, "test-workers")
    workers.start()
    started, release, done = threading.Event(), threading.Event(), threading.Event()
    lock, ran = threading.Lock(), []

    def task(job_id: str) -> None:
        if job_id == "blocker":
            started.set()
            assert release.wait(WAIT_S)
        with lock:
            ran.append(job_id)
            if len(ran) == 4:
                done.set()

    try:
        workers.submit(task, "blocker")
        assert started.wait(WAIT_S)
        workers.submit(task, "periodic-1")
        workers.submit(task, "periodic-2")
        workers.submit(task, "woken", urgent=True)
        release.set()
        assert done.wait(WAIT_S)
        assert ran == ["blocker", "woken", "periodic-1", "periodic-2"]
    finally:
        workers.shutdown()


def test_urgent_only_workers_run_an_end_while_every_general_worker_is_busy() -> None:
    workers = Workers(1, 1, "test-workers")
    workers.start()
    release, urgent_ran, normal_ran = threading.Event(), threading.Event(), threading.Event()

    def task(job_id: str) -> None:
        if job_id == "slow-provider":
            assert release.wait(WAIT_S)
        elif job_id == "woken":
            urgent_ran.set()
        else:
            normal_ran.set()

    try:
        workers.submit(task, "slow-provider")
        workers.submit(task, "periodic")
        workers.submit(task, "woken", urgent=True)
        assert urgent_ran.wait(WAIT_S)  # while the general worker is still held up
        assert not normal_ran.is_set()  # (the urgent-only worker never takes it)
        release.set()
        assert normal_ran.wait(WAIT_S)
    finally:
        workers.shutdown()


def test_shutdown_waits_for_the_running_task_and_runs_nothing_after() -> None:
    workers = Workers(1, 1, "test-workers")
    workers.start()
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def task(job_id: str) -> None:
        if job_id == "running":
            started.set()
            assert release.wait(WAIT_S)
        ran.append(job_id)

    workers.submit(task, "running")
    assert started.wait(WAIT_S)
    stopper = threading.Thread(target=workers.shutdown)
    stopper.start()
    release.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()
    assert ran == ["running"]  # finished before shutdown returned
    workers.submit(task, "after", urgent=True)  # (every worker has ended: nothing runs it)
    assert ran == ["running"]
