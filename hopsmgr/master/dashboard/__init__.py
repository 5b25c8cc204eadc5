"""The web dashboard the master serves at `/`: server-rendered HTML, live by server-sent events.

`setup(app, ctl)` adds its routes (hopsmgr.master.dashboard.routes) and its usage sampler
(hopsmgr.master.dashboard.history) to the master's aiohttp app. Its assets (one stylesheet, one small
script) ship inside the package; nothing is fetched from the network. See docs/dashboard.md.
"""

from __future__ import annotations

from aiohttp import web

from hopsmgr.master.controller import Controller
from hopsmgr.master.dashboard.history import sampler
from hopsmgr.master.dashboard.routes import HISTORY, add_routes


def setup(app: web.Application, ctl: Controller, push_s: float = 1.0) -> None:
    add_routes(app, push_s)
    app.cleanup_ctx.append(sampler(ctl, app[HISTORY]))  # type: ignore[arg-type]
