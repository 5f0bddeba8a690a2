"""Each machine of the loopback doubles (an EC2 instance, a pod) in a root directory of its own.

On a cloud, what a machine writes anywhere but its object store or volume is lost with it, and
the controller's files are on another computer. A double whose machines are plain local
processes hides every bug of that kind (a checkpoint written to the controller's own path
"resumes" fine), so a machine here starts in a mount namespace whose root is a fresh tmpfs
holding only:

- the system (``/usr``, ``/etc``, ``/opt`` read-only; ``/dev``, ``/proc``, ``/sys``);
- the *image*, the software an AMI or container image carries: this Python (virtualenv and
  base), spotwise and the job's code (the repository checkout), each as a copy-on-write layer
  (overlayfs on the tmpfs: writable, the writes lost with the machine; read-only where
  overlayfs is unavailable);
- the machine's volumes (a pod's claim) at their mount paths, read-write: what outlives it;
- an empty ``HOME`` (``/root``), ``/tmp`` and working directory.

The controller's ``SPOTWISE_HOME``, its job and run directories and a test's temporary
directories do not exist there (``hide`` and this process's ``SPOTWISE_HOME`` are masked
should they lie inside the image). The namespace
and its tmpfs end with the machine's last process.

That needs root (CAP_SYS_ADMIN), as here and in CI. Without it, ``isolated()`` is False and a
machine gets the weaker fallback: a fresh working directory and HOME of its own, removed when
it ends (``discard``), on the host's file system.

Run as a script (``python -I -S machine_root.py SPEC -- ARGV``) this file is the step inside
the new namespace, before the machine's command: standard library only.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
SYSTEM = ("usr", "etc", "opt")  # bound read-only: the operating system of the machine
KERNEL = ("dev", "proc", "sys")  # bound as they are
MACHINE_HOME = "/root"


def python_image() -> tuple[str, ...]:
    """The software every machine runs: this interpreter's virtualenv and base installation,
    the PYTHONPATH entries and spotwise itself (as an AMI with the job's environment would)."""
    import spotwise

    paths = [sys.prefix, sys.base_prefix, str(Path(spotwise.__file__).resolve().parents[1])]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return tuple(dict.fromkeys(os.path.abspath(p) for p in paths))


def machine_image(code: Sequence[Path] | None = None) -> tuple[str, ...]:
    """This Python and spotwise plus the job's ``code`` (default: the working directory)."""
    paths = [Path.cwd()] if code is None else code
    return (*python_image(), *(str(Path(p).resolve()) for p in paths))


@functools.cache
def isolated() -> bool:
    """Whether machines get their own root (a mount namespace can be made here)."""
    probe = subprocess.run(
        [sys.executable, "-I", "-S", __file__, "--probe"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


def start(
    argv: Sequence[str],
    *,
    machine_dir: Path,
    image: Sequence[str],
    env: Mapping[str, str],
    volumes: Mapping[str, Path] | None = None,
    hide: Sequence[Path] = (),
    cwd: str | None = None,
    stdout: IO[bytes] | int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as a machine (its own session, so its process group is the machine).

    ``machine_dir``: an empty host directory of this machine alone. ``cwd``: where the
    command starts (created empty if the image lacks it, as a container runtime does; default
    the machine's HOME). ``volumes``: path on the machine -> host directory (isolated only; the
    fallback has the host's paths)."""
    from spotwise.settings import home as spotwise_home  # (hidden too, were it in the image)

    machine_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env)
    if isolated():
        env.setdefault("HOME", MACHINE_HOME)
        spec: dict[str, Any] = {
            "root": str(machine_dir / "root"),
            "layers": str(machine_dir / "layers"),
            "image": list(image),
            "volumes": {k: str(v) for k, v in (volumes or {}).items()},
            "hide": [str(h) for h in (*hide, spotwise_home())],
            "cwd": cwd or env["HOME"],
            "home": env["HOME"],
        }
        for name in ("root", "layers"):
            (machine_dir / name).mkdir(exist_ok=True)
        return _start_isolated(argv, spec, env, stdout)
    home = machine_dir / "home"
    home.mkdir(exist_ok=True)
    env.setdefault("HOME", str(home))
    if cwd is not None:
        Path(cwd).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        list(argv),
        cwd=cwd or home,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _start_isolated(
    argv: Sequence[str], spec: dict[str, Any], env: dict[str, str], stdout: IO[bytes] | int | None
) -> subprocess.Popen[bytes]:
    """Start this file as the machine's root (``spec``), which then runs ``argv``; returns once
    the command runs (as Popen does): a notice sent before would find the machine still building
    its root, not the command (the pipe closes on its exec)."""
    booted, booted_fd = os.pipe()
    spec = {"booted_fd": booted_fd, **spec}
    try:
        wrapped = [sys.executable, "-I", "-S", __file__, json.dumps(spec), "--", *argv]
        proc = subprocess.Popen(
            wrapped,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(booted_fd,),
        )
    except BaseException:
        os.close(booted)
        raise
    finally:
        os.close(booted_fd)
    with os.fdopen(booted, "rb") as pipe:
        pipe.read()
    return proc


def discard(machine_dir: Path) -> None:
    """The machine is gone: so is what it wrote on its own disk (the fallback's HOME)."""
    shutil.rmtree(machine_dir, ignore_errors=True)


# --- inside the new mount namespace (standard library only) ---------------------------------
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    libc = _libc()
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data or None)]
    if libc.mount(enc[0], enc[1], enc[2], flags, enc[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _private_namespace() -> None:
    if _libc().unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the host


def _bind(source: str, target: str, *, read_only: bool) -> None:
    _mount(source, target, None, MS_BIND | MS_REC)
    if read_only:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def _inside(path: str, root: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _layer(source: str, target: str, scratch: str) -> None:
    """``source`` at ``target``, writable with the writes on the tmpfs (read-only if the
    kernel has no overlayfs here)."""
    upper, work = os.path.join(scratch, "upper"), os.path.join(scratch, "work")
    os.makedirs(upper)
    os.makedirs(work)
    try:
        _mount(
            "overlay", target, "overlay", 0, f"lowerdir={source},upperdir={upper},workdir={work}"
        )
    except OSError:
        _bind(source, target, read_only=True)


def _build_root(spec: dict[str, Any]) -> None:
    root, layers = spec["root"], spec["layers"]
    _mount("machine", root, "tmpfs", 0, "mode=0755")
    _mount("layers", layers, "tmpfs", 0, "mode=0700")
    for entry in os.scandir("/"):
        target = os.path.join(root, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            os.mkdir(target, 0o755)
            if entry.name in SYSTEM or entry.name in KERNEL:
                _bind(entry.path, target, read_only=entry.name in SYSTEM)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    done: list[str] = []
    for n, path in enumerate(sorted(spec["image"], key=len)):
        real = os.path.realpath(path)
        if not os.path.isdir(real) or any(real == d or real.startswith(d + "/") for d in done):
            continue
        target = _inside(real, root)
        os.makedirs(target, exist_ok=True)
        _layer(real, target, os.path.join(layers, str(n)))
        done.append(real)
    for path in spec["image"]:  # the image's own names for them (a virtualenv's symlink)
        link = _inside(path, root)
        if os.path.realpath(path) != path and not os.path.lexists(link):
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.realpath(path), link)
    for path in spec["hide"]:
        target = _inside(os.path.realpath(path), root)
        if os.path.isdir(target):
            _mount("hidden", target, "tmpfs", 0, "mode=0700")
    for at, host in spec["volumes"].items():
        target = _inside(at, root)
        os.makedirs(target, exist_ok=True)
        _bind(host, target, read_only=False)
    for path in (spec["home"], spec["cwd"]):
        os.makedirs(_inside(path, root), exist_ok=True)


def _enter(spec: dict[str, Any], argv: list[str]) -> None:
    """Build the machine's root in a new mount namespace, enter it, become the command."""
    os.set_inheritable(spec["booted_fd"], False)  # closed by the exec: the machine runs
    _private_namespace()
    _build_root(spec)
    os.chroot(spec["root"])
    os.chdir(spec["cwd"])
    os.execvpe(argv[0], argv, os.environ)


def _probe() -> int:
    try:
        _private_namespace()
        _mount("probe", "/tmp", "tmpfs", 0, "mode=0700")
    except OSError:
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--probe"]:
        sys.exit(_probe())
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: machine_root.py SPEC_JSON -- ARGV...")
    try:
        _enter(json.loads(sys.argv[1]), sys.argv[3:])
    except OSError as exc:  # the machine cannot boot: say why on its console
        print(f"machine root: {exc}", file=sys.stderr)
        sys.exit(125)
