"""A small synchronous client of the master's REST API (docs/api.md), standard library only.

`ApiClient.get`/`ApiClient.post` return the decoded JSON answer or raise `ApiError` built from the
master's `{"error": {"status", "field", "message"}}` body; a master that cannot be reached raises
`MasterUnreachable` (an `ApiError` with status 0). `resolve_connection` picks the URL, token and CA:
flags, else the environment (HOPSMGR_URL, HOPSMGR_TOKEN, HOPSMGR_CA), else the client TOML
(`--client-config`, default `~/.config/hopsmgr/client.toml`, keys `url`, `token` or `token_file`, and
`ca_file`), else the default URL http://127.0.0.1:8470 and the system's trust store; without a token
anywhere, or with a CA file it cannot read, it raises `ClientConfigError`.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_URL = "http://127.0.0.1:8470"
DEFAULT_CLIENT_CONFIG = Path("~/.config/hopsmgr/client.toml")
URL_ENV = "HOPSMGR_URL"
TOKEN_ENV = "HOPSMGR_TOKEN"
CA_ENV = "HOPSMGR_CA"
CLIENT_KEYS = ("url", "token", "token_file", "ca_file")
FAILOVER_WAIT_S = 45.0  # how long a request waits for a new leader once a standby answered
NO_TOKEN = "no API token: pass --token, set HOPSMGR_TOKEN or write token in client.toml"

Params = Mapping[str, "str | int | float | Sequence[str] | None"]


class ApiError(Exception):
    """An error answer of the master (status >= 400), or no answer at all (status 0)."""

    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message

    def __str__(self) -> str:
        if self.field and not self.message.startswith(f"{self.field}:"):
            return f"{self.field}: {self.message}"
        return self.message


class MasterUnreachable(ApiError):
    """The master could not be reached (connection refused, DNS failure, timeout)."""

    def __init__(self, message: str) -> None:
        super().__init__(0, None, message)


class ClientConfigError(ValueError):
    """Bad or missing client settings (URL, token, client.toml): a usage error, exit status 2."""


class ApiClient:
    """Talks JSON to the master with one bearer token. `url` may name several masters ("url1,url2", a
    PostgreSQL store with standbys): a request goes to the one that answered last; a master that cannot
    be reached, or a standby's 503 (which names the leader), sends it to the leader or the next URL. Each
    URL is tried twice (a second apart) before the client gives up; once a standby answered, a failover
    is under way and the client keeps trying for up to FAILOVER_WAIT_S. A request is sent again only
    when no answer came: a submission whose master died after storing it and before answering may be
    stored twice (two job ids; rare)."""

    def __init__(
        self, url: str, token: str | None, timeout: float = 30, context: ssl.SSLContext | None = None
    ) -> None:
        self.urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        self.url = self.urls[0]
        self.token = token
        self.timeout = timeout
        self.context = context  # the CA to verify an https master with (None: the system's)

    def get(self, path: str, params: Params | None = None) -> Any:
        return self._request("GET", path, params, None)

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        return self._request("POST", path, None, {} if body is None else dict(body))

    def delete(self, path: str) -> Any:
        return self._request("DELETE", path, None, None)

    def _request(self, method: str, path: str, params: Params | None, body: dict[str, Any] | None) -> Any:
        failover_until: float | None = None  # set once a standby answered: a failover is under way
        unreachable = 0
        while True:
            try:
                return self._request_one(method, path, params, body)
            except StandbyError as exc:
                now = time.monotonic()
                failover_until = failover_until or now + FAILOVER_WAIT_S
                if now > failover_until:
                    raise
                if exc.leader and exc.leader != self.url:
                    self.url = exc.leader
                    continue
                unreachable += 1
                self._next(unreachable)
            except MasterUnreachable:
                unreachable += 1
                if failover_until is None and unreachable >= 2 * len(self.urls):
                    raise
                if failover_until is not None and time.monotonic() > failover_until:
                    raise
                self._next(unreachable)

    def _next(self, n: int) -> None:
        index = self.urls.index(self.url) if self.url in self.urls else -1
        self.url = self.urls[(index + 1) % len(self.urls)]
        if n % len(self.urls) == 0:
            time.sleep(1.0)  # every URL tried once: wait for a failover to finish, then once more

    def _request_one(self, method: str, path: str, params: Params | None, body: dict[str, Any] | None) -> Any:
        url = self.url + path
        query = _query(params)
        if query:
            url += "?" + query
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            raw_error = exc.read()
            exc.close()
            raise _error_from(exc.code, exc.reason, raw_error) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError):
                raise MasterUnreachable(
                    f"no answer from the master at {self.url} within {self.timeout:g} s"
                ) from None
            raise MasterUnreachable(
                f"cannot reach the master at {self.url}: {_reason(reason)}{self._hint(reason)}"
            ) from None
        except TimeoutError:
            raise MasterUnreachable(
                f"no answer from the master at {self.url} within {self.timeout:g} s"
            ) from None
        except (ConnectionError, OSError, http.client.HTTPException) as exc:
            raise MasterUnreachable(
                f"cannot reach the master at {self.url}: {_reason(exc)}{self._hint(exc)}"
            ) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(
                0, None, f"the master at {self.url} answered {method} {path} with non-JSON"
            ) from None

    def _hint(self, error: object) -> str:
        """What to try: https for an http:// URL the other end hangs up on (a TLS master does), the
        CA for a certificate that does not verify."""
        if self.url.startswith("http://") and isinstance(
            error, (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError)
        ):
            return f" (a master with TLS closes plain HTTP connections: try {'https://' + self.url[7:]})"
        if isinstance(error, ssl.SSLCertVerificationError):
            return (
                " (the master's certificate does not verify: give its CA with --ca FILE, HOPSMGR_CA or"
                " ca_file in client.toml)"
            )
        return ""


def _reason(reason: object) -> str:
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason)


def _query(params: Params | None) -> str:
    if not params:
        return ""
    pairs: list[tuple[str, str]] = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            pairs.extend((key, str(v)) for v in value)
        else:
            pairs.append((key, str(value)))
    return urllib.parse.urlencode(pairs)


class StandbyError(ApiError):
    """A standby master's answer: the leader is elsewhere (`leader`, its URL, or "" while unknown)."""

    def __init__(self, message: str, leader: str) -> None:
        super().__init__(503, None, message)
        self.leader = leader


