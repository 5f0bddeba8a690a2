"""Damaged and hostile checkpoints, mutated at random (hypothesis) in a real run directory.

Every example copies a run directory written by real training (checkpoints at steps 5, 10, 15)
next to a copy of a valid checkpoint *outside* it, mutates the newest checkpoint, and checks:

- ``verify_checkpoint``, ``load_checkpoint`` and ``list_checkpoints(deep=True)`` agree;
- resuming with ``Run`` uses step 15 only if it is valid and fits, else falls back to step 10
  with a warning naming step 15, and in either case finishes bit-identical to a run that was
  never damaged (unless the mutation itself rewrote training state consistently);
- nothing hangs (a per-test timeout; FIFOs are opened non-blocking or not at all);
- nothing outside the run directory is read or written: content, mtime and atime of every file
  there are unchanged (atime is set older than mtime first, so under ``relatime`` a read would
  move it).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spotwise.checkpoint.format import MANIFEST, STATE_FILE, TENSORS_FILE, step_dir_name
from spotwise.checkpoint.retention import RetentionPolicy, retain
from spotwise.checkpoint.write import clean_temporaries
from spotwise.cli.main import app
from spotwise.errors import CorruptCheckpointError, StateMismatchError
from spotwise.runtime import CheckpointConfig, Run
from spotwise.runtime.commit import (
    list_checkpoints,
    load_checkpoint,
    verify_checkpoint,
    write_checkpoint,
)

pytestmark = pytest.mark.timeout(120)
NEWEST, PREVIOUS = step_dir_name(15), step_dir_name(10)
FILES = (TENSORS_FILE, STATE_FILE, MANIFEST)
EXAMPLES = settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


_TEMPLATE: dict[str, tuple[Path, str]] = {}  # built once per session (the trainer fixture is
# function-scoped, so a module-scoped fixture cannot use it)


@pytest.fixture()
def template(trainer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A real run directory (checkpoints 5, 10, 15) and the weights of an uninterrupted run."""
    if not _TEMPLATE:
        root = tmp_path_factory.mktemp("hostile")
        reference = trainer(root / "reference", 15, checkpoint=CheckpointConfig(every=None))
        trainer(root / "run", 15)
        _TEMPLATE["run"] = (root / "run", reference.weights)
    return _TEMPLATE["run"]


# --- helpers -----------------------------------------------------------------------------------
class Example:
    """One fresh copy of the template: ``run`` (the run directory) and ``outside`` (a valid
    checkpoint and a canary manifest next to it, which nothing may read or write)."""

    def __init__(self, base: Path, template: Path) -> None:
        self.base = base
        self.run = base / "run"
        shutil.copytree(template, self.run, symlinks=True)
        self.outside = base / "outside"
        shutil.copytree(template / NEWEST, self.outside / NEWEST)
        (self.outside / "canary").mkdir()
        (self.outside / "canary" / MANIFEST).write_text('{"canary": true}')
        self.newest = self.run / NEWEST
        self._seen = self._snapshot()

    def _snapshot(self) -> dict[str, tuple[bytes, int, int]]:
        seen = {}
        for path in sorted(self.outside.rglob("*")):
            if path.is_file() and not path.is_symlink():
                st_ = path.stat()
                os.utime(path, ns=(st_.st_mtime_ns - 10**10, st_.st_mtime_ns))
                after = path.stat()
                seen[str(path)] = (path.read_bytes(), after.st_mtime_ns, after.st_atime_ns)
                os.utime(path, ns=(after.st_atime_ns, after.st_mtime_ns))  # undo our own read
        return seen

    def assert_outside_untouched(self) -> None:
        now = {}
        for name, (_, mtime, atime) in self._seen.items():
            st_ = os.stat(name)
            now[name] = (mtime == st_.st_mtime_ns, atime == st_.st_atime_ns)
        assert all(a and b for a, b in now.values()), f"read or written outside: {now}"
        for name, (content, _, _) in self._seen.items():
            assert Path(name).read_bytes() == content


@contextmanager
def fresh_copy(template: Path) -> Iterator[Example]:
    base = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        yield Example(base, template)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def resign(ckpt: Path, name: str) -> None:
    """Recompute the manifest entry of ``name``, so only the structural checks can object."""
    manifest = json.loads((ckpt / MANIFEST).read_text())
    data = (ckpt / name).read_bytes()
    manifest["files"][name] = {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))


