"""``workdir: pack:PATH``: what is packed (git's view, a .gitignore subset, .spotwiseignore),
the size limit, the digest of a tree, and archives that are refused on the machine."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from spotwise.control.spec import parse_spec
from spotwise.control.workdir import (
    MARKER,
    CodeArchive,
    fetch_and_unpack,
    list_files,
    pack,
    unpack,
)
from spotwise.errors import ConfigError


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PROJECT = {
    "train.py": "print('hi')\n",
    "pkg/model.py": "W = 1\n",
    "pkg/__pycache__/model.cpython-311.pyc": "bytecode",
    "data/big.bin": "x" * 100,
    "data/keep.txt": "kept by a negation",
    "logs/run.log": "log",
    "notes.tmp": "scratch",
    "sub/.gitignore": "local.cfg\n",
    "sub/local.cfg": "only here",
    "sub/other.cfg": "packed",
    "secret.env": "TOKEN=1",
    ".gitignore": "__pycache__/\n*.tmp\n/logs/\ndata/*\n!data/keep.txt\n# a comment\n\n",
    ".spotwiseignore": "secret.env\n",
}
PACKED = [
    ".gitignore",
    ".spotwiseignore",
    "data/keep.txt",
    "pkg/model.py",
    "sub/.gitignore",
    "sub/other.cfg",
    "train.py",
]


def test_gitignore_subset_and_spotwiseignore_outside_git(tmp_path: Path):
    root = _tree(tmp_path / "proj", PROJECT)
    assert list_files(root) == PACKED


def test_git_repository_lists_what_git_would_commit(tmp_path: Path):
    root = _tree(tmp_path / "proj", PROJECT)
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (root / "train.py").unlink()  # deleted but still in the index: nothing to pack
    (root / ".git" / "info" / "exclude").write_text("pkg/\n")  # git's own excludes apply
    assert list_files(root) == [n for n in PACKED if n not in ("pkg/model.py", "train.py")]


def test_same_tree_same_digest_and_a_change_changes_it(tmp_path: Path):
    a = _tree(tmp_path / "a", PROJECT)
    b = _tree(tmp_path / "b", dict(reversed(PROJECT.items())))  # other order, other times
    os.utime(b / "train.py", (1, 1))
    (b / "train.py").chmod(0o600)  # not executable either way: the same mode in the archive
    sha_a, sha_b = pack(a, tmp_path / "a.tgz"), pack(b, tmp_path / "b.tgz")
    assert sha_a == sha_b == hashlib.sha256((tmp_path / "a.tgz").read_bytes()).hexdigest()
    (b / "train.py").write_text("print('changed')\n")
    assert pack(b, tmp_path / "c.tgz") != sha_a


def test_over_the_limit_is_refused_with_its_size_and_largest_file(tmp_path: Path):
    root = _tree(tmp_path / "proj", {"train.py": "x"})
    with open(root / "weights.bin", "wb") as f:  # sparse: 150 MiB without writing them
        f.truncate(150 * 2**20)
    with pytest.raises(ConfigError) as err:
        pack(root, tmp_path / "out.tgz")
    text = str(err.value)
    assert text.startswith("workdir: ") and "150.0 MiB in 2 files" in text
    assert "limit of 100.0 MiB" in text and "weights.bin (150.0 MiB)" in text
    assert ".spotwiseignore" in err.value.hint
    (root / ".spotwiseignore").write_text("*.bin\n")  # the fix the message names
    pack(root, tmp_path / "out.tgz")


def test_round_trip_and_links(tmp_path: Path):
    root = _tree(tmp_path / "proj", {"train.py": "print(1)\n", "run.sh": "#!/bin/sh\n"})
    (root / "run.sh").chmod(0o755)
    os.symlink("train.py", root / "main.py")  # inside: kept
    os.symlink("/etc/passwd", root / "passwd")  # out of the workdir: left out
    os.symlink("../elsewhere", root / "up")
    archive = tmp_path / "a.tgz"
    sha = pack(root, archive)
    into = tmp_path / "machine" / "workdir"
    unpack(archive, sha, into)
    assert sorted(p.name for p in into.iterdir()) == [MARKER, "main.py", "run.sh", "train.py"]
    assert (into / "main.py").read_text() == "print(1)\n" and os.access(into / "run.sh", os.X_OK)
    unpack(archive, sha, into)  # already there (a requeued attempt): kept as it is


def test_fetch_from_a_store_verifies_the_digest(tmp_path: Path):
    root = _tree(tmp_path / "proj", {"train.py": "print(1)\n"})
    store = tmp_path / "store"
    store.mkdir()
    sha = pack(root, store / "x.tgz")
    (store / "x.tgz").rename(store / f"{sha}.tar.gz")
    fetch_and_unpack(CodeArchive(str(store), sha), tmp_path / "m1")
    assert (tmp_path / "m1" / "train.py").exists()
    (store / f"{sha}.tar.gz").write_bytes(b"tampered")
    with pytest.raises(ConfigError, match="is not the submitted"):
        fetch_and_unpack(CodeArchive(str(store), sha), tmp_path / "m2")
    assert not (tmp_path / "m2").exists()


def _hostile(tmp_path: Path, build) -> tuple[Path, str]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        build(tar)
    path = tmp_path / "evil.tgz"
    path.write_bytes(buf.getvalue())
    return path, hashlib.sha256(buf.getvalue()).hexdigest()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, io.BytesIO(data)


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _special(name: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    return info


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([_file("/etc/evil")], "an absolute name"),
        ([_file("../evil")], "'..'"),
        ([_file("a/../../evil")], "'..'"),
        ([_link("ln", "/etc/passwd", tarfile.SYMTYPE)], "a link to an absolute path"),
        ([_link("a/ln", "../../x", tarfile.SYMTYPE)], "a link out of the workdir"),
        ([_file("t"), _link("h", "t", tarfile.LNKTYPE)], "a hard link"),
        ([_special("dev", tarfile.CHRTYPE)], "a special file"),
        ([_special("fifo", tarfile.FIFOTYPE)], "a special file"),
    ],
)
def test_hostile_archives_are_refused_and_nothing_is_unpacked(tmp_path: Path, members, why):
    def build(tar: tarfile.TarFile) -> None:
        for m in members:
            tar.addfile(*m) if isinstance(m, tuple) else tar.addfile(m)

    archive, sha = _hostile(tmp_path, build)
    into = tmp_path / "machine" / "workdir"
    with pytest.raises(ConfigError, match="refused") as err:
        unpack(archive, sha, into)
    assert why in str(err.value)
    assert not into.exists() and list((tmp_path / "machine").iterdir()) == []


def test_job_file_forms(tmp_path: Path):
    _tree(tmp_path / "code", {"train.py": ""})
    spec = parse_spec({"command": "x", "workdir": "pack:code"}, base_dir=tmp_path)
    assert spec.workdir == f"pack:{tmp_path / 'code'}"
    assert parse_spec({"command": "x", "workdir": "remote:/app"}).workdir == "remote:/app"
    assert parse_spec({"command": "x"}, base_dir=tmp_path).workdir == str(tmp_path)
    with pytest.raises(ConfigError, match=r"workdir: .* does not exist"):
        parse_spec({"command": "x", "workdir": "pack:nowhere"}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="not an absolute path on the machine"):
        parse_spec({"command": "x", "workdir": "remote:app"})


def test_archives_go_beside_the_checkpoints(tmp_path: Path):
    from spotwise.control.providers.base import CheckpointHome, Features
    from spotwise.control.workdir_home import archive_home

    here = Features(zones=("local",))
    assert archive_home(here, None, tmp_path / "workdirs") == str(tmp_path / "workdirs")
    s3 = CheckpointHome(default="s3://b/jobs/{job_id}/checkpoint", durable=("s3://",), hint="")
    cloud = Features(zones=("z",), same_host=False, checkpoints=s3)
    assert archive_home(cloud, None, tmp_path) == "s3://b/jobs/workdirs"
    assert archive_home(cloud, "s3://b/runs/exp1/", tmp_path) == "s3://b/runs/workdirs"
    assert archive_home(cloud, "s3://b", tmp_path) == "s3://b/workdirs"
    volume = CheckpointHome(default="/checkpoints/{job_id}", durable=("/checkpoints/",), hint="")
    pod = Features(zones=("z",), same_host=False, checkpoints=volume)
    assert archive_home(pod, None, tmp_path) is None  # the controller cannot write there


def test_launch_refuses_a_workdir_over_the_limit_and_records_nothing(tmp_path: Path):
    from spotwise.control.store import Store
    from spotwise.control.submission import submit

    code = _tree(tmp_path / "code", {"train.py": "x"})
    with open(code / "dataset.bin", "wb") as f:
        f.truncate(101 * 2**20)
    spec = parse_spec({"command": "python train.py", "workdir": "pack:code"}, base_dir=tmp_path)
    store = Store(tmp_path / "home")
    try:
        with pytest.raises(ConfigError, match=r"^workdir: .* holds 101\.0 MiB in 2 files"):
            submit(store, spec)
        assert store.jobs() == [] and not (tmp_path / "home" / "workdirs").exists()
        (code / "dataset.bin").unlink()
        job = submit(store, spec)  # stored once, named by its digest
        [archive] = (tmp_path / "home" / "workdirs").iterdir()
        assert job.spec["workdir_archive"] == str(archive)
    finally:
        store.close()
