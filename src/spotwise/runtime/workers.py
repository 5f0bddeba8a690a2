"""DataLoader worker processes that cannot be killed out from under the emergency save.

A signal sent to the whole process group (``kill -TERM -PGID``, SLURM signalling every process
of a job step, a container stop, Ctrl-C in a terminal) reaches the DataLoader workers as well as
the training process. Left alone, torch's worker SIGTERM handler ends each worker, and torch's
SIGCHLD handler in the training process then raises ``RuntimeError: DataLoader worker ... is
killed by signal`` at whatever line the main thread happens to run, the user's step or the
emergency save included: exit 1, no checkpoint. Three measures keep the notice path intact:

- workers ignore the signals that the training process takes as notices
  (:func:`spotwise.notices.signals.watched_signals`): :class:`WorkerInit` installs SIG_IGN for
  them before the user's ``worker_init_fn``; the training process saves, exits 75 and shuts the
  workers down itself, as at the end of every epoch. One exception keeps interpreter exit
  working: a SIGTERM *from the training process* still ends a worker at once, as torch's own
  worker handler does, because ``multiprocessing`` stops the workers of an iterator still alive
  at exit (persistent workers, say) with ``terminate()`` and then waits for them. SIGTERM stays
  blocked in the worker and a thread reads each one with its sender (``sigtimedwait``). The
  same thread ends the worker within a second of the training process's death, whenever that
  comes (torch's own watchdog misses a death during the worker's first moments);
- workers are forked with those signals blocked (:meth:`LoaderWorkers.start`, or
  :meth:`LoaderWorkers.protect_iterators` for a loader that other code iterates, as Lightning
  does), so a group signal that comes before a new worker has reached its init stays pending
  and is then discarded by SIG_IGN, instead of killing the worker in its first milliseconds;
- torch's worker-failure check may raise only inside the call that fetches the next batch
  (:meth:`LoaderWorkers.next`); anywhere else its error is held until that call. A worker that
  dies anyway (the OOM killer, a SIGKILL) thus surfaces as :class:`DataLoaderError` between two
  steps, where the run can still save and exit 75, or start the iterator again at the same
  position.

The worker path itself writes nothing: workers load and collate data, and the run directory's
lock is not theirs (:mod:`spotwise.runtime.dirlock`), so a worker left behind by a SIGKILLed
training process can neither block nor touch the restart, and it ends within a second.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data._utils import signal_handling

from spotwise.errors import DataLoaderError
from spotwise.notices.signals import watched_signals

_EXIT_PATIENCE_S = 1.0
_PARENT_CHECK_S = 1.0  # how often a worker looks for its training process (one getppid)


class WorkerInit:
    """The ``worker_init_fn`` of spotwise's loaders: ignore the notice signals, then run the
    user's own init. A plain picklable object, so the spawn and forkserver start methods work."""

    def __init__(self, user: Callable[[int], None] | None) -> None:
        self.user = user
        self.ignore: tuple[int, ...] = ()  # set by LoaderWorkers.start before workers start
        self.unblock: tuple[int, ...] = ()
        self.parent: int | None = None  # the training process that forks the workers

    def __call__(self, worker_id: int) -> None:
        for signum in self.ignore:
            signal.signal(signum, signal.SIG_IGN)  # also discards one that is already pending
        unblock = set(self.unblock)
        terminate = signal.SIGTERM in self.ignore
        if terminate:
            # blocked in every thread (threads started from now on inherit the mask), a SIGTERM
            # is queued despite SIG_IGN and waits for the watching thread
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            unblock.discard(signal.SIGTERM)
        if self.parent is not None:
            threading.Thread(
                target=_watch_parent,
                args=(self.parent, terminate),
                name="spotwise-worker-watch",
                daemon=True,
            ).start()
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
        if self.user is not None:
            self.user(worker_id)


def _watch_parent(parent: int, terminate: bool) -> None:
    """In a worker: end once the training process is gone, or on its own SIGTERM
    (``Process.terminate()``, which torch's worker handler obeys too); drop any other SIGTERM.
    torch's watchdog reads the parent's pid only after the worker's init, so a worker whose
    training process was SIGKILLed before then (the OOM killer, mid-fork or during the user's
    init) takes its new parent for the training process and waits forever, holding the job's
    stdout and the copies of the training process's sockets (a rank's links to the others)."""
    while os.getppid() == parent:
        if not terminate:
            time.sleep(_PARENT_CHECK_S)
            continue
        info = signal.sigtimedwait({signal.SIGTERM}, _PARENT_CHECK_S)
        if info is not None and info.si_pid == parent:
            break
    os._exit(0)


class _ChildGuard:
    """Wraps torch's SIGCHLD handler so that its error is raised only while ``armed``, and held
    for later otherwise. One per process, shared by the Runs that iterate at the same time."""

    def __init__(self, torch_handler: Callable[[int, FrameType | None], Any]) -> None:
        self.torch_handler = torch_handler
        self.armed = False
        self.held: RuntimeError | None = None
        self.users = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        try:
            self.torch_handler(signum, frame)
        except RuntimeError as exc:
            if self.armed:
                raise
            self.held = exc


