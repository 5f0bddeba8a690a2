"""The settings table is the one list of SPOTWISE_* variables: the code names none it does not
declare, docs/settings.md is its output, and values are parsed one way with a clear error."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from spotwise import settings
from spotwise.errors import ConfigError, NoticeError

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
    with pytest.raises(NoticeError, match="SPOTWISE_GRACE_S='-5' is negative"):  # the caller's
        settings.GRACE_S.seconds({"SPOTWISE_GRACE_S": "-5"}, 30.0, error=NoticeError)
    assert settings.UNSUPERVISED_LIMIT_S.seconds({"SPOTWISE_UNSUPERVISED_LIMIT_S": "1.2e+06"})
    with pytest.raises(ConfigError, match="SPOTWISE_MTBI_S='an hour' is not a number") as info:
        settings.MTBI_S.seconds({"SPOTWISE_MTBI_S": "an hour"})
    assert "SPOTWISE_MTBI_S=1h" in (info.value.hint or "")  # its example: it has no default


def test_home_defaults_to_a_folder_in_the_users_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPOTWISE_HOME", raising=False)
    assert settings.home() == Path.home() / ".spotwise"
    monkeypatch.setenv("SPOTWISE_HOME", "/srv/spotwise")
    assert settings.home() == Path("/srv/spotwise")


# --- no module reads a SPOTWISE_* variable but through its Setting ------------------------------
def _names_bound(tree: ast.Module) -> dict[str, str]:
    """Module-level ``X = "SPOTWISE_..."`` constants, so a read through one is still seen."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    bound[target.id] = node.value.value
    return bound


def _variable(node: ast.expr, bound: dict[str, str]) -> str | None:
    """The SPOTWISE_* name an expression spells: a literal, a constant bound to one, or
    ``settings.X.name`` (reading a mapping by a Setting's name bypasses its parsing too)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.Name):
        text = bound.get(node.id, "")
    elif (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and isinstance(node.value, ast.Attribute)
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "settings"
    ):
        setting = getattr(settings, node.value.attr, None)
        return setting.name if isinstance(setting, settings.Setting) else None
    else:
        return None
    return text if NAME.fullmatch(text) else None


def _is_os_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def env_reads(source: str) -> list[str]:
    """``line: NAME`` for each read of a SPOTWISE_* variable from an environment: ``.get(NAME)``
    or ``getenv(NAME)`` on any mapping, ``os.environ[NAME]`` as a value, ``NAME in ...``.
    Writing one into a child's environment (a dict key, ``env[NAME] = ...``, a keyword) is not
    a read."""
    tree = ast.parse(source)
    bound = _names_bound(tree)
    reads: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            key = node.args[0] if called in ("get", "getenv", "pop") else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice if _is_os_environ(node.value) else None
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            key = node.left
        name = None if key is None else _variable(key, bound)
        if name is not None:
            reads.append((node.lineno, name))
    return [f"{line}: {name}" for line, name in sorted(reads)]


def test_the_read_finder_tells_reads_from_writes() -> None:
    source = """
import os
from spotwise import settings
HOME_ENV = "SPOTWISE_HOME"
a = os.environ.get("SPOTWISE_HOME", "")
b = os.getenv(HOME_ENV)
c = env.get(settings.GRACE_S.name)
d = os.environ["SPOTWISE_DB"]
e = "SPOTWISE_TOKEN" in os.environ
child = {"SPOTWISE_JOB_ID": "j", settings.ATTEMPT.name: "1", **env}
child["SPOTWISE_WORKER"] = "w0"
os.environ[settings.HOME.name] = "/srv"
spawn(env=dict(os.environ, SPOTWISE_PLATFORM="none"))
f = settings.HOME.path() or os.environ.get("HOME")
"""
    assert env_reads(source) == [
        "5: SPOTWISE_HOME",
        "6: SPOTWISE_HOME",
        "7: SPOTWISE_GRACE_S",
        "8: SPOTWISE_DB",
        "9: SPOTWISE_TOKEN",
    ]


def test_only_settings_reads_spotwise_variables() -> None:
    package = ROOT / "src" / "spotwise"
    found = {}
    for path in sorted(package.rglob("*.py")):
        where, text = str(path.relative_to(package.parent)), path.read_text()
        if where == "spotwise/settings.py" or ("SPOTWISE_" not in text and "settings." not in text):
            continue  # (no way to name a variable: not worth parsing)
        if reads := env_reads(text):
            found[where] = reads
    assert not found, f"read these through their Setting (spotwise.settings): {found}"
