"""New secrets for API and cluster tokens."""

from __future__ import annotations

import secrets


def new_token() -> str:
    """A random URL-safe token (256 bits) that does not start with "-": one that did would read as an
    option on a command line (`hopsmgr nodes --token -x...` fails in argparse)."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token
