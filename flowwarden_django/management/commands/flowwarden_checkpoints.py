"""``manage.py flowwarden_checkpoints``: list, show, reset or delete stream checkpoints.

A thin layer over the ``CheckpointStore`` API of one configured store alias.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from ...common.formatting import (
    NONE_TEXT,
    age_text,
    dump_json,
    format_table,
    mapping_text,
    timestamp_text,
)
from ...exceptions import InvalidCheckpointStoreError
from ...streams import Checkpoint, CheckpointStore, checkpoint_stores
from ...streams.operations.display import (
    checkpoint_to_json,
    copied_text,
    last_id_text,
    progress_time_text,
    short_token,
)
from ...streams.tokens import Token, token_from_json, token_to_json
from ..base import ActionCommand, confirmed

COMMAND = "manage.py flowwarden_checkpoints"
LIST_HEADERS = (
    "STREAM",
    "INSTANCE",
    "PROCESSED",
    "PROCESSED AGE",
    "SEEN",
    "SEEN AGE",
    "HEARTBEAT",
)


class Command(ActionCommand):
    """Operators' view of the change-stream checkpoints of one store."""

    help = (
        "Inspect and repair change-stream checkpoints: list them, show one, reset a "
        "stream's position or delete its record."
    )
    # A misconfigured alias must not stop operators from inspecting the others;
    # store errors are reported by this command itself.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        self._add_common(parser, top=True, with_no_input=True)
        actions = parser.add_subparsers(
            dest="action", required=True, title="actions", metavar="ACTION"
        )

        listing = actions.add_parser("list", help="Show every checkpoint of the store.")
        listing.add_argument("--json", action="store_true", help="Print a JSON list.")

        show = actions.add_parser("show", help="Show every field of one checkpoint.")
        show.add_argument("name", help="The stream name.")
        show.add_argument("--json", action="store_true", help="Print a JSON object.")

        reset = actions.add_parser(
            "reset",
            help="Clear a stream's position: its next start bootstraps from the current end "
            "of the stream (or from --seen-token). Keeps instance id and metadata.",
        )
        reset.add_argument("name", help="The stream name.")
        reset.add_argument(
            "--seen-token",
            metavar="EJSON",
            help='Start from this position instead, as Extended JSON: \'{"_data": "8263…"}\'.',
        )

        delete = actions.add_parser("delete", help="Delete a stream's checkpoint record.")
        delete.add_argument("name", help="The stream name.")

        for sub in (listing, show, reset, delete):
            self._add_common(sub, top=False, with_no_input=sub in (reset, delete))
        for sub in (reset, delete):
            sub.add_argument(
                "-y", "--yes", action="store_true", help="Do not ask for confirmation."
            )

    @staticmethod
    def _add_common(parser: argparse.ArgumentParser, *, top: bool, with_no_input: bool) -> None:
        # The options exist on the command and on each action, so both
        # `--store x list` and `list --store x` work; an action's copy has no
        # default, or it would overwrite the value given before the action.
        parser.add_argument(
            "--store",
            metavar="ALIAS",
            default="default" if top else argparse.SUPPRESS,
            help="The alias in FLOWWARDEN['CHECKPOINT_STORES'] (default: 'default').",
        )
        if with_no_input:
            parser.add_argument(
                "--no-input",
                "--noinput",
                action="store_false",
                dest="interactive",
                default=True if top else argparse.SUPPRESS,
                help="Do not ask for confirmation (same as --yes for reset and delete).",
            )

    database_hint = "If it is the ORM store, has `manage.py migrate` been run?"

    def database_subject_of(self, options: dict[str, Any]) -> str:
        return f"The checkpoint store {options['store']!r}"

    # -- actions -------------------------------------------------------------------

    def handle_list(self, *, store: str, json: bool, **options: Any) -> None:
        backend = self._store(store)
        if not backend.supports_listing:
            raise CommandError(
                f"Store {store!r} ({type(backend).__name__}) cannot list its checkpoints. "
                f"Use `{self._usage(store, 'show NAME')}` to see one stream."
            )
        checkpoints = backend.list_checkpoints()
        if json:
            self.stdout.write(dump_json([checkpoint_to_json(cp) for cp in checkpoints]))
            return
        if not checkpoints:
            self.stdout.write(f"No checkpoints in store {store!r}.")
            return
        now = timezone.now()
        rows = [
            (
                cp.stream_name,
                cp.instance_id or NONE_TEXT,
                short_token(cp.last_processed_token),
                age_text(cp.last_processed_at, now),
                short_token(cp.last_seen_token),
                age_text(cp.last_seen_at, now),
                age_text(cp.last_heartbeat_at, now),
            )
            for cp in checkpoints
        ]
        self.write_table(format_table(LIST_HEADERS, rows))

    def handle_show(self, *, store: str, name: str, json: bool, **options: Any) -> None:
        checkpoint = self._find(store, name)
        if json:
            self.stdout.write(dump_json(checkpoint_to_json(checkpoint)))
            return
        now = timezone.now()
        fields = [
            ("Stream", checkpoint.stream_name),
            ("Store", store),
            ("Instance id", checkpoint.instance_id or NONE_TEXT),
            ("Processed token", _token_text(checkpoint.last_processed_token)),
            ("Processed at", timestamp_text(checkpoint.last_processed_at, now)),
            ("Seen token", _token_text(checkpoint.last_seen_token)),
            ("Seen at", timestamp_text(checkpoint.last_seen_at, now)),
            ("Heartbeat at", timestamp_text(checkpoint.last_heartbeat_at, now)),
            ("Metadata", mapping_text(checkpoint.metadata)),
            *_initial_sync_fields(checkpoint.initial_sync, now),
        ]
        width = max(len(label) for label, _ in fields) + 1
        for label, value in fields:
            self.stdout.write(f"{self.style.MIGRATE_LABEL(f'{label}:'.ljust(width))}  {value}")

    def handle_reset(
        self, *, store: str, name: str, seen_token: str | None, **options: Any
    ) -> None:
        fresh = _parse_token(seen_token)
        current = self._find(store, name)
        backend = self._store(store)
        self.stdout.write(f"Reset checkpoint {name!r} in store {store!r}:")
        self.stdout.write(f"  processed token: {_token_text(current.last_processed_token)} -> —")
        self.stdout.write(
            f"  seen token:      {_token_text(current.last_seen_token)} -> {_token_text(fresh)}"
        )
        self.stdout.write(
            f"  heartbeat:       {_at_text(current)} -> {'now' if fresh is not None else '—'}"
        )
        self.stdout.write("  kept:            instance id and metadata")
        if fresh is None:
            self.stdout.write(_next_start_after_reset(name))
        else:
            self.stdout.write("The stream's next start resumes after the given seen token.")
        if not self._confirmed("Reset", **options):
            return
        backend.reset_after_history_lost(name, fresh, current.last_processed_token, timezone.now())
        after = backend.find(name)
        if after is not None and after.last_processed_token is not None:
            self.stderr.write(
                self.style.WARNING(
                    f"A consumer seems to be running on {name!r}: it wrote a newer processed "
                    f"anchor during the reset, which was kept "
                    f"({_token_text(after.last_processed_token)}). Stop the consumer and "
                    f"reset again to clear it."
                )
            )
            return
        self.stdout.write(self.style.SUCCESS(f"Checkpoint {name!r} reset in store {store!r}."))

    def handle_delete(self, *, store: str, name: str, **options: Any) -> None:
        current = self._find(store, name)
        backend = self._store(store)
        self.stdout.write(
            f"Delete checkpoint {name!r} from store {store!r} (processed token "
            f"{short_token(current.last_processed_token)}, seen token "
            f"{short_token(current.last_seen_token)}, instance id "
            f"{current.instance_id or NONE_TEXT})."
        )
        self.stdout.write("The stream's next start bootstraps from the current end of the stream.")
        if not self._confirmed("Delete", **options):
            return
        backend.delete(name)
        self.stdout.write(self.style.SUCCESS(f"Checkpoint {name!r} deleted from store {store!r}."))

    # -- helpers -------------------------------------------------------------------

    def _store(self, alias: str) -> CheckpointStore:
        try:
            return checkpoint_stores[alias]
        except InvalidCheckpointStoreError as exc:
            raise CommandError(f"{exc} (see FLOWWARDEN['CHECKPOINT_STORES'])") from exc

    def _find(self, alias: str, name: str) -> Checkpoint:
        backend = self._store(alias)
        checkpoint = backend.find(name)
        if checkpoint is None:
            message = f"No checkpoint for stream {name!r} in store {alias!r}."
            if backend.supports_listing:
                message += f" Run `{self._usage(alias, 'list')}` to see the streams."
            raise CommandError(message)
        return checkpoint

    @staticmethod
    def _usage(alias: str, action: str) -> str:
        store = "" if alias == "default" else f" --store {alias}"
        return f"{COMMAND}{store} {action}"

    def _confirmed(self, verb: str, *, yes: bool, interactive: bool, **options: Any) -> bool:
        return confirmed(self, verb, yes=yes, interactive=interactive)


