"""The documentation in docs/ stays true to the code it describes (cheap textual checks)."""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, Field, fields
from pathlib import Path

import pytest

from hopsmgr.cli.main import build_parser
from hopsmgr.control.diagram import mermaid_diagram as machine_diagram
from hopsmgr.core.lifecycle import mermaid_diagram
from hopsmgr.core.settings import SchedulerSettings
from hopsmgr.master.settings import MasterSettings
from hopsmgr.policies.registry import POLICY_NAMES

DOCS = Path(__file__).resolve().parents[2] / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def read(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def toml_name(field_name: str) -> str:
    return "lambda" if field_name == "lambda_" else field_name


def spellings(value: object) -> set[str]:
    """How a default may be written in the docs: Python repr or str, or its TOML spelling."""
    out = {repr(value), str(value)}
    if isinstance(value, bool):
        out.add("true" if value else "false")
    elif isinstance(value, str):
        out.add(f'"{value}"')
    return out


def simulate_long_options() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    simulate = sub.choices["simulate"]
    return sorted(
        opt
        for action in simulate._actions
        if not isinstance(action, argparse._HelpAction)
        for opt in action.option_strings
        if opt.startswith("--")
    )


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", body, flags=re.M)}


def test_architecture_contains_the_lifecycle_diagram_verbatim() -> None:
    assert f"```mermaid\n{mermaid_diagram()}```" in read("architecture.md")


def test_state_machine_diagram_matches_its_table() -> None:
    assert f"```mermaid\n{machine_diagram()}```" in read("architecture.md")


@pytest.mark.parametrize("field", fields(SchedulerSettings), ids=lambda f: f.name)
def test_every_scheduler_setting_is_documented_with_its_default(field: Field[object]) -> None:
    name = toml_name(field.name)
    default = field.default
    assert default is not MISSING
    lines = [line for line in read("configuration.md").splitlines() if f"`{name}`" in line]
    assert lines, f"scheduler key {name!r} is not in docs/configuration.md"
    wanted = {f"`{s}`" for s in spellings(default)}
    assert any(w in line for line in lines for w in wanted), (
        f"no line of docs/configuration.md names `{name}` with its default {default!r}"
    )


@pytest.mark.parametrize("field", fields(MasterSettings), ids=lambda f: f.name)
def test_every_master_setting_is_documented_with_its_default(field: Field[object]) -> None:
    lines = [line for line in read("configuration.md").splitlines() if line.startswith(f"| `{field.name}` |")]
    assert lines, f"master key {field.name!r} is not in docs/configuration.md"
    wanted = {f"`{s}`" for s in spellings(field.default)}
    assert any(w in lines[0] for w in wanted), (
        f"`{field.name}` is documented without its default {field.default!r}"
    )


def test_every_simulate_option_is_documented() -> None:
    text = read("simulator.md")
    options = simulate_long_options()
    assert "--cluster" in options
    missing = [opt for opt in options if f"`{opt}`" not in text]
    assert not missing, f"hopsmgr simulate options missing from docs/simulator.md: {missing}"


def test_every_policy_is_documented() -> None:
    text = read("simulator.md")
    missing = [name for name in POLICY_NAMES if f"`{name}`" not in text]
    assert not missing, f"policies missing from docs/simulator.md: {missing}"


def test_relative_links_between_docs_resolve() -> None:
    docs = sorted(DOCS.glob("*.md"))
    assert docs
    broken = []
    for doc in docs:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            if not resolved.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text("utf-8")):
                broken.append(f"{doc.name}: {target} (no such heading)")
    assert not broken, f"broken links: {broken}"


# -- the installation, operations, agent and user guides ----------------------------------------------

GUIDES = ("install.md", "operations.md", "user-guide.md", "agent.md")


def agent_config_keys() -> list[str]:
    """Every key hopsmgr_agent.config accepts: `_KEYS`, and `table.key` for each nested table that has
    a `_<TABLE>_KEYS` tuple (`[emulated]`, `[cpu]`)."""
    from hopsmgr_agent import config as agent_config

    keys = list(agent_config._KEYS)
    for table in agent_config._KEYS:
        nested = getattr(agent_config, f"_{table.upper()}_KEYS", None)
        if nested is not None:
            keys += [f"{table}.{key}" for key in nested]
    assert "emulated.speed" in keys and "cpu.count" in keys
    return keys


