"""Name -> "module:attr" tables, imported lazily, with install hints.

Adding a backend is one new file plus one line in its kind's table. Nothing is imported until a
name is asked for, so an optional SDK that is missing only matters when its backend is used.
Another package can add a backend without touching this one by declaring a Python entry point in
the kind's group (e.g. ``[project.entry-points."spotwise.providers"] mine = "pkg.mod:Class"``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from spotwise.errors import ConfigError, MissingExtraError, UnknownBackendError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    target: str  # "package.module:attribute"
    extra: str | None = None  # pip extra that provides its optional dependencies


class Registry(Generic[T]):
    """A lazy table of one kind of backend (storage, detector, provider, price source)."""

    def __init__(
        self, kind: str, entries: dict[str, Entry | str], group: str | None = None
    ) -> None:
        self.kind = kind
        self.group = group  # entry-point group read for plugins, once, on first use
        self._plugins_read = group is None
        self._entries = {
            name: (e if isinstance(e, Entry) else Entry(e)) for name, e in entries.items()
        }

    def _read_plugins(self) -> None:
        """Add the backends other installed packages declare; built-in names win."""
        if self._plugins_read or self.group is None:
            return
        self._plugins_read = True
        import importlib.metadata  # (here: a machine's supervisor imports this module)

        for ep in importlib.metadata.entry_points(group=self.group):
            self._entries.setdefault(ep.name, Entry(ep.value))

    def names(self) -> list[str]:
        self._read_plugins()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        self._read_plugins()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def register(
        self, name: str, target: str, extra: str | None = None, *, replace: bool = False
    ) -> None:
        """Add a backend at run time (plugins); the built-in ones live in the table. A name
        already taken is refused unless ``replace=True``: two plugins claiming one name would
        otherwise make whichever registers last win, silently."""
        self._read_plugins()
        if name in self._entries and not replace:
            raise ConfigError(
                f"{self.kind} {name!r} is already registered ({self._entries[name].target})",
                hint=f"pick another name, or pass replace=True to put {target} in its place",
            )
        self._entries[name] = Entry(target, extra)

    def check(self, name: str) -> None:
        """Refuse an unknown name (with did-you-mean) without importing anything, so input
        validation can run before any work is recorded."""
        self._read_plugins()
        if name not in self._entries:
            close = difflib.get_close_matches(name, self.names(), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else None
            raise UnknownBackendError(
                f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}", hint=hint
            )

    def load(self, name: str) -> Any:
        self.check(name)
        entry = self._entries[name]
        module_name, _, attr = entry.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").split(".")[0]
            if entry.extra and missing and not missing.startswith("spotwise"):
                raise MissingExtraError(missing, entry.extra, f"the {name!r} {self.kind}") from exc
            raise
        return getattr(module, attr)


def require(module: str, extra: str, feature: str) -> Any:
    """Import an optional SDK or fail with the exact ``pip install 'spotwise[extra]'``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtraError(module.split(".")[0], extra, feature) from exc
