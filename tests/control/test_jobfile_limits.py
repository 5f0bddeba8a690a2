"""Hostile job files: each is refused with one bounded error naming the key, in bounded time."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwise.control.spec import load_spec
from spotwise.control.store import Store
from spotwise.errors import ConfigError

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def _bomb() -> bytes:
    """The billion laughs: nine levels of nine aliases, 9^9 values once expanded."""
    text, previous = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n', "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n"
        previous = name
    return (text + "command: x\nname: *i\n").encode()


def _chain(anchors: int) -> bytes:
    """Each anchor holds the previous one: nesting ``anchors`` deep though the text is flat."""
    lines = ["a0: &a0 [x]", *(f"a{i}: &a{i} [*a{i - 1}]" for i in range(1, anchors))]
    return ("\n".join([*lines, "command: x"]) + "\n").encode()


HOSTILE = {
    "alias-bomb": (_bomb(), ["aliases", "100,000"]),
    "alias-chain-40": (_chain(40), ["aliases", "32 deep"]),
    "alias-chain-3000": (_chain(3000), ["aliases"]),
    "1MB-command": (b'command: "' + b"a" * 1_000_000 + b'"\n', ["command:", "65,536"]),
    "deep-nesting": (
        b"command: x\nprovider: {name: local, options: " + b"[" * 5000 + b"]" * 5000 + b"}\n",
        ["nest"],
    ),
    "windows-1252": ("command: x\nname: caf\xe9\n".encode("latin-1"), ["not UTF-8", "line 2"]),
    "nul-in-workdir": (b'command: x\nworkdir: "a\\0b"\n', ["workdir:", "NUL"]),
    "5000-char-workdir": (b"command: x\nworkdir: " + b"w" * 5000 + b"\n", ["workdir:", "4,096"]),
    "400-digit-deadline": (b"command: x\ndeadline: " + b"9" * 400 + b"\n", ["400 digits"]),
    "400-digit-deadline-string": (
        b'command: x\ndeadline: "' + b"9" * 400 + b's"\n',
        ["deadline:", "10 years"],
    ),
    "nan-duration": (b"command: x\nexpected_runtime: .nan\n", ["expected_runtime", "finite"]),
    "inf-budget": (b"command: x\nbudget: .inf\n", ["budget", "finite"]),
    "null-env": (b"command: x\nenv: {HF_TOKEN: }\n", ["HF_TOKEN", "null", "env_from"]),
    "5MB-name": (b"command: x\nname: " + b"n" * 5_000_000 + b"\n", ["KiB"]),
    "nul-in-env": (b'command: x\nenv: {A: "a\\0b"}\n', ["env.A", "NUL"]),
    "nul-in-command": (b'command: ["x", "a\\0b"]\n', ["command.1", "NUL"]),
    "escape-in-name": (b'command: x\nname: "\\e[2J"\n', ["name", "control character"]),
    "year-0-timestamp": (b"command: x\ndeadline: 0000-01-01T00:00:00Z\n", ["value cannot be"]),
    "5000-digit-int": (b"command: x\nsteps: " + b"1" * 5000 + b"\n", ["5,000 digits"]),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_file_is_one_bounded_error(tmp_path: Path, name: str):
    data, needles = HOSTILE[name]
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        load_spec(path)
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert len(message) < 1000, message[:2000]
    assert "\x00" not in message and "\x1b" not in message
    for needle in needles:
        assert needle in message


def test_utf16_file_from_windows_is_read(tmp_path: Path):
    """Notepad's "Unicode" (UTF-16 with its byte-order mark) and UTF-8 with a BOM."""
    text = "name: windows\ncommand: python train.py --lr 0.1\nenv: {NOTE: café}\n"
    for encoding in ("utf-16", "utf-8-sig"):
        path = tmp_path / f"{encoding}.yaml"
        path.write_bytes(text.encode(encoding))
        spec = load_spec(path)
        assert spec.name == "windows" and spec.env == {"NOTE": "café"}


def test_cli_refuses_hostile_files_without_a_traceback_or_a_job(tmp_path: Path):
    """Through the real CLI: exit 2, one error naming the key, nothing recorded."""
    for name in ("alias-bomb", "nul-in-env", "null-env"):
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(HOSTILE[name][0])
        out = subprocess.run(
            [*SPOTWISE, "launch", str(path)], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 2, out.stderr[-2000:]
        assert out.stderr.startswith("error:") and "Traceback" not in out.stderr
        assert len(out.stderr) < 1000
        for needle in HOSTILE[name][1]:
            assert needle in out.stderr
    assert Store().jobs() == []