def subcommand_options(parser: argparse.ArgumentParser, name: str) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(
        opt
        for action in sub.choices[name]._actions
        if not isinstance(action, argparse._HelpAction)
        for opt in action.option_strings
        if opt.startswith("--")
    )


def code_lines(text: str) -> list[str]:
    """The lines of fenced and indented code blocks, backslash continuations joined."""
    lines: list[str] = []
    fenced = False
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ")):
            continue
        stripped = line.strip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return lines


def cli_options(parser: argparse.ArgumentParser, words: list[str]) -> tuple[list[str], set[str]] | None:
    """Follow `words` (what came after `hopsmgr`) down the subcommands: (the subcommand path, the
    options it accepts), or None when the first word is no subcommand (e.g. `sudo -u hopsmgr ssh`)."""
    path: list[str] = []
    for word in words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
        path.append(word)
    if not path:
        return None
    return path, {opt for action in parser._actions for opt in action.option_strings}


def test_every_agent_config_key_is_documented() -> None:
    text = read("agent.md")
    missing = [key for key in agent_config_keys() if f"| `{key}` |" not in text]
    assert not missing, f"agent config keys without a row in docs/agent.md: {missing}"


def test_every_submit_option_is_in_the_user_guide() -> None:
    text = read("user-guide.md")
    options = subcommand_options(build_parser(), "submit")
    assert "--gpus" in options and "--launcher" in options
    missing = [opt for opt in options if not re.search(rf"`{re.escape(opt)}(?![\w-])", text)]
    assert not missing, f"hopsmgr submit options missing from docs/user-guide.md: {missing}"


@pytest.mark.parametrize("name", GUIDES)
def test_hopsmgr_commands_in_the_guides_exist(name: str) -> None:
    """Every `hopsmgr SUBCOMMAND --option` in a code block of the guides is one the CLI accepts."""
    parser = build_parser()
    stop = {"--", "|", "||", "&&", ";", ">", "2>&1"}
    checked, bad = 0, []
    for line in code_lines(read(name)):
        words = line.split()
        for i, word in enumerate(words):
            if word != "hopsmgr" and not word.endswith("/hopsmgr"):
                continue
            found = cli_options(parser, words[i + 1 :])
            if found is None:
                continue
            path, accepted = found
            checked += 1
            for token in words[i + 1 + len(path) :]:
                if token in stop or token.startswith(("#", "$(")):
                    break
                option = token.split("=", 1)[0]
                if re.fullmatch(r"--?[a-z][a-z-]*", option) and option not in accepted:
                    bad.append(f"hopsmgr {' '.join(path)} {option}  (in: {line})")
    assert not bad, f"options the CLI does not have, in docs/{name}: {bad}"
    if name != "agent.md":
        assert checked, f"no hopsmgr command found in docs/{name}"


def test_the_guides_say_what_is_not_done_yet() -> None:
    install, guide = read("install.md"), read("user-guide.md")
    assert "By default jobs run as the user `hopsmgr`" in install and "run_as_users = true" in install
    assert "transient scope unit" in install and "pid file" in install and "(security.md)" in install
    security = read("security.md")
    assert "## Threat model" in security and "Not enforced (yet)" in security
    assert "every job runs as the" in guide


def test_the_unit_files_create_the_service_account_as_install_md_does() -> None:
    def account_lines(text: str) -> list[str]:
        found = re.findall(r"^[#\s]*((?:groupadd|useradd) [^#\n]*?)\s*(?:#.*)?$", text, flags=re.M)
        return [" ".join(line.split()) for line in found]

    install = account_lines((DOCS / "install.md").read_text(encoding="utf-8"))
    assert install, "docs/install.md creates no service account"
    for unit in ("hopsmgr-master.service", "hopsmgr-agent.service"):
        assert account_lines((DOCS.parent / "systemd" / unit).read_text(encoding="utf-8")) == install, unit
