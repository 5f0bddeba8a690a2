"""``ckpt verify`` gives the verdict loading gives, for changes made with consistent checksums.

Every example copies a run directory written by a real ``spotwise.Run`` (checkpoints at steps 2
and 4), changes step 4's files the way a buggy tool or an attacker who recomputes the
manifest's sizes and CRC32Cs would (the safetensors header's dtypes, shapes and byte ranges;
the structure of ``state.json``; the manifest's records of sizes and checksums), and asserts
that ``spotwise ckpt verify`` calls step 4 valid exactly when a ``Run`` with the same objects
resumes from it (and does not fall back to step 2). The manifest is the root of trust: a
change that also rewrites its other records (drops ``kind`` or ``header_crc32c``) makes a
checkpoint of the kind older writers made, which only the user's objects can judge.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spotwise.checkpoint.format import MANIFEST, STATE_FILE, TENSORS_FILE, step_dir_name
from spotwise.cli.main import app
from spotwise.errors import CorruptCheckpointError
from spotwise.runtime import CheckpointConfig, Run
from spotwise.runtime.commit import load_checkpoint, verify_checkpoint

pytestmark = pytest.mark.timeout(600)
STEP = 4
Mutation = tuple[str, Any]


def objects() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def open_run(run_dir: Path) -> Run:
    model, optimizer = objects()
    return Run(
        run_dir,
        state={"model": model, "optimizer": optimizer},
        steps=STEP,
        checkpoint=CheckpointConfig(every=2),
        notices=None,
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("verify") / "run"
    run = open_run(run_dir)
    model, optimizer = run.state["model"], run.state["optimizer"]
    for _ in run:
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    run.close()
    return run_dir


# --- consistent-checksum mutations -------------------------------------------------------------
def read_tensors(ckpt: Path) -> tuple[dict[str, Any], bytes]:
    data = (ckpt / TENSORS_FILE).read_bytes()
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + length]), data[8 + length :]


def write_tensors(ckpt: Path, header: dict[str, Any], body: bytes) -> None:
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    (ckpt / TENSORS_FILE).write_bytes(len(text).to_bytes(8, "little") + text + body)


def mutate_header(ckpt: Path, change: tuple[str, int, Any]) -> None:
    what, pick, value = change
    header, body = read_tensors(ckpt)
    names = sorted(n for n in header if n != "__metadata__")
    entry = header[names[pick % len(names)]]
    if what == "dtype":
        entry["dtype"] = value
    elif what == "shape":
        shape, count = entry["shape"], math.prod(entry["shape"])
        shapes = {"flat": [count], "reversed": shape[::-1], "plus-one": [count + 1],
                  "unit": [*shape, 1], "empty": [0]}  # fmt: skip
        entry["shape"] = shapes[value]
    elif what == "swap":  # two tensors trade byte ranges
        other = header[names[value % len(names)]]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    write_tensors(ckpt, header, body)


# a changed accumulate= is a different configuration, which only the Run's own can judge
COUNTERS = ("step", "epoch", "batch_in_epoch", "seed")
BAD = [None, -1, "x", 1.5, True, [], {}, 0]
HOSTILE = st.sampled_from([*BAD, STEP + 1, 2**70])


def mutate_state(ckpt: Path, change: tuple[str, Any, Any]) -> None:
    what, key, value = change
    doc = json.loads((ckpt / STATE_FILE).read_text())
    if what == "replace":
        doc = value
    elif not isinstance(doc, dict):  # an earlier mutation replaced the document
        return
    elif what == "drop":
        doc.pop(key, None)
    elif what == "top":
        doc[key] = value
    elif isinstance(doc.get("spotwise" if what == "meta" else "rng"), dict):
        doc["spotwise" if what == "meta" else "rng"][key] = value
    (ckpt / STATE_FILE).write_text(json.dumps(doc))


def mutate_manifest(ckpt: Path, change: tuple[str, str, Any]) -> None:
    what, name, value = change
    doc = json.loads((ckpt / MANIFEST).read_text())
    if what == "metrics":
        doc["metrics"] = value
    else:  # a record of one file: size, crc32c or header_crc32c
        entry = doc["files"][name]
        entry[what] = value if what == "size" else f"{(int(entry.get(what, '0'), 16) ^ value):08x}"
    (ckpt / MANIFEST).write_text(json.dumps(doc))


def resign(ckpt: Path, names: list[str]) -> None:
    """Recompute the size and CRC32C of ``names`` in the manifest, keeping its other records."""
    doc = json.loads((ckpt / MANIFEST).read_text())
    for name in names:
        data = (ckpt / name).read_bytes()
        doc["files"][name].update(size=len(data), crc32c=f"{crc32c.crc32c(data):08x}")
    (ckpt / MANIFEST).write_text(json.dumps(doc))


HEADER = st.tuples(
    st.just("header"),
    st.one_of(
        st.tuples(st.just("dtype"), st.integers(0, 9),
                  st.sampled_from(["F32", "I32", "U32", "F16", "BF16", "F64", "I64", "U8"])),
        st.tuples(st.just("shape"), st.integers(0, 9),
                  st.sampled_from(["flat", "reversed", "plus-one", "unit", "empty"])),
        st.tuples(st.just("swap"), st.integers(0, 9), st.integers(0, 9)),
    ),
)  # fmt: skip
STATE = st.tuples(
    st.just("state"),
    st.one_of(
        st.tuples(st.just("replace"), st.none(),
                  st.sampled_from([{}, [], None, {"spotwise": {}}, {"state": {}}])),
        st.tuples(st.just("drop"),
                  st.sampled_from(["spotwise", "state", "sampler", "loader", "extras", "rng"]),
                  st.none()),
        st.tuples(st.just("top"),
                  st.sampled_from(["state", "sampler", "loader", "extras", "rng"]),
                  st.sampled_from([None, [1], 5, "x", {}, {"a": 1}])),
        st.tuples(st.just("meta"), st.sampled_from([*COUNTERS, "version"]), HOSTILE),
        st.tuples(st.just("meta"), st.just("accumulate"), st.sampled_from(BAD)),
        st.tuples(st.just("rng"), st.sampled_from(["python", "numpy", "torch", "cuda"]),
                  st.sampled_from([None, [], [3, [1, 2], None], {"__tensor__": "nope"}, "x"])),
    ),
)  # fmt: skip
RECORD = st.tuples(
    st.just("manifest"),
    st.one_of(
        st.tuples(st.sampled_from(["size"]), st.sampled_from([TENSORS_FILE, STATE_FILE]),
                  st.integers(0, 10**6)),
        st.tuples(st.sampled_from(["crc32c", "header_crc32c"]), st.just(TENSORS_FILE),
                  st.integers(0, 2**32 - 1)),
        st.tuples(st.just("crc32c"), st.just(STATE_FILE), st.integers(0, 2**32 - 1)),
        st.tuples(st.just("metrics"), st.none(), st.sampled_from([{}, {"loss": 1.0}])),
    ),
)  # fmt: skip
APPLY: dict[str, Callable[[Path, Any], None]] = {
    "header": mutate_header,
    "state": mutate_state,
    "manifest": mutate_manifest,
}


def apply(ckpt: Path, mutations: list[Mutation]) -> None:
    for part, change in mutations:
        APPLY[part](ckpt, change)
        if part != "manifest":
            resign(ckpt, [TENSORS_FILE if part == "header" else STATE_FILE])


# --- the verdicts ------------------------------------------------------------------------------
def verify_says_valid(run_dir: Path) -> bool:
    result = CliRunner().invoke(app, ["ckpt", "verify", str(run_dir), "--json"])
    assert result.exit_code in (0, 1), result.output
    report = {c["step"]: c for c in json.loads(result.output)["checkpoints"]}
    assert report[2]["valid"], report[2]
    ckpt = report.get(STEP, {"valid": False})
    assert ckpt["valid"] or ckpt["problem"]
    return bool(ckpt["valid"])


def run_resumes_from_it(run_dir: Path) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = open_run(run_dir)
    try:
        assert run.resumed_from is not None
        return run.resumed_from.step == STEP
    finally:
        run.close()


def library_agrees(ckpt: Path, verdict: bool) -> None:
    try:
        load_checkpoint(ckpt)
        loads = True
    except CorruptCheckpointError:
        loads = False
    assert verify_checkpoint(ckpt).valid == loads == verdict


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutations=st.lists(st.one_of(HEADER, STATE, RECORD), min_size=1, max_size=2))
# the reported ones: a dtype changed in the header, state.json replaced by {}
@example(mutations=[("header", ("dtype", 2, "I32"))])  # state/model/0.weight
@example(mutations=[("state", ("replace", None, {}))])
@example(mutations=[("header", ("swap", 2, 5))])  # a weight and its Adam exp_avg, same shape
@example(mutations=[("manifest", ("metrics", None, {"loss": 1.0}))])  # harmless: both accept
def test_verify_says_valid_exactly_when_run_resumes_from_it(
    template: Path, mutations: list[Mutation]
) -> None:
    base = Path(tempfile.mkdtemp(prefix="verify-"))
    try:
        run_dir = base / "run"
        shutil.copytree(template, run_dir)
        apply(run_dir / step_dir_name(STEP), mutations)
        verdict = verify_says_valid(run_dir)
        library_agrees(run_dir / step_dir_name(STEP), verdict)
        event(f"valid: {verdict}")
        assert verdict == run_resumes_from_it(run_dir), mutations
    finally:
        shutil.rmtree(base, ignore_errors=True)
