"""What the ``flowwarden_*`` management commands share: sub-actions dispatched to
``handle_<action>``, user-supplied text checked before any query, and errors that
say what to fix instead of a traceback."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections
from django.utils.connection import ConnectionDoesNotExist


class ActionCommand(BaseCommand):
    """A command of sub-actions: ``manage.py <command> <action> ...`` runs
    ``handle_<action>(**options)``.

    Before it runs, every text option is checked for NUL characters (no id or name
    can hold one, and PostgreSQL refuses them in a query). A bad setting, an unknown
    database alias and a database error become ``CommandError``s.
    """

    #: What a database error is about, for its message.
    database_subject = "The tables"
    #: What to check when the database refuses.
    database_hint = "Has `manage.py migrate` been run?"

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        refuse_nul(options)
        try:
            getattr(self, f"handle_{action}")(**options)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except ConnectionDoesNotExist as exc:
            raise CommandError(
                f"{exc}. Use one of the DATABASES aliases: {', '.join(connections)}."
            ) from exc
        except DatabaseError as exc:
            raise CommandError(
                f"{self.database_subject_of(options)} could not be read or written: {exc}. "
                f"{self.database_hint}"
            ) from exc

    def database_subject_of(self, options: dict[str, Any]) -> str:
        """What a database error is about (override to name a store)."""
        return self.database_subject

    def write_table(self, lines: Sequence[str]) -> None:
        """Write a formatted table (``format_table``, ``fit_table``): its header
        styled as a heading, then its rows."""
        header, *rows = lines
        self.stdout.write(self.style.MIGRATE_HEADING(header))
        for row in rows:
            self.stdout.write(row)


def add_options(parser: Any, options: Mapping[str, Mapping[str, Any]]) -> None:
    """Add *options* to *parser*, in their order: each flag with its ``add_argument``
    keywords."""
    for flag, keywords in options.items():
        parser.add_argument(flag, **keywords)


def os_user() -> str:
    """Who runs the command (the operating system's user name), for audit records."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "unknown user"


def refuse_nul(options: dict[str, Any]) -> None:
    """``CommandError`` when an option's text holds a NUL character."""
    for name, value in options.items():
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(item, str) and "\x00" in item for item in values):
            option = name.replace("_", "-")
            raise CommandError(f"{option} holds a NUL character; no id, name or value can.")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _whole_number(text, 0)


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a duration in seconds (or with a unit: ``"500ms"``, ``"2m"``),
    more than 0."""
    from ..common.durations import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text!r}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 to 65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0 to 65535)")
    return value


def confirmed(command: BaseCommand, verb: str, *, yes: bool, interactive: bool = True) -> bool:
    """Whether to go on with *verb*: ``--yes`` (or ``--no-input``) says so, else the
    person at the terminal types ``yes``. Without a terminal, a ``CommandError`` says
    to pass ``--yes``."""
    if yes or not interactive:
        return True
    if sys.stdin is None or not sys.stdin.isatty():
        raise CommandError(
            f"{verb} needs a confirmation but stdin is not interactive; "
            "pass --yes to proceed without asking."
        )
    command.stdout.write("Type 'yes' to continue: ", ending="")
    command.stdout.flush()
    try:
        answer = input()
    except (EOFError, KeyboardInterrupt):
        answer = ""
        command.stdout.write("")
    if answer.strip() == "yes":
        return True
    command.stdout.write(f"{verb} cancelled.")
    return False