def verdict_agrees(ex: Example) -> bool:
    """verify, load and list give one verdict on the newest checkpoint; returns it."""
    info = verify_checkpoint(ex.newest)
    try:
        load_checkpoint(ex.newest)
        loads = True
    except CorruptCheckpointError:
        loads = False
    listed = {c.step: c.valid for c in list_checkpoints(ex.run, deep=True)}
    assert info.valid == loads == listed.get(15, False), (info, loads, listed)
    assert info.valid or info.problem
    return info.valid


def resume_and_finish(
    ex: Example, trainer: Callable[..., Any], weights: str, valid: bool, same_content: bool = True
) -> int:
    """Resume the mutated run dir and train to the end; returns the step it resumed from."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = trainer(ex.run, 15)  # from step 10: trains 5 steps and saves step 15 again
    resumed = done.run.resumed_from.step
    assert resumed in (10, 15)
    if not valid:
        assert resumed == 10
    if resumed == 10:
        assert any(NEWEST in str(w.message) for w in caught), [str(w.message) for w in caught]
    if resumed == 10 or same_content:
        assert done.weights == weights
    retain(ex.run, RetentionPolicy(keep_last=1))
    clean_temporaries(ex.run)
    ex.assert_outside_untouched()
    return resumed


# --- byte-level damage -------------------------------------------------------------------------
@EXAMPLES
@given(
    name=st.sampled_from(FILES),
    where=st.floats(0, 1),
    xor=st.integers(1, 255),
    truncate=st.booleans(),
    consistent=st.booleans(),
)
def test_byte_flips_and_truncation(
    template: Any, trainer: Any, name: str, where: float, xor: int, truncate: bool, consistent: bool
) -> None:
    run, weights = template
    with fresh_copy(run) as ex:
        path = ex.newest / name
        data = bytearray(path.read_bytes())
        pos = min(int(where * len(data)), len(data) - 1)
        if truncate:
            del data[pos:]
        else:
            data[pos] ^= xor
        path.write_bytes(bytes(data))
        if consistent and name != MANIFEST:
            resign(ex.newest, name)
        valid = verdict_agrees(ex)
        if not consistent:
            assert not valid or name == MANIFEST  # a checksum catches every data change
        resume_and_finish(ex, trainer, weights, valid, same_content=not consistent)


@EXAMPLES
@given(length=st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 4096)))
def test_safetensors_header_length_field(template: Any, trainer: Any, length: int) -> None:
    run, weights = template
    with fresh_copy(run) as ex:
        path = ex.newest / TENSORS_FILE
        data = path.read_bytes()
        original = int.from_bytes(data[:8], "little")
        path.write_bytes(length.to_bytes(8, "little") + data[8:])
        resign(ex.newest, TENSORS_FILE)
        valid = verdict_agrees(ex)
        assert valid == (length == original)
        resume_and_finish(ex, trainer, weights, valid)


# --- manifest fields ---------------------------------------------------------------------------
HOSTILE_NAMES = [
    "a\x00b",
    "../manifest.json",
    "/etc/passwd",
    "..",
    ".",
    "",
    "x/y",
    "a" * 300,
    ".hidden",
    MANIFEST,
    "\\evil",
]
HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from([*HOSTILE_NAMES, "x" * 5000]),
    st.just({}),
    st.just([]),
    st.integers(2, 5000).map(lambda depth: ("nest", depth)),
)
FIELDS = [
    "format",
    "version",
    "step",
    "wall_time",
    "metrics",
    "metrics.loss",
    "files",
    f"files.{TENSORS_FILE}",
    f"files.{TENSORS_FILE}.size",
    f"files.{STATE_FILE}.crc32c",
    f"files.{STATE_FILE}.size",
]


def set_field(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".", 2) if dotted.startswith("files.") else dotted.split(".")
    if dotted.startswith("files.") and dotted.count(".") > 2:  # file names contain dots
        head, rest = dotted[len("files.") :].rsplit(".", 1)
        parents, last = ["files", head], rest
    target = doc
    for key in parents:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[last] = value


@EXAMPLES
@given(
    field=st.sampled_from(FIELDS),
    value=HOSTILE_VALUES,
    rename=st.one_of(st.none(), st.sampled_from(HOSTILE_NAMES), st.text(max_size=6)),
)
# the reported ones: a RecursionError, a non-numeric wall_time, a NUL in a file name, no files
@example(field="metrics", value=("nest", 5000), rename=None)
@example(field="wall_time", value="yesterday", rename=None)
@example(field="wall_time", value=None, rename="a\x00b")
@example(field="files", value={}, rename=None)
@example(field="step", value=2**70, rename=None)
@example(field=f"files.{TENSORS_FILE}.size", value=-1, rename=None)
def test_manifest_field_mutations(
    template: Any, trainer: Any, field: str, value: Any, rename: str | None
) -> None:
    run, weights = template
    with fresh_copy(run) as ex:
        doc = json.loads((ex.newest / MANIFEST).read_text())
        nest = value[1] if isinstance(value, tuple) else None
        set_field(doc, field, "__NEST__" if nest else value)
        if rename is not None and isinstance(doc.get("files"), dict) and doc["files"]:
            doc["files"][rename] = doc["files"].pop(next(iter(doc["files"])))
        text = json.dumps(doc)
        if nest:
            text = text.replace('"__NEST__"', "[" * nest + "]" * nest)
        (ex.newest / MANIFEST).write_text(text)
        valid = verdict_agrees(ex)
        if nest or rename in HOSTILE_NAMES or field in ("files", "format"):
            assert not valid or (field == "format" and value == "spotwise-checkpoint")
        resume_and_finish(ex, trainer, weights, valid)


# --- special files -----------------------------------------------------------------------------
def make_special(path: Path, kind: str, ex: Example) -> None:
    """Replace ``path`` (a file or the step directory) with a special file of ``kind``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    is_dir = path == ex.newest
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        except PermissionError:
            os.mkfifo(path)  # no CAP_MKNOD here: a FIFO is the other special file that blocks
    elif kind == "symlink-out":  # to a valid copy of the same checkpoint outside the run dir
        target = ex.outside / NEWEST
        path.symlink_to(target if is_dir else target / path.name)
    elif kind == "symlink-in":  # to the same file of the previous checkpoint
        target = ex.run / PREVIOUS
        path.symlink_to(target if is_dir else target / path.name)


