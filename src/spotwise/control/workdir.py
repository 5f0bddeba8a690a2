"""The job's code on its machines: ``workdir: pack:PATH`` is packed at submit into one
deterministic, content-addressed archive and unpacked on every attempt's machine before the
command runs.

A cloud machine has none of the controller's files, so "the code is at the same path on the
image" holds only for an image built for the job. Packing the directory instead makes the code
that runs exactly the code that was submitted, on every provider, resumes included.

- **What is packed**: in a git repository, ``git ls-files --cached --others --exclude-standard``
  (every ``.gitignore``, ``.git/info/exclude`` and the user's global excludes); elsewhere the
  ``.gitignore`` files found in the tree, read with the subset of gitignore patterns in
  :func:`_pattern` (``#`` comments, ``!`` negation, a trailing ``/`` for directories, a ``/``
  anchoring to the file's folder, ``*``, ``?``, ``[...]``, ``**``). A ``.spotwiseignore`` in
  the workdir (same patterns) leaves out more on top. ``.git/`` is never packed; a symlink is
  kept only when it points inside the workdir.
- **Limit**: :data:`MAX_BYTES` of files (before compression), refused at submit with the size,
  the file count and the largest files.
- **Deterministic**: sorted names, mtime 0, owner 0, modes 0644/0755, gzip without name or
  time: the same tree gives the same sha256, which names the archive (``<sha256>.tar.gz``), so
  an unchanged tree is stored once.
- **From a server's client** (``spotwise.server.uploads``): the client packs here, uploads
  the archive by its digest, and the server stores it as below (``uploaded``), never reading
  the client's folder.
- **Where** (``workdir_home``): beside the job's checkpoints, through the storage seam: the
  controller's ``$SPOTWISE_HOME/workdirs/`` for machines on its host (local, sim, slurm), else
  ``workdirs/`` next to the job's object-store checkpoint directory (``s3://.../workdirs/``).
- **Unpacking** (``python -m spotwise.control.workdir unpack|run``, the one step every
  provider's bootstrap calls): the sha256 is verified before the archive is opened; absolute
  names, ``..``, links pointing out, hard links and special files are refused, then tarfile's
  ``data`` filter extracts; the tree appears at its destination at once (a rename), and a
  destination already holding this digest is kept (a requeued SLURM job).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from spotwise.errors import ConfigError

PACK, REMOTE = "pack:", "remote:"
MAX_BYTES = 100 * 2**20  # of files before compression: code, configs, small assets
ARCHIVES = "workdirs"  # folder of the archives in their store
MARKER = ".spotwise-workdir-sha256"  # in an unpacked tree: the digest it came from
MACHINE_DIR = "/tmp/spotwise-workdir"  # where a cloud machine unpacks it, unless told
IGNORE_FILE = ".spotwiseignore"
_LS_FILES = ("--cached", "--others", "--exclude-standard")  # what git would commit
SHA256 = re.compile(r"[0-9a-f]{64}\Z")


@dataclass(frozen=True)
class CodeArchive:
    """A packed workdir in a store: ``<uri>/<sha256>.tar.gz``."""

    uri: str  # the store's root (``open_storage``)
    sha256: str

    @property
    def key(self) -> str:
        return f"{self.sha256}.tar.gz"

    def __str__(self) -> str:  # how the job store keeps it (``workdir_archive``)
        return f"{self.uri.rstrip('/')}/{self.key}"

    @classmethod
    def parse(cls, text: str) -> CodeArchive:
        uri, _, name = text.rpartition("/")
        return cls(uri, name.removesuffix(".tar.gz"))


def split_workdir(written: str) -> tuple[str, str]:
    """``pack:PATH`` -> ("pack", PATH), ``remote:PATH`` -> ("remote", PATH), else ("", it)."""
    for prefix in (PACK, REMOTE):
        if written.startswith(prefix):
            return prefix[:-1], written[len(prefix) :]
    return "", written


# --- ignore rules ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    base: str  # the folder of the file it came from ('' = the workdir)


def _pattern(line: str, base: str) -> _Rule | None:
    """One gitignore line as a rule (None: blank or comment)."""
    line = line.rstrip("\n").rstrip("\r")
    if not line.strip() or line.startswith("#"):
        return None
    line = line.rstrip(" ") if not line.endswith("\\ ") else line
    negate = line.startswith("!")
    if negate or line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line
    line = line.lstrip("/")
    out, i = "", 0
    while i < len(line):
        c = line[i]
        if line.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif line.startswith("/**", i) and i + 3 == len(line):
            out, i = out + "/.*", i + 3
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[" and (end := line.find("]", i + 2)) != -1:
            body = line[i + 1 : end]
            body = "^" + body[1:] if body[:1] == "!" else body
            out, i = out + "[" + body.replace("\\", "\\\\") + "]", end + 1
        elif c == "\\" and i + 1 < len(line):
            out, i = out + re.escape(line[i + 1]), i + 2
        else:
            out, i = out + re.escape(c), i + 1
    regex = re.compile(out + r"\Z" if anchored else r"(?:.*/)?" + out + r"\Z")
    return _Rule(regex, negate, dir_only, base)


def _rules(text: str, base: str) -> list[_Rule]:
    return [r for line in text.splitlines() if (r := _pattern(line, base)) is not None]


def _ignored(path: str, is_dir: bool, rules: Sequence[_Rule]) -> bool:
    """gitignore's answer for ``path`` (relative, '/'-separated): the last matching rule."""
    verdict = False
    for rule in rules:
        if rule.dir_only and not is_dir:
            continue
        if rule.base and not path.startswith(rule.base + "/"):
            continue
        rel = path[len(rule.base) + 1 :] if rule.base else path
        if rule.regex.match(rel):
            verdict = not rule.negate
    return verdict


