"""Each package of spotwise imports only the layers below it (docs/architecture.md draws them).

The rules are read from the code's own import statements (``ast``, nothing imported), the lazy
ones inside functions included and ``if TYPE_CHECKING:`` blocks left out: what a module may
load, not what it names in a type. A unit is a package or a module under ``spotwise``; the
longest dotted name that a rule gives decides (``telemetry.events`` before ``telemetry``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "spotwise"

# The ground floor: small modules with one job that every layer may use.
BASE = {
    "errors",
    "exitcode",
    "durations",
    "echo",
    "dirfd",
    "proctree",
    "leases",
    "retry",
    "registry",
    "settings",
}
# What the training process and the controller share of telemetry: the event log, the run's own
# metrics and the webhook sender (the dashboards and reports above read the control store).
TELEMETRY_LOW = {
    "telemetry.events",
    "telemetry.runmetrics",
    "telemetry.webhooks",
    "telemetry.cloudwatch",
    "telemetry.gpu",
    "telemetry.jsonsafe",
}

ALLOWED: dict[str, set[str]] = {
    **{name: BASE for name in BASE},
    "checkpoint.durable": BASE,  # the durable-file primitives sit under storage
    "checkpoint": BASE | {"storage"},  # remote.py lists and reads checkpoints in a store
    "storage": BASE | {"checkpoint.durable"},
    "market": BASE,
    "hpo": BASE,
    "notices": BASE | {"storage", "checkpoint"},
    **{name: BASE | TELEMETRY_LOW for name in TELEMETRY_LOW},
    "runtime": BASE | {"checkpoint", "storage", "notices"} | TELEMETRY_LOW,
    "batch": BASE | {"storage", "notices"} | TELEMETRY_LOW,
    "control": BASE | {"checkpoint", "storage", "notices", "market"} | TELEMETRY_LOW,
    "telemetry": BASE | {"control", "market", "telemetry"},
    "emulators": BASE | {"checkpoint", "market", "__init__"},
    "integrations": BASE | {"runtime", "notices"},
    "server": BASE | {"checkpoint", "control", "telemetry"},
    "client": BASE | {"checkpoint", "control"},
    "testing": BASE | {"control", "market", "notices", "storage"},
    "cli": BASE
    | {"checkpoint", "storage", "notices", "market", "runtime", "batch", "hpo", "control"}
    | {"telemetry", "emulators", "server", "client", "__init__"},
    "__main__": {"cli"},
    "__init__": BASE | {"market", "notices", "runtime", "storage"},
}

# Imports that cross a rule today, each named: the debt to pay, not a licence for more.
KNOWN = {
    ("control/providers/machine.py", "emulators"),  # the sim provider's IMDS notice double
}


def _unit(dotted: str) -> str:
    """``spotwise.telemetry.events`` -> ``telemetry.events``; the package itself -> ``__init__``."""
    return dotted.removeprefix("spotwise").removeprefix(".") or "__init__"


def _rule(unit: str) -> str:
    parts = unit.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in ALLOWED:
            return ".".join(parts[:n])
    raise AssertionError(f"spotwise.{unit} is in no layer: add it to ALLOWED and the docs")


def _allowed(source: str, target: str) -> bool:
    rule = _rule(source)
    if target == rule or target.startswith(rule + "."):
        return True  # inside its own unit
    return any(target == a or target.startswith(a + ".") for a in ALLOWED[rule])


def _runtime_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """(imported spotwise unit, line) for every import a module of the package runs."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    package = package.removesuffix(".__init__")
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # ``from package import module`` names the module; ``from module import name`` it
            names = [
                f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base for a in node.names
            ]
        else:
            continue
        for name in names:
            if name == "spotwise" or name.startswith("spotwise."):
                yield _unit(name), node.lineno


def _is_module(dotted: str) -> bool:
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_package_imports_only_the_layers_below_it() -> None:
    crossings = []
    for path in sorted(SRC.rglob("*.py")):
        source = _unit(".".join(path.relative_to(SRC.parent).with_suffix("").parts))
        source = source.removesuffix(".__init__")
        where = path.relative_to(SRC).as_posix()
        for target, line in _imports(path):
            if _allowed(source, target):
                continue
            if any(where == w and (target + ".").startswith(t + ".") for w, t in KNOWN):
                continue
            crossings.append(f"src/spotwise/{where}:{line} imports spotwise.{target}")
    assert not crossings, "imports across the layers of docs/architecture.md:\n" + "\n".join(
        crossings
    )


def test_the_known_crossings_still_exist() -> None:
    """A crossing that was paid off leaves the list (so the list never licenses a new one)."""
    for where, target in sorted(KNOWN):
        found = {t for t, _ in _imports(SRC / where)}
        assert any((t + ".").startswith(target + ".") for t in found), (where, target)


def test_the_rules_catch_an_upward_import() -> None:
    assert not _allowed("storage.s3", "runtime.run")
    assert not _allowed("checkpoint.durable", "storage")
    assert not _allowed("runtime.saver.base", "telemetry.dashboard.app")
    assert _allowed("storage.s3", "checkpoint.durable")
    assert _allowed("telemetry.dashboard.app", "telemetry.events")
