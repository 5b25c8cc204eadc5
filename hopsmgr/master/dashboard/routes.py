"""The dashboard's HTTP routes on the master's app: pages, login and logout, live updates, admin actions.

Pages: `/` (cluster map), `/ui/queue`, `/ui/jobs/{job}`, `/ui/tenants`, `/ui/scheduler`. A browser logs
in at `/ui/login` with an API token and gets a session cookie (HttpOnly, SameSite=Strict, Secure over
TLS); scripts send `Authorization: Bearer` instead. `/ui/events/PAGE` (`/ui/events/ui/queue`) streams the page's main part
as server-sent events whenever it changes. Every state-changing form (drain, undrain, cancel, logout)
carries the session's CSRF secret, and a POST whose Origin is another site is refused. Reads and
actions go through the API's own handlers (hopsmgr.master.dashboard.data), so a token sees and does
on the dashboard exactly what the API lets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from hopsmgr.master.access import Principal
from hopsmgr.master.dashboard import data, pages
from hopsmgr.master.dashboard.history import History
from hopsmgr.master.dashboard.render import error_page, frame, login_page
from hopsmgr.master.dashboard.session import COOKIE, Session, Sessions, csrf_ok
from hopsmgr.master.schemas import NODE_ID_PATTERN
from hopsmgr.protocol import JOB_ID_PATTERN

SESSIONS = web.AppKey("dashboard_sessions", Sessions)
HISTORY = web.AppKey("dashboard_history", History)
CLOSING = web.AppKey("dashboard_closing", asyncio.Event)
PUSH_S = web.AppKey("dashboard_push_s", float)
STATIC = {"dash.css": "text/css", "dash.js": "text/javascript"}
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_JOB = re.compile(rf"/ui/jobs/({JOB_ID_PATTERN})")
MAX_FORM = 16 * 1024


class LoginNeeded(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Viewer:
    api: data.Api
    who: Principal
    session: Session | None  # None: a script with Authorization: Bearer (no CSRF, no forms)
    sid: str | None

    @property
    def csrf(self) -> str | None:
        return None if self.session is None else self.session.csrf


Fetch = Callable[[data.Api], Awaitable[dict[str, Any]]]
Render = Callable[[dict[str, Any], Viewer, float, History], str]


@dataclass(frozen=True, slots=True)
class Page:
    title: str
    fetch: Fetch
    render: Render


def _page(path: str) -> Page | None:
    """The page at `path`, or None."""

    def simple(fn: Callable[..., str]) -> Render:
        return lambda d, v, now, h: fn(d, v.who, v.csrf, now)

    def with_history(fn: Callable[..., str]) -> Render:
        return lambda d, v, now, h: fn(d, v.who, v.csrf, now, h)

    if path == "/":
        return Page("Cluster", data.cluster_page, simple(pages.cluster))
    if path == "/ui/queue":
        return Page("Queue", data.queue_page, simple(pages.queue))
    if path == "/ui/tenants":
        return Page("Tenants", data.tenants_page, with_history(pages.tenants))
    if path == "/ui/scheduler":
        return Page("Scheduler", data.scheduler_page, with_history(pages.scheduler))
    m = _JOB.fullmatch(path)
    if m:
        job_id = m.group(1)

        async def fetch(api: data.Api) -> dict[str, Any]:
            return await data.job_page(api, job_id)

        return Page(job_id, fetch, simple(pages.job))
    return None


def html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        text=text, status=status, content_type="text/html", headers={**HEADERS, **(headers or {})}
    )


def see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={**HEADERS, "Location": location})


def viewer(request: web.Request) -> Viewer:
    """Who asks: a bearer token, or the session of the cookie. LoginNeeded when neither is good."""
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise data.Refused(401, "missing bearer token (Authorization: Bearer <token>)")
        api = data.Api(request, token.strip())
        return Viewer(api, api.who(), None, None)
    sessions = request.app[SESSIONS]
    sid = request.cookies.get(COOKIE)
    session = sessions.get(sid)
    if session is None:
        raise LoginNeeded
    api = data.Api(request, session.token)
    try:
        who = api.who()
    except data.Refused:  # the token was revoked: so is the session
        sessions.drop(sid)
        raise LoginNeeded from None
    return Viewer(api, who, session, sid)


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    return origin is None or origin == f"{request.scheme}://{request.host}"


async def _form(request: web.Request) -> dict[str, str]:
    if request.content_length is not None and request.content_length > MAX_FORM:
        raise data.Refused(413, f"form larger than {MAX_FORM} bytes")
    form = await request.post()
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def render_main(v: Viewer, page: Page, history: History) -> str:
    return page.render(await page.fetch(v.api), v, v.api.ctl.clock(), history)


async def show(request: web.Request) -> web.StreamResponse:
    path = request.path
    page = _page(path)
    if page is None:
        raise web.HTTPNotFound()
    try:
        v = viewer(request)
    except LoginNeeded:
        return see_other("/ui/login")
    except data.Refused as exc:
        return html(error_page(exc.status, exc.message, None, None, path), exc.status)
    try:
        main = await render_main(v, page, request.app[HISTORY])
    except data.Refused as exc:
        return html(error_page(exc.status, exc.message, v.who, v.csrf, path), exc.status)
    return html(frame(page.title, path, main, v.who, v.csrf))


async def login_form(request: web.Request) -> web.Response:
    return html(login_page())


async def login(request: web.Request) -> web.Response:
    if not _same_origin(request):
        return html(login_page("this form was sent from another site"), 403)
    base = request.clone()  # the API calls copy this one: a request cannot be copied once its body was read
    try:
        token = (await _form(request)).get("token", "").strip()
    except data.Refused as exc:
        return html(login_page(exc.message), exc.status)
    if not token:
        return html(login_page("token: paste an API token"), 400)
    try:
        data.Api(base, token).who()
    except data.Refused as exc:
        return html(login_page(f"token: {exc.message}"), 401)
    sid, _ = request.app[SESSIONS].create(token)
    response = see_other("/")
    response.set_cookie(
        COOKIE, sid, httponly=True, samesite="Strict", secure=request.secure, path="/", max_age=12 * 3600
    )
    return response


async def _checked_post(request: web.Request) -> Viewer:
    """The viewer of a state-changing POST: same origin, and the session's CSRF secret for a cookie."""
    if not _same_origin(request):
        raise data.Refused(403, "this form was sent from another site")
    v = viewer(
        request.clone()
    )  # the API calls copy this one: a request cannot be copied once its body was read
    if v.session is not None and not csrf_ok(v.session, (await _form(request)).get("csrf")):
        raise data.Refused(403, "csrf: the form's CSRF secret is missing or wrong (reload the page)")
    return v