def _walk(root: Path, rules: list[_Rule]) -> list[str]:
    """Files under ``root`` not ignored, reading each folder's ``.gitignore`` on the way
    (a folder that is ignored is not entered, as git does)."""
    found: list[str] = []

    def visit(folder: Path, rel: str, inherited: list[_Rule]) -> None:
        here = list(inherited)
        gitignore = folder / ".gitignore"
        if gitignore.is_file() and not gitignore.is_symlink():
            here += _rules(gitignore.read_text(errors="replace"), rel)
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            path = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.name == ".git" or _ignored(path, is_dir, here):
                continue
            if is_dir:
                visit(Path(entry.path), path, here)
            else:
                found.append(path)

    visit(root, "", rules)
    return found


def _git_files(root: Path) -> list[str] | None:
    """What git would commit from ``root`` (tracked and untracked, not ignored); None when
    ``root`` is not in a git work tree or git is missing."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", *_LS_FILES],
            capture_output=True,
            timeout=120,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = {n.decode("utf-8", "surrogateescape") for n in listed.stdout.split(b"\0") if n}
    return sorted(n for n in names if os.path.lexists(root / n))  # (deleted, still indexed)


def list_files(root: Path) -> list[str]:
    """The workdir's files that are packed: relative '/'-separated names, sorted."""
    names = _git_files(root)
    if names is None:
        names = _walk(root, [])
    extra = root / IGNORE_FILE
    if extra.is_file():
        rules = _rules(extra.read_text(errors="replace"), "")
        names = [n for n in names if not _excluded(n, rules)]
    return sorted(n for n in names if not n.startswith(".git/") and n != ".git")


def _excluded(name: str, rules: Sequence[_Rule]) -> bool:
    """A file is left out when it or any folder above it is ignored."""
    parts = name.split("/")
    for k in range(1, len(parts)):
        if _ignored("/".join(parts[:k]), True, rules):
            return True
    return _ignored(name, False, rules)


# --- packing --------------------------------------------------------------------------------
def _size(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} byte" + ("s" if n != 1 else "")
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            break
    return f"{n:,.1f} {unit}"


