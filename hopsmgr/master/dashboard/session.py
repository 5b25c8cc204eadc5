"""Dashboard sessions: a token exchanged for an HttpOnly, SameSite=Strict cookie, with a CSRF secret.

A session maps a random id (the cookie) to the API token it was made from and a CSRF secret that every
state-changing form carries back. Sessions live in the master's memory only: a master restart logs every
browser out (the token itself is never written anywhere new). The token is checked by the API on every
request the dashboard makes for the session, so a revoked token ends its sessions at once.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "hopsmgr_session"
SESSION_S = 12 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    token: str
    csrf: str
    expires: float


class Sessions:
    def __init__(self, clock: Callable[[], float] = time.monotonic, lifetime_s: float = SESSION_S) -> None:
        self.clock = clock
        self.lifetime_s = lifetime_s
        self.by_id: dict[str, Session] = {}

    def create(self, token: str) -> tuple[str, Session]:
        now = self.clock()
        if len(self.by_id) >= MAX_SESSIONS:  # drop the expired ones, then the oldest
            self.by_id = {k: s for k, s in self.by_id.items() if s.expires > now}
            while len(self.by_id) >= MAX_SESSIONS:
                del self.by_id[next(iter(self.by_id))]
        sid = secrets.token_urlsafe(32)
        session = Session(token, secrets.token_urlsafe(32), now + self.lifetime_s)
        self.by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        session = self.by_id.get(sid)
        if session is None:
            return None
        if session.expires <= self.clock():
            del self.by_id[sid]
            return None
        return session

    def drop(self, sid: str | None) -> None:
        if sid:
            self.by_id.pop(sid, None)


def csrf_ok(session: Session, sent: str | None) -> bool:
    return bool(sent) and secrets.compare_digest(session.csrf.encode(), str(sent).encode())
