"""The snapshot buffer of background saves: what it hands the writer is always the state as it
is at the save, byte for byte, whatever changed since the buffer was laid out. The copy into the
buffer broadcasts and converts dtypes silently, so only the buffer's own check stands between a
changed state and a checkpoint of wrong bytes under a wrong header."""

from __future__ import annotations

import torch

from spotwise.runtime.format import TensorBlob, pack_tensors, parse_safetensors, split_blob
from spotwise.runtime.snapshot import SnapshotBuffer


def _as_saved(blob: TensorBlob) -> tuple[object, bytes]:
    return blob.layout.header, b"".join(bytes(chunk) for chunk in blob.chunks)


def test_every_change_of_the_state_is_saved_as_it_is_now() -> None:
    buffer = SnapshotBuffer()
    w = torch.arange(3.0)
    states = [
        {"w": w, "b": torch.tensor([2.0])},
        {"w": w, "b": torch.tensor([5.0])},  # same layout, new values: the buffer is reused
        {"w": w.double(), "b": torch.tensor([5.0])},  # would be converted to float32
        {"w": w, "b": torch.tensor([5.0])},
        {"w": torch.tensor([7.0]), "b": torch.tensor([5.0])},  # (1,) would broadcast into (3,)
        {"w": w.view(1, 3), "b": torch.tensor([5.0])},  # same bytes, another shape
        {"b": torch.tensor([5.0]), "w": w.view(1, 3)},  # the same tensors in another order
        {  # dtypes of three sizes: the layout orders them by item size
            "i": torch.arange(4),
            "h": torch.ones(5, dtype=torch.float16),
            "f": torch.full((2, 2), 3.0),
            "bf": torch.ones(3, dtype=torch.bfloat16),
        },
        {"c": torch.tensor([1 + 2j, 3 - 1j]).conj()},  # a lazy view: saved as its values
        {},
    ]
    for state in states:
        assert _as_saved(buffer.capture(state)) == _as_saved(pack_tensors(state)), state
    assert buffer.nbytes == 0


def test_the_buffer_is_laid_out_once_while_the_state_keeps_its_shape() -> None:
    buffer = SnapshotBuffer()
    state = {"a": torch.zeros(8), "b": torch.zeros(2, dtype=torch.int64)}
    first = buffer.capture(state)
    state["a"].fill_(1.0)  # training goes on between two saves
    second = buffer.capture(state)
    assert second.layout is first.layout and second.chunks is first.chunks
    assert _as_saved(second) == _as_saved(pack_tensors(state))


def test_each_tensor_is_copied_to_a_cache_line_and_the_file_skips_the_gaps() -> None:
    """Tensors start on 64-byte boundaries in the buffer (a copy into unaligned destinations
    was 16% slower); the writer gets the runs of adjacent tensors, so the file's bytes are
    those of the live tensors, without the padding, and sizes in multiples of 64 bytes make
    one run."""
    buffer = SnapshotBuffer()
    odd = {"a": torch.rand(3), "b": torch.rand(17), "e": torch.zeros(0), "c": torch.rand(100)}
    blob = buffer.capture(odd)
    assert [len(chunk) for chunk in blob.chunks] == [12, 68, 400]
    for chunk in blob.chunks:
        assert chunk.obj.ctypes.data % 64 == 0
    assert _as_saved(blob) == _as_saved(pack_tensors(odd))
    even = {f"t{i}": torch.rand(16 * (i + 1)) for i in range(5)}
    assert len(SnapshotBuffer().capture(even).chunks) == 1


def test_the_files_of_a_blob_saved_again_hold_the_state_as_it_is_now() -> None:
    """A save splits the snapshot into files once and keeps the split for the next saves (its
    headers are Python work the training thread would wait for): the kept files still read
    the buffer, so every save writes the values of its own moment."""
    buffer = SnapshotBuffer()
    state = {f"t{i}": torch.full((100 * (i + 1),), float(i)) for i in range(9)}
    state["n"] = torch.arange(7)
    first = buffer.capture(state)
    parts = split_blob(first, 3)
    # none far from a third (the sizes are 4 to 3,600 bytes)
    sizes = [part.layout.data_bytes for part in parts]
    assert sum(sizes) == first.layout.data_bytes
    assert max(sizes) - min(sizes) <= 3600
    for tensor in state.values():
        tensor.add_(100)  # training goes on between two saves
    second = buffer.capture(state)
    assert second is first and split_blob(second, 3) is parts
    read: dict[str, torch.Tensor] = {}
    for part in parts:
        file = torch.frombuffer(bytearray(b"".join(_as_saved(part))), dtype=torch.uint8)
        read.update(parse_safetensors(file, "part"))
    assert read.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(read[name], tensor), name
