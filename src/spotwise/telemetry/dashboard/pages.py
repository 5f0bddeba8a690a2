"""The two HTML pages (jobs, one job), for the live dashboard and for the offline report.

A page is a shell: its data travels as JSON in a non-executed ``<script type="application/json">``
block, and ``app.js`` draws it (and, live, redraws it on each server-sent event). The dashboard
links the scripts from ``/static``; the report inlines them, so the file needs nothing else.
Nothing on either page refers to another site: the chart library is vendored beside this file.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

from spotwise.telemetry.jsonsafe import dumps

SCRIPTS = ("uPlot.iife.min.js", "app.js")
STYLES = ("uPlot.min.css", "app.css")
# what the browser may load: this origin only (the report: its own inlined code only)
CSP_LIVE = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


# the report: only the code and styles inlined in it, no request of any kind
CSP_REPORT = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
)


def static_text(name: str) -> str:
    return (resources.files("spotwise.telemetry.dashboard") / "static" / name).read_text()


def _json_block(element_id: str, data: Any) -> str:
    # "<" escaped: no "</script>" can end the block early, whatever a job's log holds; NaN as
    # null: JSON.parse rejects the whole block otherwise, and the page stays blank
    text = dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return f'<script id="{element_id}" type="application/json">{text}</script>'


def page(
    *, kind: str, title: str, data: Any, live: bool, token: str = "", inline: bool = False
) -> str:
    """``kind`` is ``jobs`` or ``job``; ``inline`` builds one self-contained file (the report)."""
    if inline:
        head = "".join(f"<style>{static_text(s)}</style>" for s in STYLES)
        tail = "".join(f"<script>{static_text(s)}</script>" for s in SCRIPTS)
    else:
        head = "".join(f'<link rel="stylesheet" href="/static/{s}">' for s in STYLES)
        tail = "".join(f'<script src="/static/{s}"></script>' for s in SCRIPTS)
    csp = f'<meta http-equiv="Content-Security-Policy" content="{CSP_REPORT}">' if inline else ""
    nav = '<a href="/">all jobs</a>' if live else "spotwise report"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">{csp}
<link rel="icon" href="data:,">
<title>{html.escape(title)}</title>{head}</head>
<body data-page="{kind}" data-live="{int(live)}" data-token="{html.escape(token)}">
<header><span class="brand">spotwise</span> {nav}</header>
<main id="main"><p class="muted">loading…</p></main>
{_json_block("data", data)}{tail}
</body></html>
"""