def _parse_token(text: str | None) -> Token | None:
    if text is None:
        return None
    try:
        return token_from_json(text)
    except ValueError as exc:
        raise CommandError(f"--seen-token: {exc}") from exc


def _token_text(token: Token | None) -> str:
    return NONE_TEXT if token is None else token_to_json(token)


def _initial_sync_fields(
    progress: Mapping[str, Any] | None, now: datetime
) -> list[tuple[str, str]]:
    """The ``show`` lines of an initial sync's progress: its phase and reason, then
    indented copied / estimated, times, last ``_id`` and batch (one line without one)."""
    if not progress:
        return [("Initial sync", NONE_TEXT)]
    phase = str(progress.get("phase") or NONE_TEXT)
    reason = progress.get("reason")
    fields = [
        ("Initial sync", f"{phase} ({reason})" if reason else phase),
        ("  Copied", copied_text(progress)),
        ("  Started at", _moment_text(progress.get("started_at"), now)),
    ]
    if "updated_at" in progress:
        fields.append(("  Last batch at", _moment_text(progress.get("updated_at"), now)))
    fields += [
        ("  Finished at", _moment_text(progress.get("finished_at"), now)),
        ("  Last _id", last_id_text(progress.get("last_id"))),
        ("  Batch", NONE_TEXT if progress.get("batch") is None else str(progress["batch"])),
    ]
    return fields


def _moment_text(value: Any, now: datetime) -> str:
    """An ISO 8601 time from the progress record with its age (as it is if unparsable)."""
    return progress_time_text(value, lambda at: timestamp_text(at, now))


def _at_text(checkpoint: Checkpoint) -> str:
    at = checkpoint.last_heartbeat_at
    return NONE_TEXT if at is None else at.isoformat()


def _next_start_after_reset(name: str) -> str:
    """What the stream *name* does at its next start once its anchors are gone."""
    from ...streams.registry import stream_registry

    try:
        start = stream_registry.get(name).checkpoint.start_position
    except KeyError:
        start = None
    if start == "COPY_EXISTING":
        return (
            "The stream's next start copies the whole collection again (its start "
            "position is COPY_EXISTING), then streams the changes made since the copy "
            "began."
        )
    return (
        "The stream's next start bootstraps from the current end of the stream: "
        "events written until then are not delivered."
    )
