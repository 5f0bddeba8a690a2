"""``spotwise run -- CMD``: real programs (sh scripts) under the real CLI, notices delivered as
the platforms deliver them (signals to the wrapper, a loopback IMDS), and for each case the exit
code and what became of every process the program started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotwise.emulators import AwsImdsEmulator
from spotwise.errors import ConfigError
from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.notices.forward import forward_signal

# Ctrl-C as in a program started from a terminal, even when the tests were started in the
# background by a shell, which leaves SIGINT ignored in them and so in every child
CTRL_C_AS_FROM_A_TERMINAL = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)"
)
SPOTWISE = [
    sys.executable,
    "-c",
    f"{CTRL_C_AS_FROM_A_TERMINAL}; from spotwise.cli.main import main; main()",
]
Wait = Callable[..., object]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in "ZX"


def pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


def children(pid: int) -> list[int]:
    return [
        int(k)
        for task in Path(f"/proc/{pid}/task").glob("*")
        for k in (task / "children").read_text().split()
    ]


class Wrapper:
    """``spotwise run [options] -- sh script`` in its own session, as a machine starts it."""

    def __init__(self, cwd: Path, script: str, *options: str, env: dict[str, str]) -> None:
        (cwd / "job.sh").write_text(script)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [*SPOTWISE, "run", *options, "--", "sh", "job.sh"],
            cwd=cwd,
            env={**os.environ, "SPOTWISE_PLATFORM": "none", **env},
            start_new_session=True,
            stderr=subprocess.PIPE,
            text=True,
        )

    def end(self, timeout_s: float = 30.0) -> tuple[int, float, str]:
        """Exit code, seconds since start, what the wrapper said."""
        _, err = self.proc.communicate(timeout=timeout_s)
        return self.proc.returncode, time.monotonic() - self.started, err


@pytest.fixture()
def wrapper(tmp_path: Path) -> Iterator[Callable[..., Wrapper]]:
    made: list[Wrapper] = []

    def start(script: str, *options: str, **env: str) -> Wrapper:
        made.append(Wrapper(tmp_path, script, *options, env=env))
        return made[-1]

    yield start
    for w in made:
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()


# A program with a child in its group that reports the signal it got, and one that left it.
FAMILY = """
(trap 'echo TERM > child.got; exit 0' TERM; sleep 1000 & wait) &
echo $! > child.pid
setsid sleep 1000 & echo $! > escaped.pid
"""


def test_group_sigterm_is_forwarded_to_the_program_that_traps_it_and_exits_0(
    tmp_path: Path, wrapper: Callable[..., Wrapper], wait_for: Wait
) -> None:
    """``kill -TERM -PGID`` on the wrapper's group (a container stop, a terminal): the program
    (own group) gets SIGTERM from the wrapper, reads the notice file, exits 0; the attempt is 75,
    well before the grace, and nothing of the program is left."""
    w = wrapper(
        FAMILY + "trap 'cp \"$SPOTWISE_NOTICE_FILE\" notice.json; exit 0' TERM\n"
        "echo $$ > leader.pid\nwhile :; do sleep 0.05; done\n",
        SPOTWISE_GRACE_S="20",
    )
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    family = pids(tmp_path / "leader.pid") + pids(tmp_path / "child.pid")
    family += pids(tmp_path / "escaped.pid")
    sent = time.time()
    os.killpg(w.proc.pid, signal.SIGTERM)
    code, took, err = w.end()
    assert code == EXIT_INTERRUPTED, err
    assert took < 10  # the program ended by itself, nobody waited for the 20 s grace
    notice = json.loads((tmp_path / "notice.json").read_text())
    assert notice["source"] == "signal" and notice["kind"] == "terminate"
    assert notice["action"] == "SIGTERM" and notice["signal"] == "SIGTERM"
    assert notice["deadline_unix"] - notice["received_unix"] == pytest.approx(20.0, abs=0.01)
    assert sent - 1 < notice["received_unix"] < sent + 5
    assert (tmp_path / "child.got").read_text().strip() == "TERM"  # the group got it
    assert not [p for p in family if alive(p)]  # the escaped sleep too (after the program)


def test_program_that_ignores_sigterm_and_reads_the_notice_file_is_75_whatever_its_code(
    tmp_path: Path, wrapper: Callable[..., Wrapper], wait_for: Wait
) -> None:
    w = wrapper(
        "trap '' TERM\necho $$ > leader.pid\n"
        'while [ ! -f "$SPOTWISE_NOTICE_FILE" ]; do sleep 0.05; done\n'
        'cp "$SPOTWISE_NOTICE_FILE" notice.json\nexit 3\n',
        SPOTWISE_GRACE_S="20",
    )
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    w.proc.send_signal(signal.SIGTERM)
    code, took, err = w.end()
    assert code == EXIT_INTERRUPTED, err
    assert took < 10
    assert json.loads((tmp_path / "notice.json").read_text())["action"] == "SIGTERM"


def test_program_that_outlasts_the_grace_is_killed_with_its_children(
    tmp_path: Path, wrapper: Callable[..., Wrapper], wait_for: Wait
) -> None:
    """The save on SIGTERM takes too long; a child ignores SIGTERM; one left the group: all
    SIGKILLed when the grace is over (1/10 of it before the deadline), and the attempt is 75."""
    w = wrapper(
        "sh -c \"trap '' TERM; exec sleep 1000\" & echo $! > child.pid\n"
        "setsid sleep 1000 & echo $! > escaped.pid\n"
        "trap 'touch saving; sleep 1000' TERM\necho $$ > leader.pid\nwait\n",
        SPOTWISE_GRACE_S="2",
    )
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    family = [pids(tmp_path / f) for f in ("leader.pid", "child.pid", "escaped.pid")]
    noticed = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    code, _, err = w.end()
    took = time.monotonic() - noticed
    assert code == EXIT_INTERRUPTED, err
    assert (tmp_path / "saving").exists()
    assert 1.7 < took < 10, err  # killed at 2 s - 0.2 s, not before
    assert "the grace is over: SIGKILL" in err
    assert not [p for ps in family for p in ps if alive(p)]


def test_child_still_saving_when_the_program_dies_of_the_notice_is_not_cut_short(
    tmp_path: Path, wrapper: Callable[..., Wrapper], wait_for: Wait
) -> None:
    """``sh train.sh`` dies at once of the forwarded SIGTERM while its child is still saving:
    the attempt waits for the child (within the grace), not only for the first process."""
    w = wrapper(
        'sh -c \'trap "sleep 1; echo saved > saved; exit 0" TERM; echo $$ > child.pid; '
        "while :; do sleep 0.05; done' &\necho $$ > leader.pid\nwait\n",
        SPOTWISE_GRACE_S="20",
    )
    assert wait_for(lambda: (tmp_path / "child.pid").exists())
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    w.proc.send_signal(signal.SIGTERM)
    code, took, err = w.end()
    assert code == EXIT_INTERRUPTED, err
    assert (tmp_path / "saved").read_text().strip() == "saved"
    assert took < 15 and "SIGKILL" not in err


def test_program_that_ends_leaves_no_children_and_its_own_code(
    tmp_path: Path, wrapper: Callable[..., Wrapper]
) -> None:
    """No notice: the wrapper exits with the program's code; what the program left running
    gets SIGTERM (the child in its group says so) and the one that left the group goes too."""
    # (the program ends only once its subshell has started its sleep: three processes left)
    family = FAMILY.replace("sleep 1000 & wait", "sleep 1000 & : > child.ready; wait")
    w = wrapper(
        family + "while [ ! -e child.ready ]; do sleep 0.01; done\nexit 4\n", SPOTWISE_GRACE_S="20"
    )
    code, took, err = w.end()
    assert code == 4, err
    assert took < 10
    assert "left 3 process(es): SIGTERM" in err  # the subshell, its sleep, the escaped sleep
    assert (tmp_path / "child.got").read_text().strip() == "TERM"
    assert not alive(pids(tmp_path / "child.pid")[0])
    assert not alive(pids(tmp_path / "escaped.pid")[0])


def test_sigkilled_wrapper_takes_the_program_group_with_it(
    tmp_path: Path, wrapper: Callable[..., Wrapper], wait_for: Wait
) -> None:
    """Nothing can run after a SIGKILL; the watchdog kills the program's group for it, and
    removes the notice file's private directory."""
    w = wrapper(
        'echo "$SPOTWISE_NOTICE_FILE" > notice.path\n'
        "sleep 1000 & echo $! > child.pid\necho $$ > leader.pid\nwait\n"
    )
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    leader, child = pids(tmp_path / "leader.pid")[0], pids(tmp_path / "child.pid")[0]
    [watchdog] = [p for p in children(w.proc.pid) if p != leader]
    os.kill(w.proc.pid, signal.SIGKILL)
    w.proc.wait()
    # event-driven (the watchdog reads end-of-file), but a loaded machine may not run it for a while
    gone = wait_for(lambda: not alive(leader) and not alive(child), timeout_s=30)
    assert gone, f"program still running; watchdog {'alive' if alive(watchdog) else 'gone'}"
    assert wait_for(lambda: not alive(watchdog), timeout_s=30)
    private_dir = Path((tmp_path / "notice.path").read_text().strip()).parent
    assert private_dir.name.startswith("spotwise-") and not private_dir.exists()