@pytest.mark.parametrize("target", [*FILES, "step directory"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "symlink-out", "symlink-in"])
def test_special_files(template: Any, trainer: Any, target: str, kind: str) -> None:
    run, weights = template
    with fresh_copy(run) as ex:
        path = ex.newest if target == "step directory" else ex.newest / target
        make_special(path, kind, ex)
        assert not verdict_agrees(ex)
        result = CliRunner().invoke(app, ["ckpt", "verify", str(ex.run), "--json"])
        assert result.exit_code == 1, result.output
        report = json.loads(result.output)
        assert [c["valid"] for c in report["checkpoints"]] == [True, True, False]
        resume_and_finish(ex, trainer, weights, valid=False)


# --- consistent-checksum content swaps ---------------------------------------------------------
def model_tensor(tensors: dict[str, torch.Tensor], pick: int) -> str:
    names = sorted(n for n in tensors if n.startswith("state/model/"))
    return names[pick % len(names)]


SWAPS: dict[str, Callable[[dict[str, torch.Tensor], dict[str, Any], int], None]] = {
    "dtype": lambda t, s, i: t.__setitem__(
        n := model_tensor(t, i), t[n].to([torch.float64, torch.float16, torch.bfloat16][i % 3])
    ),
    "shape": lambda t, s, i: t.__setitem__(n := model_tensor(t, i), t[n].reshape(-1)[1:]),
    "drop-tensor": lambda t, s, i: t.pop(sorted(t)[i % len(t)]),
    "drop-model-key": lambda t, s, i: s["state"]["model"].pop(
        sorted(s["state"]["model"])[i % len(s["state"]["model"])]
    ),
    "empty-state": lambda t, s, i: s.clear(),
    "no-run-state": lambda t, s, i: s.pop("spotwise"),
    "step-counter": lambda t, s, i: s["spotwise"].__setitem__("step", [99, "x", -1, None][i % 4]),
    "models-not-dict": lambda t, s, i: s.__setitem__("state", [1, 2]),
    "optimizer-groups": lambda t, s, i: s["state"]["optimizer"]["param_groups"][0]["params"].pop(),
    "bad-reference": lambda t, s, i: s["state"]["model"].__setitem__(
        sorted(s["state"]["model"])[0], {"__tensor__": [1, 2]}
    ),
}


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_consistent_checksum_content_swaps(template: Any, trainer: Any, swap: str) -> None:
    pick = 1  # which tensor or key the swap changes
    run, weights = template
    with fresh_copy(run) as ex:
        loaded = load_checkpoint(ex.newest)
        tensors = {n: t.clone() for n, t in loaded.tensors.items()}
        state = json.loads(json.dumps(loaded.state))
        SWAPS[swap](tensors, state, pick)
        rebuilt = write_checkpoint(
            ex.base / "rebuilt",
            15,
            tensors,
            json.dumps(state).encode(),
            metrics=loaded.info.metrics,
        )
        shutil.rmtree(ex.newest)
        os.rename(rebuilt.path, ex.newest)
        verdict_agrees(ex)
        assert resume_and_finish(ex, trainer, weights, valid=True) == 10