def _error_from(status: int, reason: str, raw: bytes) -> ApiError:
    try:
        doc = json.loads(raw)
        error = doc["error"]
        field = error.get("field")
        message = str(error["message"])
        if status == 503 and "leader" in doc:
            return StandbyError(message, str(doc["leader"] or ""))
        return ApiError(int(error.get("status", status)), None if field is None else str(field), message)
    except (ValueError, KeyError, TypeError, AttributeError):
        text = raw.decode("utf-8", "replace").strip()
        detail = f": {text[:200]}" if text else ""
        return ApiError(status, None, f"HTTP {status} {reason}{detail}")


@dataclass(frozen=True)
class Connection:
    url: str
    token: str
    ca_file: str | None = None

    def ssl_context(self) -> ssl.SSLContext | None:
        """A context trusting `ca_file` (None: urllib's default, the system's trust store)."""
        return None if self.ca_file is None else load_ca(self.ca_file, "the CA file")


def load_client_config(path: Path) -> dict[str, str]:
    """The client TOML's keys (`url`, `token`, `token_file`); a relative token_file is taken from the file's folder."""
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ClientConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClientConfigError(f"{path}: not valid TOML: {exc}") from None
    out: dict[str, str] = {}
    for key, value in doc.items():
        if key not in CLIENT_KEYS:
            raise ClientConfigError(f"{path}: {key}: unknown key (known: {', '.join(CLIENT_KEYS)})")
        if not isinstance(value, str) or not value.strip():
            raise ClientConfigError(f"{path}: {key}: must be a non-empty string (got {value!r})")
        out[key] = value.strip()
    for key in ("token_file", "ca_file"):
        if key in out:
            file_path = Path(out[key]).expanduser()
            if not file_path.is_absolute():
                file_path = path.parent / file_path
            out[key] = str(file_path)
    return out


def load_ca(path: str, source: str) -> ssl.SSLContext:
    """An SSL context that trusts the CA certificate(s) in `path`; ClientConfigError naming `source`
    when the file cannot be read or holds no certificate."""
    try:
        data = Path(path).read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ClientConfigError(
            f"{source}: cannot read CA file {path}: {exc.strerror or exc} (the CLI needs it to check the"
            " master's certificate; ask the administrator for a copy you can read)"
        ) from None
    try:
        return ssl.create_default_context(cadata=data)
    except (ssl.SSLError, ValueError) as exc:
        raise ClientConfigError(f"{source}: {path} holds no PEM CA certificate: {exc}") from None


def _check_url(url: str, source: str) -> str:
    """One URL, or several separated by commas (masters sharing a PostgreSQL store)."""
    for part in url.split(","):
        parsed = urllib.parse.urlsplit(part.strip())
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ClientConfigError(
                f"{source}: expected an http:// or https:// URL (or several, comma-separated), got {url!r}"
            )
    return url


def _read_token_file(path: str, source: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ClientConfigError(f"{source}: cannot read token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise ClientConfigError(f"{source}: token file {path} is empty")
    return token


def resolve_connection(
    url: str | None,
    token: str | None,
    client_config: str | None,
    environ: Mapping[str, str] | None = None,
    ca: str | None = None,
) -> Connection:
    """URL and token from flags, else environment, else the client TOML, else the default URL.

    An explicitly named client config must exist; the default one is read only if present.
    """
    env = os.environ if environ is None else environ
    if client_config is not None:
        config_path = Path(client_config).expanduser()
        file_values = load_client_config(config_path)
        config_source = f"--client-config {client_config}"
    else:
        config_path = DEFAULT_CLIENT_CONFIG.expanduser()
        file_values = load_client_config(config_path) if config_path.is_file() else {}
        config_source = str(config_path)

    if url:
        chosen_url = _check_url(url, "argument --url")
    elif env.get(URL_ENV):
        chosen_url = _check_url(env[URL_ENV], URL_ENV)
    elif "url" in file_values:
        chosen_url = _check_url(file_values["url"], f"{config_path}: url")
    else:
        chosen_url = DEFAULT_URL

    if token:
        chosen_token = token.strip()
    elif env.get(TOKEN_ENV, "").strip():
        chosen_token = env[TOKEN_ENV].strip()
    elif "token" in file_values:
        chosen_token = file_values["token"]
    elif "token_file" in file_values:
        chosen_token = _read_token_file(file_values["token_file"], config_source)
    else:
        raise ClientConfigError(NO_TOKEN)

    if ca:
        ca_file, ca_source = ca, "argument --ca"
    elif env.get(CA_ENV, "").strip():
        ca_file, ca_source = env[CA_ENV].strip(), CA_ENV
    elif "ca_file" in file_values:
        ca_file, ca_source = file_values["ca_file"], f"{config_path}: ca_file"
    else:
        return Connection(chosen_url, chosen_token)
    load_ca(ca_file, ca_source)  # refuse an unreadable or empty CA file now, naming where it came from
    return Connection(chosen_url, chosen_token, ca_file)
