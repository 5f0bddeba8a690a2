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


def test_storage_docs_table_is_exactly_the_registered_schemes() -> None:
    from spotwise.storage import SCHEMES, STORAGE

    text = (DOCS / "storage.md").read_text()
    start = text.index("| URI ")
    table = text[start : text.index("\n\n", start)]
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    uris = [u for row in rows for u in re.findall(r"`([^`]+)`", row.split("|")[1])]
    schemes = {u.split("://", 1)[0] for u in uris if "://" in u}
    assert schemes == set(SCHEMES)
    modules = {re.search(r"`storage/(\w+)\.py`", row).group(1) for row in rows}  # type: ignore[union-attr]
    assert modules == set(STORAGE.names())  # each backend's module is named as it is registered
