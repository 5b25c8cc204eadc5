"""Where the CLI finds the master's URL and the token: flags > environment > client TOML > default."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from hopsmgr.cli.client import DEFAULT_URL, NO_TOKEN, ClientConfigError, Connection, resolve_connection

from .conftest import GOOD_TOKEN, FakeMaster, Result


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write(tmp_path / "client.toml", 'url = "http://file:1"\ntoken = "file-token"\n')


ENV = {"HOPSMGR_URL": "http://env:2", "HOPSMGR_TOKEN": "env-token"}


def test_flags_beat_environment_and_file(config: Path) -> None:
    conn = resolve_connection("http://flag:3", "flag-token", str(config), ENV)
    assert conn == Connection("http://flag:3", "flag-token")


def test_environment_beats_file(config: Path) -> None:
    assert resolve_connection(None, None, str(config), ENV) == Connection("http://env:2", "env-token")


def test_file_when_no_flag_nor_environment(config: Path) -> None:
    assert resolve_connection(None, None, str(config), {}) == Connection("http://file:1", "file-token")


def test_each_value_resolved_on_its_own(config: Path) -> None:
    conn = resolve_connection(None, "flag-token", str(config), {"HOPSMGR_URL": "http://env:2"})
    assert conn == Connection("http://env:2", "flag-token")


def test_default_url_and_default_config_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path / ".config" / "hopsmgr" / "client.toml", 'token = "home-token"\n')
    assert resolve_connection(None, None, None, {}) == Connection(DEFAULT_URL, "home-token")


def test_token_file_relative_to_the_config(tmp_path: Path) -> None:
    write(tmp_path / "secrets" / "api.token", "  from-file\n")
    cfg = write(tmp_path / "client.toml", 'token_file = "secrets/api.token"\n')
    assert resolve_connection(None, None, str(cfg), {}).token == "from-file"


def test_no_token_anywhere() -> None:
    with pytest.raises(ClientConfigError) as info:
        resolve_connection(None, None, None, {})
    assert str(info.value) == NO_TOKEN


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('url = "http://x:1"\ntokn = "t"\n', "tokn"),
        ("token = 5\n", "token"),
        ("token = [\n", "not valid TOML"),
        ('token_file = "missing.token"\n', "missing.token"),
        ('url = "ftp://x"\ntoken = "t"\n', "ftp://x"),
    ],
)
def test_bad_client_config(tmp_path: Path, text: str, needle: str) -> None:
    cfg = write(tmp_path / "client.toml", text)
    with pytest.raises(ClientConfigError) as info:
        resolve_connection(None, None, str(cfg), {})
    assert needle in str(info.value)


def test_named_config_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match=r"nope\.toml"):
        resolve_connection(None, "t", str(tmp_path / "nope.toml"), {})


def test_cli_without_token_exits_2(cli: Callable[..., Result], master: FakeMaster) -> None:
    code, out, err = cli("queue", "--url", master.url)
    assert (code, out) == (2, "")
    assert NO_TOKEN in err
    assert master.requests == []


def test_cli_bad_url_flag_exits_2(cli: Callable[..., Result]) -> None:
    code, _, err = cli("nodes", "--url", "localhost:8470", "--token", "t")
    assert code == 2
    assert "--url" in err and "'localhost:8470'" in err


def test_cli_uses_environment(
    cli: Callable[..., Result], master: FakeMaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOPSMGR_URL", master.url)
    monkeypatch.setenv("HOPSMGR_TOKEN", GOOD_TOKEN)
    code, _, err = cli("quota")
    assert code == 0, err
    assert master.requests[0].headers["Authorization"] == f"Bearer {GOOD_TOKEN}"


def test_cli_flag_token_beats_environment(
    cli: Callable[..., Result], master: FakeMaster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = write(tmp_path / "client.toml", f'url = "{master.url}"\ntoken = "file-token"\n')
    monkeypatch.setenv("HOPSMGR_TOKEN", "env-token")
    code, _, err = cli("quota", "--client-config", str(cfg), "--token", GOOD_TOKEN)
    assert code == 0, err
    code, _, err = cli("quota", "--client-config", str(cfg))
    assert code == 1 and "missing or unknown token" in err
    assert [r.headers["Authorization"] for r in master.requests] == [
        f"Bearer {GOOD_TOKEN}",
        "Bearer env-token",
    ]