def _acquire_guard() -> _ChildGuard | None:
    """Install the guard around torch's SIGCHLD handler (main thread only, like torch's)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    # torch installs its handler when the first multi-worker iterator starts; install it now,
    # so that the guard already surrounds it while the first workers are being forked
    signal_handling._set_SIGCHLD_handler()
    current = signal.getsignal(signal.SIGCHLD)
    if isinstance(current, _ChildGuard):
        guard = current
    elif callable(current):
        guard = _ChildGuard(current)
        signal.signal(signal.SIGCHLD, guard)
    else:  # torch did not install one (it never does off the main thread): nothing to guard
        return None
    guard.users += 1
    return guard


def _release_guard(guard: _ChildGuard) -> None:
    guard.users -= 1
    torch_handler = guard.torch_handler
    if guard.users == 0 and signal.getsignal(signal.SIGCHLD) is guard:  # nobody wrapped ours
        signal.signal(signal.SIGCHLD, torch_handler)


class LoaderWorkers:
    """Starts and reads the iterators of one Run's loader under the measures above."""

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        init = loader.worker_init_fn
        self.init = init if isinstance(init, WorkerInit) and loader.num_workers > 0 else None
        self._guard: _ChildGuard | None = None
        self._current: Iterator[Any] | None = None  # the newest multi-worker iterator
        self._closed = False

    def start(self) -> Iterator[Any]:
        """A new iterator; its workers (if any) are forked with the notice signals blocked."""
        if self.init is None:
            return iter(self.loader)
        if self._guard is None and not self._closed:
            self._guard = _acquire_guard()
        with self._forking(self.init):
            self._current = iter(self.loader)
            return self._current

    def protect_iterators(self) -> None:
        """For a loader that other code iterates (Lightning's fit loop): every iterator the
        loader creates forks its workers as :meth:`start` does, so they ignore the notice
        signals. ``DataLoader.__iter__`` creates them through ``_get_iterator``, which is
        wrapped on this loader alone. A worker that dies anyway (the OOM killer) raises torch's
        own error: its batches are not read through :meth:`next`, so no guard holds it."""
        init = self.init
        if init is None:
            return
        create = self.loader._get_iterator

        def forked() -> Iterator[Any]:
            with self._forking(init):
                return create()

        self.loader._get_iterator = forked  # type: ignore[method-assign,assignment]

    @staticmethod
    @contextlib.contextmanager
    def _forking(init: WorkerInit) -> Iterator[None]:
        """The notice signals blocked while workers are forked, and ignored in them."""
        signals = watched_signals()
        before = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        init.ignore = signals
        init.unblock = tuple(s for s in signals if s not in before)
        init.parent = os.getpid()
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def next(self, iterator: Iterator[Any]) -> Any:
        """The next batch. A dead worker raises :class:`DataLoaderError` (the iterator is shut
        down: start a new one); StopIteration and the dataset's own errors pass through."""
        guard = self._guard
        if guard is not None and guard.held is not None:
            held, guard.held = guard.held, None
            self._raise_if_dead(iterator, held)
            raise held  # another loader's worker: what torch would have raised, at a safe point
        try:
            if guard is not None:
                guard.armed = True
            try:
                return next(iterator)
            finally:
                if guard is not None:
                    guard.armed = False
        except (RuntimeError, OSError, EOFError) as exc:  # torch's check, or a batch handed
            self._raise_if_dead(iterator, exc)  # over through a dead worker's socket or pipe
            raise

    def _raise_if_dead(self, iterator: Iterator[Any], error: Exception) -> None:
        # torch's multi-process iterator keeps its worker Process objects in ``_workers``
        workers = getattr(iterator, "_workers", ())
        # a dead worker's socket resets while the kernel is still ending it: give it a moment
        patience = 0.0 if isinstance(error, RuntimeError) else _EXIT_PATIENCE_S
        deadline = time.monotonic() + patience
        while not (dead := [w for w in workers if not w.is_alive()]):
            if not workers or time.monotonic() >= deadline:
                return
            time.sleep(0.005)
        self._stop(iterator)  # the living workers too: a new iterator gets a full set
        ended = ", ".join(f"pid {w.pid} ({_how(w.exitcode)})" for w in dead)
        raise DataLoaderError(
            f"DataLoader worker {ended} ended: {error}",
            hint="a worker was killed (out of memory?) or crashed in the dataset code; run "
            "with num_workers=0 to see the dataset's own error",
        ) from error

    def _stop(self, iterator: Iterator[Any]) -> None:
        """Shut the iterator's workers down now, under the guard: a worker death noticed on the
        way is about them and is dropped (torch's own shutdown, at exit or in ``__del__``,
        would print it as an ignored exception)."""
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if getattr(self.loader, "_iterator", None) is iterator:  # persistent_workers=True
            self.loader._iterator = None
        if self._guard is not None:
            self._guard.held = None
        if self._current is iterator:
            self._current = None

    def close(self) -> None:
        """Stop the workers, then give torch its SIGCHLD handler back once no Run iterates."""
        self._closed = True
        if self._current is not None:
            self._stop(self._current)
        if self._guard is not None:
            _release_guard(self._guard)
            self._guard = None


def _how(exitcode: int | None) -> str:
    if exitcode is None or exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return f"killed by {signal.Signals(-exitcode).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-exitcode}"