def test_aws_notice_forwarded_as_the_chosen_signal_with_the_deadline(
    tmp_path: Path,
    wrapper: Callable[..., Wrapper],
    wait_for: Wait,
    aws_emulator: AwsImdsEmulator,
) -> None:
    w = wrapper(
        "trap 'cp \"$SPOTWISE_NOTICE_FILE\" notice.json; exit 0' USR1\n"
        "echo $$ > leader.pid\nwhile :; do sleep 0.05; done\n",
        "--signal",
        "usr1",
        SPOTWISE_PLATFORM="aws",
        AWS_EC2_METADATA_SERVICE_ENDPOINT=aws_emulator.url,
        SPOTWISE_AWS_POLL_S="0.05",
    )
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    aws_emulator.trigger_notice()
    code, _, err = w.end()
    assert code == EXIT_INTERRUPTED, err
    notice = json.loads((tmp_path / "notice.json").read_text())
    assert (notice["source"], notice["action"], notice["signal"]) == ("aws", "terminate", "SIGUSR1")
    assert notice["deadline_unix"] - notice["received_unix"] == pytest.approx(120.0, abs=3)


def test_second_ctrl_c_kills_the_program_at_once(
    tmp_path: Path, wrapper: Callable[..., Wrapper], wait_for: Wait
) -> None:
    w = wrapper(
        "trap '' TERM\nsleep 1000 & echo $! > child.pid\necho $$ > leader.pid\nwait\n",
        SPOTWISE_GRACE_S="60",
    )
    assert wait_for(lambda: (tmp_path / "leader.pid").exists())
    w.proc.send_signal(signal.SIGINT)  # a notice: the program ignores the SIGTERM it gets
    assert wait_for(lambda: "SIGTERM to the program" in (w.proc.stderr.readline() or "x"))
    w.proc.send_signal(signal.SIGINT)
    code, took, err = w.end()
    assert code == 130, err
    assert took < 30  # not the 60 s grace
    assert not alive(pids(tmp_path / "leader.pid")[0])
    assert not alive(pids(tmp_path / "child.pid")[0])


@pytest.mark.parametrize(
    ("args", "env", "code", "said"),
    [
        (["sh", "-c", "exit 3"], {}, 3, ""),
        (["sh", "-c", "kill -KILL $$"], {}, 137, ""),  # killed by a signal: 128 + its number
        (["no-such-program-xyz"], {}, 127, "cannot start 'no-such-program-xyz'"),
        (["--signal", "KILL", "--", "true"], {}, 2, "--signal 'KILL' cannot be caught"),
        (
            ["true"],
            {"SPOTWISE_NOTICE_FILE": "/proc/no/notice.json"},
            2,
            "SPOTWISE_NOTICE_FILE='/proc/no/notice.json' cannot be written",
        ),
    ],
)
def test_exit_codes_and_bad_input(
    args: list[str], env: dict[str, str], code: int, said: str
) -> None:
    done = subprocess.run(
        [*SPOTWISE, "run", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == code, done.stderr
    assert said in done.stderr
    assert "Traceback" not in done.stderr


def test_signal_names() -> None:
    assert forward_signal("usr1") is forward_signal("SIGUSR1") is signal.SIGUSR1
    with pytest.raises(ConfigError, match="--signal 'TERMINATE' is not a signal name"):
        forward_signal("TERMINATE")