def _members(root: Path, names: Iterable[str]) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of what is packed: regular files, and symlinks that stay inside."""
    real_root = root.resolve()
    kept = []
    for name in names:
        path = root / name
        st = path.lstat()
        if path.is_symlink():
            target = os.readlink(path)
            inside = (path.parent / target).resolve()
            if os.path.isabs(target) or not inside.is_relative_to(real_root):
                continue  # a link out of the workdir would not exist on the machine
        elif not path.is_file():
            continue  # a submodule's folder, a socket...
        kept.append((name, st))
    return kept


def pack(root: Path, dest: Path, *, limit: int = MAX_BYTES) -> str:
    """Write ``root``'s packed files to ``dest`` (a .tar.gz); return its sha256."""
    members = _members(root, list_files(root))
    total = sum(st.st_size for _, st in members if not _is_link(st))
    if total > limit:
        largest = sorted(members, key=lambda m: -m[1].st_size)[:5]
        shown = ", ".join(f"{n} ({_size(st.st_size)})" for n, st in largest)
        raise ConfigError(
            f"workdir: {root} holds {_size(total)} in {len(members):,} files to pack, over the "
            f"limit of {_size(limit)} (largest: {shown})",
            hint=f"leave out what the machine does not need with a {IGNORE_FILE} in {root} "
            "(.gitignore patterns, e.g. data/ or *.ckpt), or put the code on the image and "
            "write workdir: remote:/path/on/the/machine",
        )
    digest = hashlib.sha256()
    with (
        open(dest, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=_Hashing(raw, digest), mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name, st in members:
            info, data = _entry(root, name, st)
            if data is None:
                tar.addfile(info)
                continue
            with data:
                tar.addfile(info, data)
    return digest.hexdigest()


def _is_link(st: os.stat_result) -> bool:
    return stat.S_ISLNK(st.st_mode)


def _entry(
    root: Path, name: str, st: os.stat_result
) -> tuple[tarfile.TarInfo, io.BufferedReader | None]:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if _is_link(st):
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(root / name), 0o777
        return info, None
    info.size = st.st_size
    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return info, open(root / name, "rb")


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what passes through it."""

    def __init__(self, out: io.BufferedWriter, digest: hashlib._Hash) -> None:
        self._out, self._digest = out, digest

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._digest.update(data)
        return self._out.write(data)


def submit_archive(root: Path, home: str, *, upload: bool = True) -> CodeArchive:
    """Pack ``root`` and store it under ``home`` (kept if that digest is already there);
    without ``upload``, only its name (what ``launch --dry-run`` shows)."""
    with tempfile.TemporaryDirectory(prefix="spotwise-pack-") as tmp:
        packed = Path(tmp) / "workdir.tar.gz"
        archive = CodeArchive(home, pack(root, packed))
        if upload:
            _store(archive, packed)
    return archive


def _store(archive: CodeArchive, packed: Path) -> None:
    """Put ``packed`` in its store unless that digest is already there (content-addressed)."""
    from spotwise.storage import open_storage

    store = open_storage(archive.uri)
    if not store.list(archive.key):
        store.put(archive.key, packed)


def store_uploaded(sha256: str, uploads: Path, home: str) -> CodeArchive:
    """An archive a client packed and uploaded (verified, in ``uploads``, the server's
    ``$SPOTWISE_HOME/workdirs``), stored under ``home`` as :func:`submit_archive` stores one
    packed here."""
    packed = CodeArchive(str(uploads), sha256)
    if home == str(uploads):
        return packed
    archive = CodeArchive(home, sha256)
    _store(archive, uploads / packed.key)
    return archive


# --- unpacking ------------------------------------------------------------------------------
def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unpacked(into: Path, sha256: str) -> bool:
    """``into`` already holds the tree of this digest (a requeued attempt unpacks again)."""
    marker = into / MARKER
    return marker.is_file() and not marker.is_symlink() and marker.read_text().strip() == sha256


def _check_member(m: tarfile.TarInfo) -> str | None:
    """Why ``m`` may not be unpacked (None: it may)."""
    name = PurePosixPath(m.name)
    if m.name.startswith("/") or name.is_absolute() or "\\" in m.name:
        return "an absolute name"
    if any(p == ".." for p in name.parts):
        return "a '..' in its name"
    if m.issym():
        target = PurePosixPath(m.linkname)
        if target.is_absolute():
            return f"a link to an absolute path ({m.linkname})"
        depth = len(name.parts) - 1
        for part in target.parts:
            depth += -1 if part == ".." else 0 if part == "." else 1
            if depth < 0:
                return f"a link out of the workdir ({m.linkname})"
        return None
    if m.islnk():
        return "a hard link"
    if not (m.isfile() or m.isdir()):
        return "a special file (device, fifo)"
    return None


def checked_members(tar: tarfile.TarFile, limit: int = MAX_BYTES) -> list[tarfile.TarInfo]:
    """The archive's members, once none is refused (:func:`_check_member`) and they hold at
    most ``limit`` bytes. Raises ``ConfigError`` naming what was refused."""
    members = tar.getmembers()
    total = 0
    for m in members:
        why = _check_member(m)
        if why is not None:
            raise ConfigError(f"workdir archive: {m.name!r} is {why}: refused")
        total += m.size
    if total > limit:
        raise ConfigError(f"workdir archive: {_size(total)} unpacked, over {_size(limit)}")
    return members


def unpack(archive: Path, sha256: str, into: Path, *, limit: int = MAX_BYTES) -> None:
    """Verify ``archive`` against ``sha256`` and unpack it at ``into`` (absent or empty; one
    already holding this digest is kept). Raises ``ConfigError`` naming what was refused."""
    if not SHA256.match(sha256):
        raise ConfigError(f"workdir archive: {sha256!r} is not a sha256 digest")
    if _unpacked(into, sha256):
        return
    got = _file_sha256(archive)
    if got != sha256:
        raise ConfigError(
            f"workdir archive: sha256 {got} is not the submitted {sha256}: refused",
            hint="the stored archive changed after submit; submit the job again",
        )
    into.parent.mkdir(parents=True, exist_ok=True)
    if into.exists() and (into.is_symlink() or not into.is_dir() or any(into.iterdir())):
        raise ConfigError(
            f"workdir: {into} exists and is not empty; the code is unpacked into an empty folder"
        )
    staging = Path(tempfile.mkdtemp(prefix=".spotwise-unpack-", dir=into.parent))
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            tar.extractall(staging, members=checked_members(tar, limit), filter="data")
        (staging / MARKER).write_text(sha256 + "\n")
        if into.exists():
            into.rmdir()
        os.rename(staging, into)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def fetch_and_unpack(archive: CodeArchive, into: Path) -> None:
    """Get the archive from its store and unpack it at ``into`` (see :func:`unpack`)."""
    from spotwise.storage import open_storage

    if _unpacked(into, archive.sha256):  # (no need to fetch it again)
        return
    into.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".spotwise-fetch-", dir=into.parent) as tmp:
        local = Path(tmp) / archive.key
        open_storage(archive.uri).get(archive.key, local)
        unpack(local, archive.sha256, into)


def unpack_argv(archive: CodeArchive, into: str, python: str = "python") -> list[str]:
    """The command that unpacks ``archive`` at ``into`` on a machine (for a bootstrap)."""
    return [python, "-m", "spotwise.control.workdir", "unpack", archive.uri, archive.sha256, into]


def unpack_shell(archive: CodeArchive, into: str, python: str = "python3") -> str:
    """The bootstrap line (POSIX shell) that unpacks ``archive`` at ``into`` and enters it, or
    exits 1 (the reason is on stderr): what a provider's start-up script runs before the
    command."""
    return f"{shlex.join(unpack_argv(archive, into, python))} && cd {shlex.quote(into)} || exit 1"


def run_argv(
    archive: CodeArchive, into: str, argv: Sequence[str], python: str = "python"
) -> list[str]:
    """A command that unpacks ``archive`` at ``into``, enters it and becomes ``argv``: a
    container's command when its runtime gives no shell step (a pod)."""
    unpack = unpack_argv(archive, into, python)
    return [*unpack[:3], "run", *unpack[4:], "--", *argv]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spotwise.control.workdir")
    parser.add_argument("action", choices=["unpack", "run"])
    parser.add_argument("uri", help="the archives' store (a folder or an s3:// URI)")
    parser.add_argument("sha256")
    parser.add_argument("into", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        fetch_and_unpack(CodeArchive(args.uri, args.sha256), args.into)
    except Exception as exc:  # the machine's log says why, the attempt ends as an error
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        print(f"[spotwise] workdir: cannot unpack from {args.uri}: {message}", file=sys.stderr)
        return 1
    if args.action == "unpack":
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs -- COMMAND...")
    os.chdir(args.into)
    sys.stdout.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
