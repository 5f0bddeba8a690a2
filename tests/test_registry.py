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
