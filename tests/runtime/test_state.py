"""State encoding (no pickle) and RNG capture/restore."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from spotwise.errors import ConfigError, StateMismatchError
from spotwise.runtime.state import (
    StateEncoder,
    capture_rng,
    check_module_state,
    decode,
    restore_rng,
)


def round_trip(value: object) -> object:
    encoder = StateEncoder()
    text = json.dumps(encoder.encode(value, "root"))
    return decode(json.loads(text), encoder.tensors)


def test_optimizer_state_dict_round_trips_exactly() -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = opt.state_dict()
    back = round_trip(state)
    assert isinstance(back, dict)
    assert back["param_groups"] == state["param_groups"]  # tuples and ints keys survive
    assert isinstance(back["param_groups"][0]["betas"], tuple)
    assert set(back["state"]) == {0, 1}
    for k, v in state["state"][0].items():
        assert torch.equal(back["state"][0][k], v)
    fresh = torch.optim.Adam(torch.nn.Linear(3, 2).parameters())
    fresh.load_state_dict(back)


def test_awkward_values() -> None:
    value = {
        "floats": [math.inf, -math.inf, 0.1 + 0.2, 1e-310],
        "ints": {1: "a", (2, 3): "b"},
        "marker-like": {"__tensor__": "not a tensor"},
        "array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "np-scalar": np.float64(2.5),
        "nested": ({"t": torch.ones(2)}, [None, True]),
    }
    back = round_trip(value)
    assert back["floats"] == value["floats"]
    assert back["ints"] == {1: "a", (2, 3): "b"}
    assert back["marker-like"] == {"__tensor__": "not a tensor"}
    assert np.array_equal(back["array"], value["array"]) and back["array"].dtype == np.float32
    assert back["np-scalar"] == 2.5
    assert torch.equal(back["nested"][0]["t"], torch.ones(2)) and back["nested"][1] == [None, True]
    assert math.isnan(round_trip(math.nan))


def test_unsupported_objects_are_refused_not_pickled() -> None:
    with pytest.raises(ConfigError, match=r"root/fn.*function"):
        StateEncoder().encode({"fn": lambda: 1}, "root")


def test_rng_capture_restore_reproduces_every_generator() -> None:
    state = capture_rng()
    encoder = StateEncoder()
    saved = json.loads(json.dumps(encoder.encode(state, "rng")))
    first = (random.random(), np.random.rand(), torch.rand(3), random.gauss(0, 1))
    restore_rng(decode(saved, encoder.tensors))
    second = (random.random(), np.random.rand(), torch.rand(3), random.gauss(0, 1))
    assert first[0] == second[0] and first[1] == second[1] and first[3] == second[3]
    assert torch.equal(first[2], second[2])


def test_module_mismatch_names_keys_and_shapes() -> None:
    saved = torch.nn.Linear(4, 2).state_dict()
    with pytest.raises(StateMismatchError, match=r"weight: checkpoint \(2, 4\).*model \(3, 4\)"):
        check_module_state("main", torch.nn.Linear(4, 3), saved)
    expected = r"missing keys 0\.bias, 0\.weight; unexpected keys bias"
    with pytest.raises(StateMismatchError, match=expected):
        check_module_state("main", torch.nn.Sequential(torch.nn.Linear(4, 2)), saved)
    check_module_state("main", torch.nn.Linear(4, 2), saved)


def test_a_mapping_of_tensors_is_named_as_one_walked_item_by_item() -> None:
    """A state_dict of tensors alone is taken in one pass; the names and the document are those
    of the item-by-item walk, a name already taken included."""
    a, b, c = torch.zeros(1), torch.ones(2), torch.full((3,), 2.0)
    encoder = StateEncoder()
    assert encoder.encode(a, "p/x") == {"__tensor__": "p/x"}
    doc = encoder.encode({"x": b, "y": c}, "p")  # "p/x" is taken: this mapping is walked
    assert doc == {"x": {"__tensor__": "p/x#2"}, "y": {"__tensor__": "p/y"}}
    assert encoder.encode({"z": a, "n": 4}, "q") == {"z": {"__tensor__": "q/z"}, "n": 4}
    assert encoder.encode({"z": b}, "r") == {"z": {"__tensor__": "r/z"}}
    assert list(encoder.tensors) == ["p/x", "p/x#2", "p/y", "q/z", "r/z"]
    assert encoder.tensors["p/x#2"] is b and encoder.tensors["r/z"] is b