async def logout(request: web.Request) -> web.Response:
    try:
        v = await _checked_post(request)
    except LoginNeeded:
        return see_other("/ui/login")
    except data.Refused as exc:
        return html(error_page(exc.status, exc.message, None, None, "/ui/logout"), exc.status)
    request.app[SESSIONS].drop(v.sid)
    response = see_other("/ui/login")
    response.del_cookie(COOKIE, path="/")
    return response


def _act(api_path: Callable[[web.Request], str], back: Callable[[web.Request], str]) -> Any:
    async def handler(request: web.Request) -> web.Response:
        try:
            v = await _checked_post(request)
            await v.api.call("POST", api_path(request))
        except LoginNeeded:
            return see_other("/ui/login")
        except data.Refused as exc:
            return html(error_page(exc.status, exc.message, None, None, request.path), exc.status)
        return see_other(back(request))

    return handler


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `main` with the page's new main part whenever it changes; `gone` when the
    session ended (the script then reloads, which leads to the login page)."""
    path = request.match_info["path"]
    page = _page(path)
    if page is None:
        raise web.HTTPNotFound()
    try:
        v = viewer(request)
    except LoginNeeded:
        raise web.HTTPUnauthorized() from None
    except data.Refused:
        raise web.HTTPUnauthorized() from None
    response = web.StreamResponse(
        headers={**HEADERS, "Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    closing = request.app[CLOSING]
    every = request.app[PUSH_S]
    last = ""
    quiet_since = time.monotonic()
    try:
        await response.write(b"retry: 2000\n\n")
        while not closing.is_set():
            try:
                v = viewer(request)
                main = await render_main(v, page, request.app[HISTORY])
            except LoginNeeded:
                await response.write(b"event: gone\ndata: session ended\n\n")
                break
            except data.Refused as exc:
                main = error_page(exc.status, exc.message, None, None, path).split('<main id="main">')[1]
                main = main.removesuffix("</main></body></html>")
            if main != last:
                last = main
                lines = "".join(f"data: {line}\n" for line in main.split("\n"))
                await response.write(f"event: main\n{lines}\n".encode())
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 15:
                await response.write(b": ping\n\n")
                quiet_since = time.monotonic()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(closing.wait(), timeout=every)
    except (ConnectionResetError, ConnectionError):
        pass
    return response


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    body = resources.files("hopsmgr.master.dashboard").joinpath("static", name).read_bytes()
    return web.Response(
        body=body, content_type=STATIC[name], headers={**HEADERS, "Cache-Control": "no-cache"}
    )


def add_routes(app: web.Application, push_s: float = 1.0) -> None:
    app[SESSIONS] = Sessions()
    app[HISTORY] = History()
    app[CLOSING] = asyncio.Event()
    app[PUSH_S] = push_s

    async def shutting_down(app: web.Application) -> None:
        app[CLOSING].set()  # open event streams end, so the server stops at once

    app.on_shutdown.append(shutting_down)
    r = app.router
    for path in ("/", "/ui/queue", "/ui/tenants", "/ui/scheduler", "/ui/jobs/{job}"):
        r.add_get(path, show)
    r.add_get("/ui/login", login_form)
    r.add_post("/ui/login", login)
    r.add_post("/ui/logout", logout)
    r.add_get("/ui/events{path:/.*}", events)
    r.add_get("/ui/static/{name}", static)
    node = "/ui/nodes/{node:" + NODE_ID_PATTERN + "}"
    r.add_post(node + "/drain", _act(lambda q: f"/api/v1/nodes/{q.match_info['node']}/drain", lambda q: "/"))
    r.add_post(
        node + "/undrain", _act(lambda q: f"/api/v1/nodes/{q.match_info['node']}/undrain", lambda q: "/")
    )
    r.add_post(
        "/ui/jobs/{job:" + JOB_ID_PATTERN + "}/cancel",
        _act(
            lambda q: f"/api/v1/jobs/{q.match_info['job']}/cancel",
            lambda q: f"/ui/jobs/{q.match_info['job']}",
        ),
    )
