import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.errors import ConfigError, MissingExtraError, UnknownBackendError
from spotwise.registry import Entry, Registry, require


def test_lazy_load_and_unknown_name_suggests_close_match():
    reg: Registry[object] = Registry("thing", {"json": "json:dumps"})
    import json

    assert reg.load("json") is json.dumps
    with pytest.raises(UnknownBackendError, match="unknown thing 'jsn'") as info:
        reg.load("jsn")
    assert "did you mean json" in str(info.value)


def test_missing_optional_sdk_names_the_extra():
    reg: Registry[object] = Registry("storage", {"x": Entry("no_such_sdk_xyz:Client", "s3")})
    with pytest.raises(MissingExtraError, match=r"pip install 'spotwise\[s3\]'"):
        reg.load("x")
    with pytest.raises(MissingExtraError, match=r"spotwise\[crypto\]"):
        require("no_such_sdk_xyz", "crypto", "encryption")


def test_register_refuses_a_taken_name_unless_replacing():
    reg: Registry[object] = Registry("thing", {"json": "json:dumps"})
    with pytest.raises(ConfigError, match="thing 'json' is already registered") as info:
        reg.register("json", "json:loads")
    assert "replace=True" in (info.value.hint or "")
    import json

    assert reg.load("json") is json.dumps  # untouched by the refused registration
    reg.register("json", "json:loads", replace=True)
    assert reg.load("json") is json.loads
    reg.register("pickle-free", "json:loads")
    assert "pickle-free" in reg.names()


# Every registry of the package, by where it lives (a new one fails the test below until added).
REGISTRIES = {
    "spotwise.batch.leases:LEASE_BOARDS": "spotwise.lease_boards",
    "spotwise.control.providers:PROVIDERS": "spotwise.providers",
    "spotwise.market.policies:POLICIES": "spotwise.policies",
    "spotwise.market.sources:PRICE_SOURCES": "spotwise.price_sources",
    "spotwise.notices:CLOUDS": "spotwise.clouds",
    "spotwise.notices:DETECTORS": "spotwise.detectors",
    "spotwise.storage:STORAGE": "spotwise.storage",
}

PLUGIN_CHECK = """
import importlib, json, sys
for where, group in json.loads(sys.argv[1]).items():
    module, _, name = where.partition(":")
    registry = getattr(importlib.import_module(module), name)
    assert registry.group == group, (where, registry.group)
    assert "plugin-x" in registry.names(), (where, registry.names())
    assert registry.load("plugin-x") is json.dumps, where
print("every registry read its plugin")
"""


def test_every_registry_is_listed_here() -> None:
    src = Path(__file__).resolve().parents[1] / "src"
    found = set()
    for path in src.rglob("*.py"):
        module = ".".join(path.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
        for name in re.findall(r"^([A-Z_]+): Registry\[", path.read_text(), re.M):
            found.add(f"{module}:{name}")
    assert found == set(REGISTRIES)


def test_every_registry_reads_plugins_from_its_own_entry_point_group(tmp_path: Path) -> None:
    dist = tmp_path / "spotwise_any_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spotwise-any-plugin\nVersion: 1.0\n"
    )
    groups = "".join(f"[{group}]\nplugin-x = json:dumps\n" for group in REGISTRIES.values())
    (dist / "entry_points.txt").write_text(groups)
    src = Path(__file__).resolve().parents[1] / "src"
    out = subprocess.run(
        [sys.executable, "-c", PLUGIN_CHECK, json.dumps(REGISTRIES)],
        env=dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{tmp_path}"),
        capture_output=True,
        text=True,
        timeout=600,  # imports every registry's module: slow on a loaded machine
    )
    assert out.returncode == 0, out.stderr
    assert "every registry read its plugin" in out.stdout
