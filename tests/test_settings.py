"""The settings table is the one list of SPOTWISE_* variables: the code names none it does not
declare, docs/settings.md is its output, and values are parsed one way with a clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spotwise import settings
from spotwise.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?<![A-Za-z0-9_])SPOTWISE_[A-Z0-9]+(?:_[A-Z0-9]+)*(?![A-Z0-9_])")


def test_docs_table_is_the_tables_output() -> None:
    assert settings.markdown_table() in (ROOT / "docs" / "settings.md").read_text(), (
        "regenerate it: python -m spotwise.settings"
    )


def test_every_variable_the_code_and_docs_name_is_declared() -> None:
    named: dict[str, str] = {}
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]:
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    undeclared = {n: where for n, where in named.items() if n not in settings.SETTINGS}
    assert not undeclared, f"declare these in spotwise/settings.py: {undeclared}"


def test_values_are_parsed_one_way_with_the_variable_named() -> None:
    env = {"SPOTWISE_GRACE_S": " 2m ", "SPOTWISE_METRICS_PORT": "9100", "SPOTWISE_HOME": "~/x"}
    assert settings.GRACE_S.seconds(env) == 120.0
    assert settings.GRACE_S.seconds({}, default=30.0) == 30.0
    assert settings.METRICS_PORT.integer(env) == 9100
    assert settings.HOME.path(env) == Path("~/x").expanduser()
    with pytest.raises(ConfigError, match="SPOTWISE_GRACE_S='soon'") as info:
        settings.GRACE_S.seconds({"SPOTWISE_GRACE_S": "soon"})
    assert "SPOTWISE_GRACE_S=30" in (info.value.hint or "")
    with pytest.raises(ConfigError, match="SPOTWISE_METRICS_PORT='91x' is not a whole number"):
        settings.METRICS_PORT.integer({"SPOTWISE_METRICS_PORT": "91x"})


def test_home_defaults_to_a_folder_in_the_users_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTWISE_HOME", raising=False)
    assert settings.home() == Path.home() / ".spotwise"
    monkeypatch.setenv("SPOTWISE_HOME", "/srv/spotwise")
    assert settings.home() == Path("/srv/spotwise")