# --- deterministic cases -------------------------------------------------------------------
def test_a_sparse_tensor_file_larger_than_memory_is_refused_unread(
    template: Any, trainer: Any
) -> None:
    run, weights = template
    with fresh_copy(run) as ex:
        size = 2 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        header = b""
        for _ in range(2):  # the data size depends on the header's length, and back
            n = size - 8 - len(header)
            header = json.dumps({"x": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}})
            header = header.encode()
        with open(ex.newest / TENSORS_FILE, "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header)
            f.truncate(size)  # a hole: no disk space, and reading it would never end in time
        manifest = json.loads((ex.newest / MANIFEST).read_text())
        manifest["files"][TENSORS_FILE]["size"] = size
        del manifest["files"][TENSORS_FILE]["header_crc32c"]  # a writer that keeps no record
        (ex.newest / MANIFEST).write_text(json.dumps(manifest))
        assert list_checkpoints(ex.run)[-1].valid  # without --deep: header and size are fine
        assert "more than this machine's" in (verify_checkpoint(ex.newest).problem or "")
        assert not verdict_agrees(ex)
        resume_and_finish(ex, trainer, weights, valid=False)


def test_retention_and_cleanup_never_follow_links_out(template: Any, trainer: Any) -> None:
    run, weights = template
    with fresh_copy(run) as ex:
        shutil.rmtree(ex.run / step_dir_name(5))
        (ex.run / step_dir_name(5)).symlink_to(ex.outside / NEWEST)  # valid, outside, older
        (ex.run / step_dir_name(7)).symlink_to(ex.outside / "canary")
        (ex.run / ".tmp-step-00000016-deadbeef").symlink_to(ex.outside / "canary")
        (ex.run / ".trash-step-00000015-deadbeef").symlink_to(ex.outside / NEWEST)
        listed = {c.step: c for c in list_checkpoints(ex.run, deep=True)}
        assert not listed[5].valid and "symbolic link" in (listed[5].problem or "")
        assert resume_and_finish(ex, trainer, weights, valid=True) == 15
        left = sorted(p.name for p in ex.run.iterdir() if p.name.startswith(("step-", ".")))
        assert left == [".lock", NEWEST]  # the links themselves are gone
        assert (ex.outside / "canary" / MANIFEST).exists()
        assert verify_checkpoint(ex.outside / NEWEST).valid


def _linear(groups: int) -> tuple[torch.nn.Linear, torch.optim.SGD]:
    """A model and an optimizer with its parameters in one or two groups."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    params = [[model.weight], [model.bias]] if groups == 2 else [[model.weight, model.bias]]
    return model, torch.optim.SGD([{"params": p} for p in params], lr=0.1, momentum=0.9)


def test_when_no_checkpoint_fits_run_raises_and_leaves_objects_untouched(tmp_path: Path) -> None:
    model, optimizer = _linear(groups=2)
    run = Run(tmp_path, state={"model": model, "optimizer": optimizer}, steps=6,
              checkpoint=CheckpointConfig(every=2), notices=None)  # fmt: skip
    for _ in run:
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 4, 6]
    # the model fits every checkpoint, the optimizer (one group instead of two) none of them
    model, optimizer = _linear(groups=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught, pytest.raises(StateMismatchError) as err:
        warnings.simplefilter("always")
        Run(tmp_path, state={"model": model, "optimizer": optimizer}, steps=6, notices=None)
    assert "none of the 3 valid checkpoints" in str(err.value)
    assert "optimizer 'optimizer'" in str(err.value) and "hint:" in str(err.value)
    assert sum("does not fit this Run" in str(w.message) for w in caught) == 3
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model, optimizer = _linear(groups=2)  # the lock was released, and the original fits
    run = Run(tmp_path, state={"model": model, "optimizer": optimizer}, steps=6, notices=None)
    assert run.resumed_from is not None and run.resumed_from.step == 6
    run.close()
