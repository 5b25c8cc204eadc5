"""HTML of the dashboard: the page frame and small pieces (times, tables, sparklines), escaped throughout.

Everything a page shows is rendered here on the server from the API's answers; the browser's script
only swaps in new renderings pushed by server-sent events. No inline script or style: the frame links
/ui/static/dash.css and dash.js, so the Content-Security-Policy can forbid everything else.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from html import escape

from hopsmgr import durations
from hopsmgr.master.access import Principal

WAITING = ("PENDING", "PROFILING", "QUEUED")  # the job states of the queue page

PAGES = (("/", "Cluster"), ("/ui/queue", "Queue"), ("/ui/tenants", "Tenants"), ("/ui/scheduler", "Scheduler"))
PALETTE = 8


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def clock(t: float | None) -> str:
    if t is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def duration(s: float | None) -> str:
    return "–" if s is None else durations.duration(s, " ") or "–"


def num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def tenant_classes(names: Iterable[str]) -> dict[str, str]:
    """A colour class per tenant name (stable for a given set of names)."""
    return {name: f"t{i % PALETTE}" for i, name in enumerate(sorted(set(names)))}


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table in a horizontally scrolling box; cells are HTML already escaped by the caller."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">nothing</td></tr>'
    return f'<div class="scroll"><table class="{e(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def sparkline(points: Sequence[tuple[float, float]], label: str, width: int = 300, height: int = 48) -> str:
    """An inline SVG line of (time, value) points, with the latest value and the range as text."""
    if len(points) < 2:
        latest = num(points[-1][1]) if points else "–"
        return f'<figure class="spark"><figcaption>{e(label)}: {latest} (not enough samples yet)</figcaption></figure>'
    t0, t1 = points[0][0], points[-1][0]
    lo = min(v for _, v in points)
    hi = max(v for _, v in points)
    span_t = (t1 - t0) or 1.0
    span_v = (hi - lo) or 1.0
    coords = " ".join(
        f"{(t - t0) / span_t * width:.1f},{height - 2 - (v - lo) / span_v * (height - 4):.1f}"
        for t, v in points
    )
    caption = f"{label}: now {num(points[-1][1])}, range {num(lo)}–{num(hi)} over {duration(span_t)}"
    return (
        f'<figure class="spark"><svg viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="{e(caption)}"><polyline points="{coords}"/></svg><figcaption>{e(caption)}</figcaption></figure>'
    )


def csrf_field(csrf: str | None) -> str:
    return f'<input type="hidden" name="csrf" value="{e(csrf)}">' if csrf else ""


def action(path: str, label: str, csrf: str | None, cls: str = "") -> str:
    """A POST form with one button (only for a browser session: it needs the session's CSRF secret)."""
    if not csrf:
        return ""
    return (
        f'<form method="post" action="{e(path)}" class="inline">{csrf_field(csrf)}'
        f'<button type="submit" class="{e(cls)}">{e(label)}</button></form>'
    )


def frame(title: str, path: str, main: str, who: Principal | None, csrf: str | None) -> str:
    """The whole page: header with navigation and the viewer, the main part, the live-update hook."""
    current = ' aria-current="page"'
    links = "".join(
        f'<a href="{href}"{current if href == path else ""}>{e(text)}</a>' for href, text in PAGES
    )
    user = ""
    if who is not None:
        role = "admin" if who.admin else "user"
        logout = (
            f'<form method="post" action="/ui/logout" class="inline">{csrf_field(csrf)}<button type="submit">Log out</button></form>'
            if csrf
            else ""
        )
        user = f'<span class="who">{e(who.user)} · {e(who.tenant)} · {role}</span>{logout}'
    live = f' data-live="/ui/events{e(path)}"' if who is not None else ""
    nav = f'<nav>{links}</nav><div class="user">{user}<span id="live" class="live" title="live updates">●</span></div>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>hopsmgr · {e(title)}</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/ui/static/dash.css"><script src="/ui/static/dash.js" defer></script>'
        f'</head><body{live}><header><a class="brand" href="/">hopsmgr</a>{nav if who else ""}</header>'
        f'<main id="main">{main}</main></body></html>'
    )


def login_page(message: str = "") -> str:
    error = f'<p class="error" role="alert">{e(message)}</p>' if message else ""
    main = (
        '<section class="login"><h1>Log in</h1>'
        "<p>Paste an API token (<code>hopsmgr token create</code>, or the master's admin.token).</p>"
        f'{error}<form method="post" action="/ui/login"><label>Token '
        '<input type="password" name="token" autocomplete="current-password" required autofocus></label>'
        '<button type="submit">Log in</button></form></section>'
    )
    return frame("Log in", "/ui/login", main, None, None)


def error_page(status: int, message: str, who: Principal | None, csrf: str | None, path: str) -> str:
    main = f'<section><h1>{status}</h1><p class="error" role="alert">{e(message)}</p><p><a href="/">Back to the cluster</a></p></section>'
    return frame(f"{status}", path, main, who, csrf)


def badge(text: str, cls: str) -> str:
    return f'<span class="badge {e(cls)}">{e(text)}</span>'


def state_badge(state: str) -> str:
    return badge(state, f"s-{state.lower()}")
