"""The registries are the only list of names: the docs' lists follow them (a backend added
without its docs, or docs naming one that is gone, fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from spotwise.control.providers import PROVIDERS
from spotwise.notices.platform import platforms

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_docs_describe_exactly_the_registered_providers() -> None:
    text = (DOCS / "control.md").read_text()
    start = text.index("- **fake**:")  # the providers' list, one bullet each
    listed = re.findall(r"^- \*\*([a-z0-9-]+)\*\*:", text[start : text.index("\n## ", start)], re.M)
    assert sorted(listed) == PROVIDERS.names()


def test_docs_name_every_value_of_spotwise_platform() -> None:
    text = (DOCS / "notices.md").read_text()
    rows = "|".join(re.findall(r"^\| `SPOTWISE_PLATFORM=([^`]+)` \|", text, re.M))
    named = set(re.split(r"\\?\|", rows)) | {"auto"}  # (unset means auto)
    assert named == set(platforms())


def test_the_plugin_docs_table_lists_every_registry_with_its_names() -> None:
    from spotwise.batch.leases import LEASE_BOARDS
    from spotwise.market.policies import POLICIES
    from spotwise.market.sources import PRICE_SOURCES
    from spotwise.notices import CLOUDS, DETECTORS
    from spotwise.storage import STORAGE

    text = (DOCS / "plugins.md").read_text()
    rows = re.findall(r"^\| `spotwise\.([\w.]+)\.(\w+)` \| `([\w.]+)` \| ([^|]+) \|", text, re.M)
    documented = {
        name: (group, sorted(n.strip() for n in names.split(","))) for _, name, group, names in rows
    }
    by_name = {
        "PROVIDERS": PROVIDERS,
        "STORAGE": STORAGE,
        "DETECTORS": DETECTORS,
        "CLOUDS": CLOUDS,
        "PRICE_SOURCES": PRICE_SOURCES,
        "POLICIES": POLICIES,
        "LEASE_BOARDS": LEASE_BOARDS,
    }
    assert set(documented) == set(by_name)
    for name, registry in by_name.items():
        assert documented[name] == (registry.group, registry.names()), name


def test_storage_docs_table_is_exactly_the_registered_schemes() -> None:
    from spotwise.storage import schemes as registered_schemes

    text = (DOCS / "storage.md").read_text()
    start = text.index("| URI ")
    table = text[start : text.index("\n\n", start)]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    uris = [u for row in rows for u in re.findall(r"`([^`]+)`", row.split("|")[1])]
    schemes = {u.split("://", 1)[0] for u in uris if "://" in u}
    assert schemes == set(registered_schemes())
