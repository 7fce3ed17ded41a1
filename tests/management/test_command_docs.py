"""The "Command" section of ``docs/workflows.md`` documents every subcommand of
``manage.py flowwarden_workflows`` with every argument its parser takes, so the two
cannot drift apart."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from flowwarden_django.management.commands.flowwarden_workflows import Command

DOCS = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
PREFIX = "manage.py flowwarden_workflows "


def command_section() -> str:
    text = DOCS.read_text()
    section = text.split("\n## Command\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block, "the Command section has no sh block"
    return block.group(1)


def documented_usages() -> dict[str, str]:
    """Each subcommand's line of the section, by subcommand."""
    usages: dict[str, str] = {}
    for line in command_section().splitlines():
        assert line.startswith(PREFIX), line
        name, _, usage = line.removeprefix(PREFIX).partition(" ")
        assert name not in usages, f"{name} is documented twice"
        usages[name] = usage
    return usages


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = Command().create_parser("manage.py", "flowwarden_workflows")
    (actions,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(actions.choices)


def test_every_subcommand_is_documented_with_its_arguments() -> None:
    usages, parsers = documented_usages(), subcommands()
    assert sorted(usages) == sorted(parsers)
    for name, sub in parsers.items():
        usage = usages[name]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                long = [o for o in action.option_strings if o.startswith("--")]
                assert any(re.search(rf"{o}\b", usage) for o in long), (name, long, usage)
                if action.required:
                    assert not re.search(rf"\[{long[0]}\b", usage), (name, long, usage)
            else:
                assert action.metavar in usage, (name, action.metavar, usage)


def test_prune_shows_that_it_needs_a_rule() -> None:
    """``prune`` refuses to run without ``--keep-last`` or ``--older-than``: neither is
    shown as optional on its own."""
    usage = documented_usages()["prune"]
    assert "[--keep-last" not in usage and "[--older-than" not in usage
    assert "--keep-last N" in usage and "--older-than AGE" in usage
