"""Hostile inputs at every edge that takes user data (issue 11, "Hardening at the edges").

Three surfaces, each a table of cases run on SQLite and on PostgreSQL:

* the REST API (``/api/v1/``): every hostile request is answered with a 4xx and a JSON
  body holding ``code`` and ``detail``, never a 5xx (page sizes DRF ignores by design,
  and odd positions in cursors only this site can sign, may be answered 200);
* the admin (approvals, runs and their snapshot pages, the dead-letter console, the
  streams console, changelist filters and search): a non-5xx answer (a form shown
  again with its error, a redirect with a message, 400/403/404);
* the management commands: a ``CommandError`` (argparse errors become one too under
  ``call_command``), never another exception;
* the approver's inbox (``/approvals/``): the decision form again with its error (a 400;
  the payload passes the API's validator and must be an object), 403/404, never a 5xx.

Every rejected input leaves the app's tables as they were (all models of
``flowwarden_django``, plus users, groups, tokens and the admin log); a refused
decision adds exactly one ``refused`` audit event and nothing else. A server error is
caught and counted rather than raised, so the summary of a surface names every
failing input; the test then fails with the details.
"""

from __future__ import annotations

import base64
import io
import json
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import pytest
from django.apps import apps
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, User
from django.core import signing
from django.core.management import CommandError, call_command
from django.db import router
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from flowwarden_django.api.pagination import CURSOR_SALT, encode_cursor
from flowwarden_django.common.user_input import MAX_PAYLOAD_BYTES, MAX_STATE_BYTES
from flowwarden_django.models import DeadLetter, StreamCheckpoint
from flowwarden_django.streams.registry import register_stream, stream_registry
from tests.api.helpers import API, make_people, pending, postgres_lane, token_client

pytest_plugins = ["tests.api.helpers"]  # the refunds and on_lane fixtures
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("lane", ["sqlite", postgres_lane()]),
]

#: The most seconds one input may take (deep nesting must be refused quickly).
QUICK = 5.0
UNKNOWN_UUID = "0b6f1d1e-8a2b-4c8e-9e7f-000000000000"
ADMIN = "/admin/flowwarden_django"
STREAM = "hostile-orders"
DISABLED_STREAM = "hostile-off"
CHECKPOINT = "hostile-cp"
ENTRY = "hostile-entry-1"


def nest(depth: int) -> str:
    """A JSON object nested *depth* levels deep."""
    return '{"a":' * depth + "1" + "}" * depth


# -- JSON texts every validator of person-given JSON must refuse ---------------------------

#: (name, text): refused as a fork state, a resume input and a decision payload alike.
BAD_JSON: list[tuple[str, str]] = [
    ("NaN", "NaN"),
    ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"),
    ("1e309", "1e309"),
    ("nested NaN", '{"x": NaN}'),
    ("nested 1e309", '{"x": 1e309}'),
    ("-1e309 in an array", '{"x": [-1e309]}'),
    ("nested 320 deep", nest(320)),
    ("nested 500 deep", nest(500)),
    ("nested 100000 deep", "[" * 100_000 + "]" * 100_000),
    ("escaped NUL", '{"x": "a\\u0000b"}'),
    ("escaped NUL in a key", '{"k\\u0000": 1}'),
    ("raw NUL", '{"x": "a\x00b"}'),
    ("unpaired surrogate", '{"x": "\\ud800"}'),
    ("unpaired low surrogate key", '{"\\udfff": 1}'),
    ("malformed", '{"x": '),
    ("trailing garbage", '{"x": 1} tail'),
    ("single quotes", "{'x': 1}"),
    ("empty", ""),
    ("5000-digit number", '{"x": ' + "9" * 5000 + "}"),
    ("byte order mark", "\ufeff{}"),
]
#: ``BAD_JSON`` as a typed decision payload (the admin form, ``--payload``), where empty
#: text means "no payload".
BAD_PAYLOAD_TEXTS = [(name, text) for name, text in BAD_JSON if text.strip()]
#: Valid JSON that is not an object: refused as a decision payload only.
NOT_OBJECTS: list[tuple[str, str]] = [
    ("array [1,2]", "[1,2]"),
    ("string", '"text"'),
    ("number", "5"),
    ("boolean", "true"),
]
OVER_1_MIB_STATE = '"' + "x" * (MAX_STATE_BYTES + 16) + '"'
OVER_64_KIB_PAYLOAD = '{"x": "' + "y" * (MAX_PAYLOAD_BYTES + 16) + '"}'


# -- what a case is, and the world it runs in ------------------------------------------------


@dataclass
class World:
    """The objects the cases point at, and a client per user."""

    approval: str
    run: str
    snapshot: str
    cursor: str
    clients: dict[str, Client]

    def fill(self, text: str) -> str:
        """*text* with ``{approval}``, ``{run}``, ``{snapshot}``, ``{cursor}`` (a valid
        cursor), ``{cursor-signature}`` and ``{cursor-payload}`` (tampered) replaced."""
        values = {
            "approval": self.approval,
            "run": self.run,
            "snapshot": self.snapshot,
            "cursor-signature": tampered(self.cursor, len(self.cursor) - 1),
            "cursor-payload": tampered(self.cursor, 3),
            "cursor": self.cursor,
        }
        for name, value in values.items():
            text = text.replace("{" + name + "}", value)
        return text


@dataclass
class Tally:
    """What one surface's cases did."""

    surface: str
    lane: str
    inputs: int = 0
    errors: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def finish(self) -> None:
        print(
            f"hostile inputs [{self.surface}, {self.lane}]: {self.inputs} inputs, "
            f"{len(self.errors)} server errors, {len(self.changed)} rows changed by a "
            f"rejected input, {len(self.wrong)} unexpected answers"
        )
        for kind, items in (
            ("SERVER ERROR", self.errors),
            ("ROWS CHANGED", self.changed),
            ("UNEXPECTED", self.wrong),
        ):
            for item in items:
                print(f"  {kind}: {item}")
        problems = self.errors + self.changed + self.wrong
        assert not self.errors and not self.changed, "\n".join(problems)
        assert not self.wrong, "\n".join(self.wrong)


def short(value: Any, width: int = 90) -> str:
    text = repr(value)
    return text if len(text) <= width else f"{text[: width - 20]}...{text[-12:]} ({len(text)})"


def last_lines(exc: BaseException, count: int = 4) -> str:
    lines = "".join(traceback.format_exception(exc)).strip().splitlines()
    return " | ".join(line.strip() for line in lines[-count:])


# -- the tables' contents ------------------------------------------------------------------


def tracked_models() -> list[Any]:
    own = list(apps.get_app_config("flowwarden_django").get_models())
    return [*own, User, Group, Token, LogEntry]


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def table_contents() -> dict[str, Counter[tuple[str, ...]]]:
    """Every row of the tracked tables, as ``{model label: Counter(row)}`` (each row a
    tuple of its fields' reprs, read where the router reads the model)."""
    contents = {}
    for model in tracked_models():
        names = [f.attname for f in model._meta.concrete_fields]
        rows = model._default_manager.using(router.db_for_read(model)).values_list(*names)
        contents[model._meta.label] = Counter(tuple(repr(_plain(v)) for v in row) for row in rows)
    return contents


EVENTS = "flowwarden_django.ApprovalEvent"


def row_changes(
    before: dict[str, Counter[tuple[str, ...]]],
    after: dict[str, Counter[tuple[str, ...]]],
    *,
    refusal: bool,
) -> str | None:
    """``None`` when the tables are as a rejected input must leave them (plus one
    ``refused`` event for a refusal), else what changed."""
    changed = {label for label in before if before[label] != after[label]}
    if refusal:
        from flowwarden_django.models import ApprovalEvent

        action = [f.attname for f in ApprovalEvent._meta.concrete_fields].index("action")
        added = list((after[EVENTS] - before[EVENTS]).elements())
        removed = list((before[EVENTS] - after[EVENTS]).elements())
        refused = len(added) == 1 and added[0][action] == repr("refused")
        if not refused or removed:
            return f"expected one 'refused' event, got added={added} removed={removed}"
        changed.discard(EVENTS)
    if not changed:
        return None
    details = []
    for label in sorted(changed):
        plus = sum((after[label] - before[label]).values())
        minus = sum((before[label] - after[label]).values())
        details.append(f"{label} +{plus}/-{minus}")
    return ", ".join(details)


# -- the world --------------------------------------------------------------------------------


@pytest.fixture
def world(lane: str, on_lane: None, refunds: Any) -> Iterator[World]:
    """A run waiting for alice's (or finance's) approval, a dead letter, a checkpoint,
    two declared streams, and clients: API tokens (``t:<user>``), admin sessions
    (``s:<user>``; ``csrf:<user>`` with CSRF checks on) and ``anon``."""
    people = make_people()
    for name in ("alice", "carol", "viewer", "forker", "auditor"):
        user = getattr(people, name)
        user.is_staff = True
        user.save()
    approval = pending(refunds)
    snapshot = refunds.workflow(approval.coordination_id).store.load(approval.snapshot_id)
    now = timezone.now()
    DeadLetter.objects.create(
        id=ENTRY,
        stream_name=STREAM,
        operation_type="insert",
        error_type="myapp.errors.PaymentRejected",
        error_message="payment service rejected order 42",
        first_attempt_at=now,
        last_attempt_at=now,
        created_at=now,
    )
    StreamCheckpoint.objects.create(stream_name=CHECKPOINT, instance_id="worker-1")
    register_stream(STREAM, "orders", on_insert=lambda doc: None)
    register_stream(DISABLED_STREAM, "orders", on_insert=lambda doc: None, enabled=False)
    clients: dict[str, Client] = {"anon": Client(), "csrf-anon": Client(enforce_csrf_checks=True)}
    for name in ("alice", "bob", "carol", "viewer", "forker", "auditor", "admin"):
        user = User.objects.get(username=name)
        clients[f"t:{name}"] = token_client(user)
        clients[f"s:{name}"] = session = Client()
        session.force_login(user)
        clients[f"csrf:{name}"] = strict = Client(enforce_csrf_checks=True)
        strict.force_login(user)
    try:
        yield World(
            approval=str(approval.pk),
            run=approval.coordination_id,
            snapshot=approval.snapshot_id,
            cursor=encode_cursor(snapshot),
            clients=clients,
        )
    finally:
        stream_registry.unregister(STREAM)
        stream_registry.unregister(DISABLED_STREAM)


# == the REST API ===============================================================================


@dataclass(frozen=True)
class ApiCase:
    """One request: ``path`` under ``/api/v1`` (with ``{approval}`` ... placeholders);
    ``body`` sent as is with ``content_type``; ``who`` a client of the world;
    ``status`` the expected status (``None``: any 4xx), ``code`` the body's code,
    ``field`` a field the 400 must name; ``refusal``: a refused decision, audited."""

    name: str
    method: str
    path: str
    body: str | bytes | None = None
    content_type: str = "application/json"
    who: str = "t:admin"
    status: int | tuple[int, ...] | None = None
    code: str | None = None
    field: str | None = None
    refusal: bool = False
    headers: tuple[tuple[str, str], ...] = ()


def decision_body(text: str) -> str:
    return '{"comment": "hostile", "payload": ' + text + "}"


def fork_body(text: str) -> str:
    return '{"state": ' + text + "}"


APPROVE = "/approvals/{approval}/approve/"
REJECT = "/approvals/{approval}/reject/"
FORK = "/snapshots/{snapshot}/fork/"

#: Path segments that name nothing (already percent-encoded where needed).
HOSTILE_IDS: list[tuple[str, str]] = [
    ("NUL", "%00"),
    ("NUL inside", "abc%00def"),
    ("65 chars", "a" * 65),
    ("256 chars", "b" * 256),
    ("4000 chars", "c" * 4000),
    ("dot dot", ".."),
    ("encoded traversal", "..%5C..%5Cwindows%5Cwin.ini"),
    ("emoji", quote("🦄💥", safe="")),
    ("broken UTF-8", "%ED%A0%80"),
    ("SQL", quote("' OR '1'='1' --", safe="")),
    ("SQL union", quote("1 UNION SELECT password FROM auth_user", safe="")),
    ("percent", "%25"),
    ("newline", "a%0Ab"),
    ("not a UUID", "not-a-uuid"),
    ("unknown UUID", UNKNOWN_UUID),
    ("HTML", quote("<img src=x onerror=alert(1)>", safe="")),
]
POST_IDS = [
    case
    for case in HOSTILE_IDS
    if case[0]
    in {"NUL", "NUL inside", "65 chars", "256 chars", "dot dot", "emoji"}
    | {"SQL", "not a UUID", "unknown UUID"}
]


def signed_cursor(mark: Any, *, purpose: str = CURSOR_SALT, secret: str | None = None) -> str:
    """*mark* sealed as the site seals cursors (with another *purpose* or *secret*:
    as another listing or another site would)."""
    from django.test import override_settings

    from flowwarden_django.common.sealing import seal

    payload = json.dumps(mark).encode()
    if secret is None:
        return seal(payload, purpose=purpose)
    with override_settings(SECRET_KEY=secret):
        return seal(payload, purpose=purpose)


def django_signed_cursor(mark: Any) -> str:
    """The readable, signed cursor an earlier version made: no cursor any more."""
    return signing.dumps(mark, salt=CURSOR_SALT, compress=True)


def unsigned_cursor(mark: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(mark).encode()).decode()


def tampered(cursor: str, at: int) -> str:
    """*cursor* with the character at *at* changed."""
    char = "A" if cursor[at] != "A" else "B"
    return cursor[:at] + char + cursor[at + 1 :]


#: (name, cursor text; "{cursor}" is a valid cursor of this site).
CURSORS: list[tuple[str, str]] = [
    ("garbage", "abc"),
    ("percent signs", "%%%"),
    ("NUL", "\x00abc"),
    ("5000 chars", "A" * 5000),
    ("valid plus a tail", "{cursor}" + "x" * 50),
    ("colon only", ":"),
    (
        "old unsigned format, year 9999 at -14:00",
        unsigned_cursor({"id": "a", "c": "b", "s": 1, "t": "9999-12-31T23:59:59-14:00"}),
    ),
    (
        "unsigned list, year 9999 at -14:00",
        unsigned_cursor(["a", "b", 1, "9999-12-31T23:59:59-14:00"]),
    ),
    (
        "signed with another salt",
        signed_cursor(["a", "b", 1, "2030-01-01T00:00:00+00:00"], purpose="another"),
    ),
    (
        "signed with another key",
        signed_cursor(["a", "b", 1, "2030-01-01T00:00:00+00:00"], secret="not-the-secret"),
    ),
    (
        "the old readable format, signed by the site",
        django_signed_cursor(["a", "b", 1, "2030-01-01T00:00:00+00:00"]),
    ),
    ("signed by the site: an object", signed_cursor({"id": "a"})),
    ("signed by the site: two items", signed_cursor(["a", "b"])),
    ("signed by the site: not a date", signed_cursor(["a", "b", 1, "not a date"])),
    ("signed by the site: a number for the date", signed_cursor(["a", "b", 1, 5])),
    ("tampered signature", "{cursor-signature}"),
    ("tampered payload", "{cursor-payload}"),
]
#: Well-formed positions signed with this site's key (only the site can make them):
#: whatever they name, the answer is a page or a 400, never a 5xx.
SITE_CURSORS: list[tuple[str, str]] = [
    ("year 9999 at -14:00", signed_cursor(["a", "b", 1, "9999-12-31T23:59:59-14:00"])),
    ("year 1 at +14:00", signed_cursor(["a", "b", 1, "0001-01-01T00:00:00+14:00"])),
    ("seq 10**30", signed_cursor(["a", "b", 10**30, "2030-01-01T00:00:00+00:00"])),
    ("id with NUL", signed_cursor(["a\x00", "b\x00", 1, "2030-01-01T00:00:00+00:00"])),
]


def api_cases() -> list[ApiCase]:
    cases: list[ApiCase] = []
    add = cases.append

    # Decision bodies, by alice (who may decide): 400, nothing decided.
    for name, text in BAD_JSON + NOT_OBJECTS:
        add(
            ApiCase(
                f"approve, payload {name}",
                "post",
                APPROVE,
                decision_body(text),
                who="t:alice",
                status=400,
            )
        )
    for name, text in [
        ("null body", "null"),
        ("string body", '"approve"'),
        ("number body", "5"),
        ("array body [1,2]", "[1,2]"),
        ("boolean body", "true"),
        ("comment true", '{"comment": true}'),
        ("comment null", '{"comment": null}'),
        ("comment object", '{"comment": {"a": 1}}'),
        ("comment array", '{"comment": ["x"]}'),
        ("comment 2001 chars", '{"comment": "' + "x" * 2001 + '"}'),
        ("comment 100000 chars", '{"comment": "' + "x" * 100_000 + '"}'),
        ("comment with NUL", '{"comment": "a\\u0000b"}'),
        ("comment with a surrogate", '{"comment": "\\ud800"}'),
        ("payload over 64 KiB", '{"payload": ' + OVER_64_KIB_PAYLOAD + "}"),
        ("payload null, comment NUL", '{"payload": null, "comment": "\\u0000"}'),
    ]:
        add(ApiCase(f"approve, {name}", "post", APPROVE, text, who="t:alice", status=400))
    # Over Django's DATA_UPLOAD_MAX_MEMORY_SIZE: 413 with the usual error body.
    big = '{"comment": "' + "z" * (3 << 20) + '"}'
    add(ApiCase("approve, 3 MiB body", "post", APPROVE, big, who="t:alice", status=413))
    for name, text in [
        ("payload [1,2]", '{"payload": [1,2]}'),
        ("payload NaN", decision_body("NaN")),
        ("payload 500 deep", decision_body(nest(500))),
        ("payload 1e309", '{"payload": {"x": 1e309}}'),
        ("payload -Infinity", '{"payload": {"x": -Infinity}}'),
        ("comment 2001 chars", '{"comment": "' + "x" * 2001 + '"}'),
    ]:
        add(ApiCase(f"reject by a superuser, {name}", "post", REJECT, text, status=400))

    # Fork bodies, by forker (who may fork): 400, nothing forked.
    for name, text in BAD_JSON:
        add(
            ApiCase(
                f"fork, state {name}", "post", FORK, fork_body(text), who="t:forker", status=400
            )
        )
    for name, text, code in [
        ("state over 1 MiB", fork_body(OVER_1_MIB_STATE), "invalid"),
        (
            "body over the limit",
            fork_body('"' + "x" * (MAX_STATE_BYTES + 8192) + '"'),
            "parse_error",
        ),
        ("no state", "{}", "invalid"),
        ("null body", "null", "invalid"),
        ("array body", "[1,2]", "invalid"),
        ("string body", '"state"', "invalid"),
    ]:
        add(ApiCase(f"fork, {name}", "post", FORK, text, who="t:forker", status=400, code=code))
    add(
        ApiCase(
            "fork, unknown store",
            "post",
            FORK + "?store=nope",
            fork_body("1"),
            who="t:forker",
            status=400,
            field="store",
        )
    )

    # Content types and encodings (alice's decision, the forker's fork).
    for name, body, content_type, status in [
        ("multipart", None, "multipart", 415),
        ("form-encoded", "comment=x&payload=1", "application/x-www-form-urlencoded", 415),
        ("text/plain", "{}", "text/plain", 415),
        ("XML", "<decision/>", "application/xml", 415),
        ("vendor JSON", "{}", "application/vnd.api+json", 415),
        ("no content type", "{}", "", 415),
        # Django ignores an unknown charset (UTF-8 is read): the bad payload is refused.
        ("unknown charset", '{"payload": [1]}', "application/json; charset=bogus", 400),
        (
            "UTF-16 charset on UTF-8 bytes",
            '{"comment": "x"}',
            "application/json; charset=utf-16",
            400,
        ),
        ("invalid UTF-8", b'{"comment": "\xff\xfe"}', "application/json", 400),
        ("Latin-1 bytes", b'{"comment": "caf\xe9"}', "application/json", 400),
    ]:
        add(
            ApiCase(
                f"approve, {name}",
                "post",
                APPROVE,
                body,
                content_type,
                who="t:alice",
                status=status,
            )
        )
    add(
        ApiCase(
            "fork, form-encoded",
            "post",
            FORK,
            "state=1",
            "application/x-www-form-urlencoded",
            who="t:forker",
            status=415,
        )
    )
    add(
        ApiCase(
            "fork, text/plain",
            "post",
            FORK,
            '{"state": 1}',
            "text/plain",
            who="t:forker",
            status=415,
        )
    )

    # Who may do what: refusals are audited, the others change nothing.
    for name, path, body, status, code, refusal in [
        ("auditor approves", APPROVE, "{}", 403, "approval_forbidden", True),
        (
            "auditor rejects, comment 3000 chars",
            REJECT,
            '{"comment": "' + "x" * 3000 + '"}',
            403,
            "approval_forbidden",
            True,
        ),
        (
            "auditor approves, payload [1,2]",
            APPROVE,
            '{"payload": [1,2]}',
            403,
            "approval_forbidden",
            True,
        ),
        ("auditor approves, payload NaN", APPROVE, decision_body("NaN"), 400, "parse_error", False),
    ]:
        add(
            ApiCase(
                name, "post", path, body, who="t:auditor", status=status, code=code, refusal=refusal
            )
        )
    add(
        ApiCase(
            "auditor approves, text/plain",
            "post",
            APPROVE,
            "{}",
            "text/plain",
            who="t:auditor",
            status=415,
        )
    )
    for who in ("t:carol", "t:viewer", "t:forker"):
        add(
            ApiCase(
                f"{who} approves an approval it cannot see",
                "post",
                APPROVE,
                "{}",
                who=who,
                status=404,
                code="approval_not_found",
            )
        )
    add(
        ApiCase(
            "viewer forks",
            "post",
            FORK,
            fork_body("1"),
            who="t:viewer",
            status=403,
            code="fork_forbidden",
        )
    )
    add(
        ApiCase(
            "carol forks",
            "post",
            FORK,
            fork_body("1"),
            who="t:carol",
            status=404,
            code="snapshot_not_found",
        )
    )
    for who, path, body in [
        ("csrf:alice", APPROVE, "{}"),
        ("csrf:auditor", APPROVE, "{}"),
        ("csrf:admin", REJECT, "{}"),
        ("csrf:forker", FORK, fork_body("1")),
    ]:
        add(
            ApiCase(
                f"session POST without a CSRF token ({who})",
                "post",
                path,
                body,
                who=who,
                status=403,
                code="permission_denied",
            )
        )
    add(
        ApiCase(
            "anonymous approve",
            "post",
            APPROVE,
            "{}",
            who="anon",
            status=401,
            code="not_authenticated",
        )
    )
    add(ApiCase("anonymous list", "get", "/runs/", who="anon", status=401))
    for name, header, status in [
        ("unknown token", "Token bogus", 401),
        ("token with NUL", "Token abc\x00def", 401),
        ("token with spaces", "Token a b", 401),
        ("empty token", "Token", 401),
        ("token 5000 chars", "Token " + "k" * 5000, 401),
        ("token not ASCII", "Token caf\xe9", 401),
    ]:
        add(
            ApiCase(
                f"approve, {name}",
                "post",
                APPROVE,
                "{}",
                who="anon",
                status=status,
                headers=(("Authorization", header),),
            )
        )
    # (HTML is the browsable API, for a person's browser: tests/api/test_runs.py.)
    for name, accept in [("XML only", "application/xml")]:
        add(
            ApiCase(
                f"Accept {name}",
                "get",
                "/runs/",
                status=406,
                code="not_acceptable",
                headers=(("Accept", accept),),
            )
        )
    add(ApiCase("?format=xml", "get", "/runs/?format=xml", status=404))

    # Methods the endpoints do not have.
    for method, path in [
        ("put", "/approvals/{approval}/"),
        ("patch", "/snapshots/{snapshot}/"),
        ("delete", "/runs/{run}/"),
        ("get", APPROVE),
        ("delete", REJECT),
        ("post", "/runs/"),
        ("post", "/snapshots/"),
        ("put", FORK),
    ]:
        add(
            ApiCase(
                f"{method.upper()} {path}",
                method,
                path,
                "{}",
                status=405,
                code="method_not_allowed",
            )
        )

    # Ids that name nothing.
    for name, segment in HOSTILE_IDS:
        for kind, code in (
            ("runs", "run_not_found"),
            ("snapshots", "snapshot_not_found"),
            ("approvals", "approval_not_found"),
        ):
            add(
                ApiCase(
                    f"GET {kind} id {name}", "get", f"/{kind}/{segment}/", status=404, code=code
                )
            )
    for name, segment in POST_IDS:
        add(
            ApiCase(
                f"fork id {name}",
                "post",
                f"/snapshots/{segment}/fork/",
                fork_body("1"),
                who="t:forker",
                status=404,
                code="snapshot_not_found",
            )
        )
        add(
            ApiCase(
                f"approve id {name}",
                "post",
                f"/approvals/{segment}/approve/",
                "{}",
                who="t:alice",
                status=404,
                code="approval_not_found",
            )
        )
        add(
            ApiCase(
                f"reject id {name}",
                "post",
                f"/approvals/{segment}/reject/",
                "{}",
                status=404,
                code="approval_not_found",
            )
        )

    # Query parameters.
    long_c = "c" * 256
    for query, status, fld in [
        ("/runs/?status=bogus", 400, "status"),
        ("/runs/?status=%00", 400, "status"),
        ("/runs/?workflow=%00", 400, "workflow"),
        ("/runs/?page=0", 404, None),
        ("/runs/?page=-1", 404, None),
        ("/runs/?page=abc", 404, None),
        ("/runs/?page=1e3", 404, None),
        ("/runs/?page=99999999999999999999999", 404, None),
        ("/runs/?page=%00", 404, None),
        ("/approvals/?status=bogus", 400, "status"),
        ("/approvals/?status=" + quote("' OR 1=1 --"), 400, "status"),
        ("/approvals/?coordination=%00", 400, "coordination"),
        ("/approvals/?workflow=a%00", 400, "workflow"),
        ("/approvals/?page=0", 404, None),
        ("/approvals/mine/?page=abc", 404, None),
        ("/approvals/mine/?status=%00", 400, "status"),
        ("/snapshots/?since=abc", 400, "since"),
        ("/snapshots/?since=%00", 400, "since"),
        ("/snapshots/?since=99999-01-01T00:00:00Z", 400, "since"),
        ("/snapshots/?since=0001-01-01T00:00:00%2B01:00", 400, "since"),
        ("/snapshots/?until=9999-12-31T23:59:59-14:00", 400, "until"),
        ("/snapshots/?since=2030-01-01T00:00:00Z&until=2020-01-01T00:00:00Z", 400, "until"),
        ("/snapshots/?order=sideways", 400, "order"),
        ("/snapshots/?order=%00", 400, "order"),
        ("/snapshots/?store=nope", 400, "store"),
        ("/snapshots/?store=%00", 400, "store"),
        ("/snapshots/?store=..%2F..%2Fetc", 400, "store"),
        ("/snapshots/?coordination=" + long_c, 400, "coordination"),
        ("/snapshots/?coordination=%00", 400, "coordination"),
        ("/snapshots/?agent=%00", 400, "agent"),
        ("/snapshots/?agent=" + "a" * 300, 400, "agent"),
        ("/snapshots/{snapshot}/?store=nope", 400, "store"),
        ("/snapshots/{snapshot}/?store=%00", 400, "store"),
    ]:
        code = "invalid" if status == 400 else "not_found"
        add(ApiCase(f"GET {query[:70]}", "get", query, status=status, code=code, field=fld))
    for name, text in CURSORS:
        add(
            ApiCase(
                f"cursor {name}",
                "get",
                "/snapshots/?cursor=" + quote(text, safe="{}"),
                status=400,
                code="invalid",
                field="cursor",
            )
        )
    for name, text in SITE_CURSORS:
        add(
            ApiCase(
                f"cursor signed by the site, {name}",
                "get",
                "/snapshots/?cursor=" + quote(text, safe=""),
                status=(200, 400),
            )
        )
    # Page sizes DRF ignores by design (the default size is used): 200, nothing changes.
    for query in [
        "/snapshots/?page_size=-3",
        "/snapshots/?page_size=abc",
        "/snapshots/?page_size=99999999999999999999",
        "/snapshots/?page_size=%00",
        "/runs/?page_size=-1",
        "/runs/?page_size=1e9",
        "/approvals/?page_size=0",
        "/approvals/?page_size=%00",
    ]:
        add(ApiCase(f"GET {query} (ignored)", "get", query, status=200))
    return cases


API_CASES = api_cases()


def api_request(world: World, case: ApiCase) -> Any:
    """Send *case*; a body goes out as its exact bytes (UTF-8 for text), whatever
    charset its content type names."""
    client = world.clients[case.who]
    path = API + world.fill(case.path)
    headers = dict(case.headers)
    if case.method == "get":
        return client.get(path, headers=headers)
    if case.content_type == "multipart":
        return client.post(path, {"comment": "x", "payload": "[1,2]"}, headers=headers)
    body = world.fill(case.body) if isinstance(case.body, str) else case.body
    data = body.encode("utf-8") if isinstance(body, str) else body or b""
    return client.generic(
        case.method.upper(), path, data, content_type=case.content_type, headers=headers
    )


def check_api_answer(case: ApiCase, response: Any) -> str | None:
    """Why *response* is not what *case* expects (``None``: it is)."""
    status = response.status_code
    if isinstance(case.status, tuple):
        if status not in case.status:
            return f"status {status}, expected one of {case.status}"
    elif case.status is not None and status != case.status:
        return f"status {status}, expected {case.status}: {short(response.content, 200)}"
    if case.status is None and not 400 <= status < 500:
        return f"status {status}, expected a 4xx"
    if status == 200:
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        return f"not JSON: {short(response.content, 120)}"
    if not isinstance(body, dict) or "code" not in body or "detail" not in body:
        return f"no code/detail: {short(body, 200)}"
    if case.code is not None and body["code"] != case.code:
        return f"code {body['code']!r}, expected {case.code!r}: {short(body, 200)}"
    if case.field is not None and case.field not in body:
        return f"no {case.field!r} field error: {short(body, 200)}"
    return None


def run_cases(
    tally: Tally,
    cases: list[Any],
    attempt: Callable[[Any], str | None],
) -> None:
    """Run each case through *attempt* (it returns why the answer is wrong, or
    ``None``), with the tables compared before and after."""
    for case in cases:
        tally.inputs += 1
        before = table_contents()
        started = time.monotonic()
        label = f"{case.name}"
        try:
            why = attempt(case)
        except Exception as exc:
            tally.errors.append(f"{label}: {type(exc).__name__}: {last_lines(exc)}")
            why = None
        elapsed = time.monotonic() - started
        if why:
            tally.wrong.append(f"{label}: {why}")
        if elapsed > QUICK:
            tally.wrong.append(f"{label}: took {elapsed:.1f}s")
        change = row_changes(before, table_contents(), refusal=case.refusal)
        if change:
            tally.changed.append(f"{label}: {change}")


def test_api(lane: str, world: World) -> None:
    tally = Tally("api", lane)

    def attempt(case: ApiCase) -> str | None:
        response = api_request(world, case)
        if response.status_code >= 500:
            return f"status {response.status_code}"
        return check_api_answer(case, response)

    run_cases(tally, API_CASES, attempt)
    tally.finish()


# == the admin ===================================================================================


@dataclass(frozen=True)
class AdminCase:
    """One admin request. ``data``: form fields (POST) or ``None``; ``expect``: the
    allowed statuses; ``context``: a template variable the answer must set (the
    error shown with the form); ``refusal``: a refused decision, audited."""

    name: str
    method: str
    path: str
    data: dict[str, Any] | None = None
    who: str = "s:admin"
    expect: tuple[int, ...] = (200, 302, 400, 403, 404)
    context: str | None = None
    refusal: bool = False


APPROVAL_PAGE = ADMIN + "/approval/{approval}/"
RUN_PAGE = ADMIN + "/workflowrun/{run}/"
FORK_PAGE = RUN_PAGE + "snapshots/{snapshot}/fork/"
APPROVALS = ADMIN + "/approval/"
ADMIN_IDS: list[tuple[str, str]] = [
    ("NUL", "%00"),
    ("underscore escape _00", "_00"),
    ("not a UUID", "not-a-uuid"),
    ("unknown UUID", UNKNOWN_UUID),
    ("300 chars", "d" * 300),
    ("emoji", quote("🦄", safe="")),
    ("dot dot", ".."),
    ("SQL", quote("'; DROP TABLE flowwarden_django_approval; --", safe="")),
]


def admin_cases() -> list[AdminCase]:
    cases: list[AdminCase] = []
    add = cases.append
    approve, reject = APPROVAL_PAGE + "approve/", APPROVAL_PAGE + "reject/"

    # One approval's decision form: shown again with the error, nothing decided.
    for name, text in [*BAD_PAYLOAD_TEXTS, *NOT_OBJECTS, ("over 64 KiB", OVER_64_KIB_PAYLOAD)]:
        add(
            AdminCase(
                f"approve, payload {name}",
                "post",
                approve,
                {"post": "yes", "payload": text},
                who="s:alice",
                expect=(200,),
                context="payload_error",
            )
        )
    for name, comment in [
        ("2001 chars", "x" * 2001),
        ("100000 chars", "x" * 100_000),
        ("NUL", "a\x00b"),
    ]:
        add(
            AdminCase(
                f"approve, comment {name}",
                "post",
                approve,
                {"post": "yes", "comment": comment},
                who="s:alice",
                expect=(200,),
                context="comment_error",
            )
        )
    for name, data, context in [
        ("payload [1,2]", {"payload": "[1,2]"}, "payload_error"),
        ("payload NaN", {"payload": "NaN"}, "payload_error"),
        ("payload 500 deep", {"payload": nest(500)}, "payload_error"),
        ("comment 2001 chars", {"comment": "y" * 2001}, "comment_error"),
        ("comment NUL and payload", {"comment": "\x00", "payload": "{}"}, "comment_error"),
    ]:
        add(
            AdminCase(
                f"reject by a superuser, {name}",
                "post",
                reject,
                {"post": "yes", **data},
                expect=(200,),
                context=context,
            )
        )
    # Who may decide.
    add(
        AdminCase(
            "auditor approves",
            "post",
            approve,
            {"post": "yes"},
            who="s:auditor",
            expect=(403,),
            refusal=True,
        )
    )
    add(
        AdminCase(
            "auditor rejects, comment 3000 chars",
            "post",
            reject,
            {"post": "yes", "comment": "x" * 3000},
            who="s:auditor",
            expect=(403,),
            refusal=True,
        )
    )
    add(
        AdminCase(
            "carol approves (cannot see it)",
            "post",
            approve,
            {"post": "yes"},
            who="s:carol",
            expect=(302,),
        )
    )
    add(
        AdminCase(
            "approve without a CSRF token",
            "post",
            approve,
            {"post": "yes"},
            who="csrf:alice",
            expect=(403,),
        )
    )
    add(AdminCase("anonymous approve", "post", approve, {"post": "yes"}, who="anon", expect=(302,)))
    add(
        AdminCase(
            "bob approves a 3 MiB form",
            "post",
            approve,
            {"post": "yes", "comment": "z" * (3 << 20)},
            who="s:bob",
            expect=(302, 400),
        )
    )
    for name, segment in ADMIN_IDS:
        add(
            AdminCase(
                f"approve id {name}",
                "post",
                f"{APPROVALS}{segment}/approve/",
                {"post": "yes"},
                expect=(302, 404),
            )
        )
        add(
            AdminCase(
                f"approval page id {name}",
                "get",
                f"{APPROVALS}{segment}/change/",
                expect=(302, 404),
            )
        )

    # The bulk actions.
    def bulk(action: str, selected: list[str], **extra: Any) -> dict[str, Any]:
        return {"action": action, "post": "yes", "_selected_action": selected, **extra}

    for name, action, comment in [
        ("approve, comment 2001 chars", "approve_selected", "x" * 2001),
        ("reject, comment 50000 chars", "reject_selected", "x" * 50_000),
        ("approve, comment NUL", "approve_selected", "ok\x00"),
    ]:
        add(
            AdminCase(
                f"bulk {name}",
                "post",
                APPROVALS,
                bulk(action, ["{approval}"], comment=comment),
                who="s:alice",
                expect=(200,),
                context="comment_error",
            )
        )
    for name, selected in [
        ("not a UUID", ["not-a-uuid"]),
        ("NUL", ["\x00"]),
        ("unknown UUID", [UNKNOWN_UUID]),
        ("300 chars", ["e" * 300]),
        ("mixed with the real one", ["{approval}", "not-a-uuid"]),
    ]:
        add(
            AdminCase(
                f"bulk approve, selected {name}",
                "post",
                APPROVALS,
                bulk("approve_selected", selected),
                expect=(200, 302),
            )
        )
    add(
        AdminCase(
            "bulk, unknown action",
            "post",
            APPROVALS,
            bulk("drop_table", ["{approval}"]),
            expect=(200, 302),
        )
    )
    add(
        AdminCase(
            "bulk approve by the auditor",
            "post",
            APPROVALS,
            bulk("approve_selected", ["{approval}"]),
            who="s:auditor",
            expect=(200, 302),
        )
    )
    add(
        AdminCase(
            "bulk approve by carol (sees nothing)",
            "post",
            APPROVALS,
            bulk("approve_selected", ["{approval}"]),
            who="s:carol",
            expect=(200, 302),
        )
    )
    add(
        AdminCase(
            "bulk approve without a CSRF token",
            "post",
            APPROVALS,
            bulk("approve_selected", ["{approval}"]),
            who="csrf:admin",
            expect=(403,),
        )
    )

    # Forking a run from a snapshot: the form is shown again with the error.
    for name, text in [*BAD_JSON, ("over 1 MiB", OVER_1_MIB_STATE)]:
        add(
            AdminCase(
                f"fork, state {name}",
                "post",
                FORK_PAGE,
                {"state": text},
                expect=(200,),
                context="error",
            )
        )
    for name, text in [
        ("NaN", "NaN"),
        ("1e309", "1e309"),
        ("320 deep", nest(320)),
        ("escaped NUL", '"\\u0000"'),
    ]:
        add(
            AdminCase(
                f"fork, confirmed, state {name}",
                "post",
                FORK_PAGE,
                {"state": text, "post": "yes"},
                expect=(200,),
                context="error",
            )
        )
    add(
        AdminCase(
            "fork, a 3 MiB form",
            "post",
            FORK_PAGE,
            {"state": '"' + "x" * (3 << 20) + '"'},
            expect=(200, 400),
        )
    )
    add(
        AdminCase(
            "fork by the viewer",
            "post",
            FORK_PAGE,
            {"state": "1", "post": "yes"},
            who="s:viewer",
            expect=(403,),
        )
    )
    add(
        AdminCase(
            "fork by carol",
            "post",
            FORK_PAGE,
            {"state": "1", "post": "yes"},
            who="s:carol",
            expect=(403,),
        )
    )
    add(
        AdminCase(
            "fork without a CSRF token",
            "post",
            FORK_PAGE,
            {"state": "1", "post": "yes"},
            who="csrf:admin",
            expect=(403,),
        )
    )
    for name, segment in ADMIN_IDS:
        add(
            AdminCase(
                f"fork, snapshot id {name}",
                "post",
                f"{RUN_PAGE}snapshots/{segment}/fork/",
                {"state": "1", "post": "yes"},
                expect=(302, 404),
            )
        )
        add(
            AdminCase(
                f"fork, run id {name}",
                "post",
                f"{ADMIN}/workflowrun/{segment}/snapshots/{{snapshot}}/fork/",
                {"state": "1", "post": "yes"},
                expect=(302, 404),
            )
        )
        add(
            AdminCase(
                f"snapshot page, snapshot id {name}",
                "get",
                f"{RUN_PAGE}snapshots/{segment}/",
                expect=(302, 404),
            )
        )
        add(
            AdminCase(
                f"run page, id {name}",
                "get",
                f"{ADMIN}/workflowrun/{segment}/change/",
                expect=(302, 404),
            )
        )
        add(
            AdminCase(
                f"tree, run id {name}",
                "get",
                f"{ADMIN}/workflowrun/{segment}/tree/",
                expect=(302, 404),
            )
        )
    for after in ["abc", "-5", "1e3", "%00", "99999999999999999999999", "9" * 5000]:
        add(
            AdminCase(
                f"tree ?after={after[:30]}", "get", RUN_PAGE + f"tree/?after={after}", expect=(200,)
            )
        )
        add(
            AdminCase(
                f"tree nodes ?after={after[:30]}",
                "get",
                RUN_PAGE + f"tree/nodes/?after={after}",
                expect=(200,),
            )
        )
    add(
        AdminCase(
            "tree nodes of an unknown run",
            "get",
            f"{ADMIN}/workflowrun/nope/tree/nodes/",
            expect=(404,),
        )
    )

    # The dead-letter console.
    for name, segment in ADMIN_IDS:
        add(
            AdminCase(
                f"dead letter replay, id {name}",
                "post",
                f"{ADMIN}/deadletter/{segment}/replay/",
                {"post": "yes"},
                expect=(302, 404),
            )
        )
    add(
        AdminCase(
            "dead letter acknowledge, id NUL",
            "post",
            f"{ADMIN}/deadletter/%00/acknowledge/",
            {"post": "yes", "note": "x"},
            expect=(302, 404),
        )
    )
    for name, note in [
        ("300000 chars", "n" * 300_000),
        ("2001 chars", "n" * 2001),
        ("NUL", "a\x00b"),
    ]:
        for action in ("acknowledge", "discard"):
            add(
                AdminCase(
                    f"dead letter {action}, note {name}",
                    "post",
                    f"{ADMIN}/deadletter/{ENTRY}/{action}/",
                    {"post": "yes", "note": note},
                    expect=(302,),
                )
            )
    add(
        AdminCase(
            "dead letter discard by a viewer without permission",
            "post",
            f"{ADMIN}/deadletter/{ENTRY}/discard/",
            {"post": "yes"},
            who="s:viewer",
            expect=(403,),
        )
    )
    add(
        AdminCase(
            "dead letter replay without a CSRF token",
            "post",
            f"{ADMIN}/deadletter/{ENTRY}/replay/",
            {"post": "yes"},
            who="csrf:admin",
            expect=(403,),
        )
    )
    for name, selected in [
        ("NUL", ["\x00"]),
        ("10000 chars", ["f" * 10_000]),
        ("unknown", ["no-such-entry"]),
    ]:
        add(
            AdminCase(
                f"dead letter bulk replay, selected {name}",
                "post",
                f"{ADMIN}/deadletter/",
                bulk("replay_selected", selected),
                expect=(200, 302),
            )
        )

    # The streams console.
    control = ADMIN + "/streamworker/control/"
    for name, path, who, expect in [
        ("stop, stream NUL", f"{control}stop/%00/", "s:admin", (404,)),
        ("stop, stream 5000 chars", f"{control}stop/{'s' * 5000}/", "s:admin", (404,)),
        ("stop, stream traversal", f"{control}stop/../../etc/passwd/", "s:admin", (404,)),
        ("stop, stream emoji", f"{control}stop/{quote('🦄', safe='')}/", "s:admin", (404,)),
        ("unknown action", f"{control}explode/{STREAM}/", "s:admin", (302, 404)),
        ("start a running stream", f"{control}start/{STREAM}/", "s:admin", (302,)),
        ("stop a disabled stream", f"{control}stop/{DISABLED_STREAM}/", "s:admin", (302,)),
        ("stop without the permission", f"{control}stop/{STREAM}/", "s:carol", (403,)),
        ("stop without a CSRF token", f"{control}stop/{STREAM}/", "csrf:admin", (403,)),
        ("anonymous stop", f"{control}stop/{STREAM}/", "anon", (302,)),
    ]:
        add(AdminCase(f"streams console, {name}", "post", path, {}, who=who, expect=expect))

    # Changelist filters and search.
    changelists = [
        ("approvals", APPROVALS, "requested_at", "prompt"),
        ("runs", ADMIN + "/workflowrun/", "updated_at", "failure_reason"),
        ("dead letters", ADMIN + "/deadletter/", "created_at", "error_message"),
        ("checkpoints", ADMIN + "/streamcheckpoint/", None, "stream_name"),
    ]
    for label, url, date, text in changelists:
        params = [
            "q=%00",
            "q=" + "x" * 5000,
            "q=" + quote("' OR 1=1; DROP TABLE auth_user; --"),
            "p=-1",
            "p=abc",
            "p=99999999999999999999",
            "o=abc.-9.%00",
            "bogus_field=1",
            "pk__in=%00,x",
            "_to_field=password",
            f"{text}__regex=(",
            f"{text}__gt=%00",
            f"{text}=%00",
        ]
        if date:
            params += [
                f"{date}__year=abc",
                f"{date}__year=9999",
                f"{date}__year=9999&{date}__month=12",
                f"{date}__year=9999&{date}__month=12&{date}__day=31",
                f"{date}__year=0",
                f"{date}__gte=not-a-date",
                "status__exact=%00",
            ]
        for query in params:
            add(AdminCase(f"{label} changelist ?{query[:60]}", "get", f"{url}?{query}"))
    add(AdminCase("streams console ?q=%00", "get", ADMIN + "/streamworker/?q=%00"))

    # Issue 50: the Workflows page, each workflow's diagram (?run= marks a run) and the
    # redirect from a run's id; the run page's timeline is drawn on its change page.
    workflows = ADMIN + "/definedworkflow/"
    add(AdminCase("workflows page", "get", workflows, expect=(200,)))
    add(AdminCase("workflows page as a viewer", "get", workflows, who="s:viewer"))
    for name in ["%00", "x" * 5000, quote("é∂ƒ😀"), quote("../../etc/passwd"), "api-refund%00"]:
        for version in ["1", "0", "99999999999999999999"]:
            add(
                AdminCase(
                    f"diagram {name[:20]} v{version}",
                    "get",
                    f"{workflows}diagram/{name}/{version}/",
                )
            )
    add(
        AdminCase(
            "diagram of the refunds", "get", f"{workflows}diagram/api-refund/1/", expect=(200,)
        )
    )
    for run in ["%00", "x" * 5000, "{run}%00", quote("' OR 1=1 --"), "{run}"]:
        add(
            AdminCase(
                f"diagram ?run={run[:20]}", "get", f"{workflows}diagram/api-refund/1/?run={run}"
            )
        )
        add(AdminCase(f"workflow of run {run[:20]}", "get", f"{workflows}{run}/"))
    return cases


ADMIN_CASES = admin_cases()


def context_value(response: Any, name: str) -> Any:
    try:
        return response.context[name]
    except (KeyError, TypeError):
        return None


def test_admin(lane: str, world: World) -> None:
    tally = Tally("admin", lane)

    def attempt(case: AdminCase) -> str | None:
        client = world.clients[case.who]
        path = world.fill(case.path)
        if case.method == "get":
            response = client.get(path)
        else:
            data = {
                key: [world.fill(v) for v in value] if isinstance(value, list) else value
                for key, value in (case.data or {}).items()
            }
            response = client.post(path, data)
        status = response.status_code
        if status >= 500:
            return f"status {status}"
        if status not in case.expect:
            return f"status {status}, expected one of {case.expect}"
        if case.context and not context_value(response, case.context):
            return f"no {case.context!r} on the page"
        return None

    run_cases(tally, ADMIN_CASES, attempt)
    tally.finish()


@pytest.mark.parametrize("page", ["snapshots/{id}/", "snapshots/{id}/fork/"])
def test_admin_snapshot_ids_no_store_holds_are_not_found_quietly(
    lane: str, world: World, page: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24: a NUL snapshot id reached PostgreSQL, whose DataError the page showed
    and logged as an ERROR. Every id no store can hold is "no such snapshot"."""
    client = world.clients["s:admin"]
    for name, segment in ADMIN_IDS:
        path = world.fill(RUN_PAGE) + page.format(id=segment)
        with caplog.at_level("WARNING"):
            response = client.get(path, follow=True)
        assert response.status_code == 200, (name, response.status_code)
        shown = " ".join(str(m) for m in response.context["messages"])
        assert "cannot be read" not in shown and "DataError" not in shown, (name, shown)
        errors = [r for r in caplog.records if r.levelno >= 40]
        assert not errors, (name, [r.getMessage() for r in errors])


# == the management commands ================================================================


@dataclass(frozen=True)
class CommandCase:
    """``call_command(command, *args)``: must raise ``CommandError`` (``ok``: or
    succeed, for read-only listings). ``refusal``: a refused decision, audited."""

    name: str
    command: str
    args: tuple[str, ...]
    ok: bool = False
    refusal: bool = False


WF, AP, CP, ST = (
    "flowwarden_workflows",
    "flowwarden_approvals",
    "flowwarden_checkpoints",
    "flowwarden_streams",
)


def command_cases() -> list[CommandCase]:
    cases: list[CommandCase] = []

    def add(name: str, command: str, *args: str, **options: Any) -> None:
        cases.append(CommandCase(name, command, args, **options))

    # flowwarden_workflows fork / resume / show / list / prune / recover
    for name, text in [*BAD_JSON, ("over 1 MiB", OVER_1_MIB_STATE)]:
        add(f"fork --state {name}", WF, "fork", "{snapshot}", f"--state={text}", "--yes")
    for name, snapshot in [
        ("unknown", "nope"),
        ("NUL", "\x00"),
        ("300 chars", "s" * 300),
        ("traversal", "../../etc/passwd"),
        ("SQL", "' OR 1=1 --"),
    ]:
        add(f"fork, snapshot {name}", WF, "fork", snapshot, "--state", "1", "--yes")
    add("fork, unknown store", WF, "fork", "{snapshot}", "--state", "1", "--store", "nope", "--yes")
    add("fork, store NUL", WF, "fork", "{snapshot}", "--state", "1", "--store", "\x00", "--yes")
    add("fork, no --state", WF, "fork", "{snapshot}", "--yes")
    for name, text in [*BAD_JSON, ("over 64 KiB", OVER_64_KIB_PAYLOAD)]:
        add(f"resume --input {name}", WF, "resume", "{run}", f"--input={text}")
    for name, run in [
        ("unknown", "no-such-run"),
        ("NUL", "\x00"),
        ("300 chars", "r" * 300),
        ("emoji", "🦄"),
    ]:
        add(f"resume, run {name}", WF, "resume", run)
        add(f"show, run {name}", WF, "show", run)
    add("resume, unknown database", WF, "resume", "{run}", "--database", "nope")
    add("show, unknown store", WF, "show", "{run}", "--store", "nope")
    add("show, unknown database", WF, "show", "{run}", "--database", "nope")
    add("list --status bogus", WF, "list", "--status", "bogus")
    add("list --limit -1", WF, "list", "--limit", "-1")
    add("list --limit abc", WF, "list", "--limit", "abc")
    add("list, unknown database", WF, "list", "--database", "nope")
    add("list --workflow NUL", WF, "list", "--workflow", "\x00", ok=True)
    for age in [
        "abc",
        "-5d",
        "1e9d",
        "5 years",
        "\x00",
        "",
        "99999999999999999999d",
        "9999999d",
        "999999999w",
    ]:
        add(
            f"prune --older-than {age!r} --dry-run", WF, "prune", f"--older-than={age}", "--dry-run"
        )
    for age in ["99999999999999999999d", "9999999d"]:
        add(
            f"prune --older-than {age!r} --yes",
            WF,
            "prune",
            "--older-than",
            age,
            "--coordination",
            "no-such-run",
            "--yes",
        )
    for keep in ["0", "-1", "abc", "1e3"]:
        add(f"prune --keep-last {keep}", WF, "prune", "--keep-last", keep, "--dry-run")
    add("prune without a rule", WF, "prune", "--dry-run")
    add("prune, unknown store", WF, "prune", "--keep-last", "1", "--store", "nope", "--dry-run")
    add(
        "prune --coordination NUL",
        WF,
        "prune",
        "--keep-last",
        "1",
        "--coordination",
        "\x00",
        "--dry-run",
        ok=True,
    )
    for age in ["abc", "99999999999999999999d", "9999999d"]:
        add(
            f"recover --older-than {age!r} --dry-run",
            WF,
            "recover",
            "--older-than",
            age,
            "--dry-run",
        )
    add("recover --limit 0", WF, "recover", "--limit", "0", "--dry-run")
    add("recover, unknown database", WF, "recover", "--database", "nope", "--dry-run")
    add("unknown action", WF, "explode")

    # flowwarden_approvals approve / reject / show / list / expire
    for name, approval in [
        ("not a UUID", "not-a-uuid"),
        ("NUL", "\x00"),
        ("unknown UUID", UNKNOWN_UUID),
        ("300 chars", "a" * 300),
        ("SQL", "' OR 1=1 --"),
    ]:
        add(f"approve, id {name}", AP, "approve", approval, "--by", "alice")
        add(f"show, id {name}", AP, "show", approval)
    for name, user in [
        ("unknown", "nobody"),
        ("NUL", "\x00"),
        ("empty", ""),
        ("300 chars", "u" * 300),
    ]:
        add(f"reject --by {name} user", AP, "reject", "{approval}", "--by", user)
    for name, text in [*BAD_PAYLOAD_TEXTS, *NOT_OBJECTS, ("over 64 KiB", OVER_64_KIB_PAYLOAD)]:
        add(
            f"approve --payload {name}",
            AP,
            "approve",
            "{approval}",
            "--by",
            "alice",
            f"--payload={text}",
        )
    for name, comment in [
        ("NUL", "a\x00b"),
        ("2001 chars", "c" * 2001),
        ("unpaired surrogate", "\ud800"),
    ]:
        add(
            f"approve --comment {name}",
            AP,
            "approve",
            "{approval}",
            "--by",
            "alice",
            "--comment",
            comment,
        )
    add(
        "approve by carol (not a decider)",
        AP,
        "approve",
        "{approval}",
        "--by",
        "carol",
        refusal=True,
    )
    add(
        "reject by the auditor (not a decider)",
        AP,
        "reject",
        "{approval}",
        "--by",
        "auditor",
        "--comment",
        "no",
        refusal=True,
    )
    add("approve without --by", AP, "approve", "{approval}")
    add("list --status bogus", AP, "list", "--status", "bogus")
    add("list --limit abc", AP, "list", "--limit", "abc")
    add("expire --limit abc", AP, "expire", "--limit", "abc")
    add("expire --limit -5", AP, "expire", "--limit", "-5")
    add("unknown action", AP, "explode")

    # flowwarden_checkpoints show / reset / delete
    for name, stream in [("NUL", "\x00"), ("unknown", "nope"), ("300 chars", "n" * 300)]:
        add(f"show, stream {name}", CP, "show", stream)
        add(f"delete, stream {name}", CP, "delete", stream, "--yes")
        add(f"reset, stream {name}", CP, "reset", stream, "--yes")
    for name, token in [
        ("not JSON", "{not json"),
        ("a string", '"8263"'),
        ("an array", "[1]"),
        ("a number", "5"),
        ("null", "null"),
        ("empty", ""),
        ("NaN", "NaN"),
        ("nested 100000 deep", "[" * 100_000 + "]" * 100_000),
    ]:
        add(f"reset --seen-token {name}", CP, "reset", CHECKPOINT, f"--seen-token={token}", "--yes")
    add("unknown store", CP, "--store", "nope", "list")
    add("store NUL", CP, "list", "--store", "\x00")
    add("reset without a name", CP, "reset", "--yes")

    # flowwarden_streams run / status
    add("run an unknown stream", ST, "run", "--stream", "nope", "--burst")
    add("run stream NUL", ST, "run", "--stream", "\x00", "--burst")
    add("run --metrics-port abc", ST, "run", "--metrics-port", "abc")
    add("run --metrics-port -1", ST, "run", "--metrics-port", "-1", "--stream", "nope")
    add("run --metrics-port 99999", ST, "run", "--metrics-port", "99999", "--stream", "nope")
    add("status --bogus", ST, "status", "--bogus")
    for name, stream in [
        ("NUL", "\x00"),
        ("unknown", "nope"),
        ("300 chars", "n" * 300),
        ("emoji", "🦄"),
        ("traversal", "../../etc/passwd"),
    ]:
        add(f"resync, stream {name}", ST, "resync", stream, "--yes", "--no-wait")
    add("resync without a name", ST, "resync", "--yes")
    add("unknown action", ST, "explode")
    return cases


COMMAND_CASES = command_cases()
#: What a command says when its tables are missing: never the answer to a bad value.
MISLEADING = "has `manage.py migrate` been run?"


def test_commands(lane: str, world: World) -> None:
    tally = Tally("commands", lane)

    def attempt(case: CommandCase) -> str | None:
        args = [world.fill(arg) for arg in case.args]
        out, err = io.StringIO(), io.StringIO()
        try:
            call_command(case.command, *args, stdout=out, stderr=err)
        except (CommandError, SystemExit) as exc:
            message = str(exc)
            if isinstance(exc, CommandError) and not message.strip():
                return "a CommandError without a message"
            if MISLEADING in message.lower():
                return f"a bad value blamed on the setup: {short(message, 200)}"
            return None
        return None if case.ok else f"no CommandError; printed {short(out.getvalue(), 160)}"

    run_cases(tally, COMMAND_CASES, attempt)
    tally.finish()


# == the approver's inbox =========================================================================


@dataclass(frozen=True)
class InboxCase:
    """One request to the inbox (``/approvals/``). ``data``: form fields (POST) or
    ``None``; ``expect``: the allowed statuses; ``form_error``: the decision form must
    be shown again with an error; ``refusal``: a refused decision, audited."""

    name: str
    method: str
    path: str
    data: dict[str, Any] | None = None
    who: str = "s:alice"
    expect: tuple[int, ...] = (200, 302, 400, 403, 404)
    form_error: bool = False
    refusal: bool = False


INBOX = "/approvals/"
INBOX_PAGE = INBOX + "{approval}/"


def inbox_cases() -> list[InboxCase]:
    cases: list[InboxCase] = []
    add = cases.append
    # The decision form's payload and comment: the form again with its error, as in
    # the admin and the API (a payload is a JSON object).
    payloads = [
        *BAD_PAYLOAD_TEXTS,
        *NOT_OBJECTS,
        ("nested 2000 deep", nest(2000)),
        ("array 2000 deep", "[" * 2000 + "]" * 2000),
        ("over 64 KiB", OVER_64_KIB_PAYLOAD),
    ]
    for name, text in payloads:
        for verb in ("approve", "reject"):
            add(
                InboxCase(
                    f"{verb}, payload {name}",
                    "post",
                    INBOX_PAGE,
                    {verb: verb, "payload": text},
                    expect=(400,),
                    form_error=True,
                )
            )
    for name, comment in [
        ("2001 chars", "x" * 2001),
        ("100000 chars", "x" * 100_000),
        ("NUL", "a\x00b"),
    ]:
        add(
            InboxCase(
                f"approve, comment {name}",
                "post",
                INBOX_PAGE,
                {"approve": "1", "comment": comment},
                expect=(400,),
                form_error=True,
            )
        )
    add(InboxCase("no decision", "post", INBOX_PAGE, {"comment": "x"}, expect=(400,)))
    # Who may decide: a viewer is refused (audited); who cannot see it gets 404.
    add(
        InboxCase(
            "auditor approves",
            "post",
            INBOX_PAGE,
            {"approve": "1", "comment": "x" * 2000, "payload": OVER_64_KIB_PAYLOAD},
            who="s:auditor",
            expect=(403,),
            refusal=True,
        )
    )
    add(
        InboxCase(
            "carol approves (cannot see it)",
            "post",
            INBOX_PAGE,
            {"approve": "1"},
            who="s:carol",
            expect=(404,),
        )
    )
    add(InboxCase("carol opens it", "get", INBOX_PAGE, who="s:carol", expect=(404,)))
    add(InboxCase("anonymous approves", "post", INBOX_PAGE, {"approve": "1"}, who="anon"))
    # Ids and filters that name nothing.
    for name, ident in [*ADMIN_IDS, ("unknown UUID, upper case", UNKNOWN_UUID.upper())]:
        add(InboxCase(f"page {name}", "get", f"{INBOX}{ident}/"))
        add(InboxCase(f"approve {name}", "post", f"{INBOX}{ident}/", {"approve": "1"}))
    for query in [
        "status=%00",
        "status=bogus",
        "workflow=%00",
        "q=%00",
        "q=" + "q" * 5000,
        "page=-1",
        "page=abc",
        "page=99999999999999999999",
    ]:
        add(InboxCase(f"list ?{query[:40]}", "get", f"{INBOX}?{query}", expect=(200,)))
    return cases


INBOX_CASES = inbox_cases()


def test_inbox(lane: str, world: World) -> None:
    tally = Tally("inbox", lane)

    def attempt(case: InboxCase) -> str | None:
        client = world.clients[case.who]
        path = world.fill(case.path)
        post = case.method == "post"
        response = client.post(path, case.data or {}) if post else client.get(path)
        status = response.status_code
        if status >= 500:
            return f"status {status}"
        if status not in case.expect:
            return f"status {status}, expected one of {case.expect}"
        if case.form_error:
            form = context_value(response, "form")
            if form is None or not form.errors:
                return "no error on the decision form"
        return None

    run_cases(tally, INBOX_CASES, attempt)
    tally.finish()


# == the inbox's bulk decisions (issue 49, item 5) ================================================


@dataclass(frozen=True)
class BulkCase:
    """One request to the inbox's bulk view (``/approvals/bulk/``, query string
    *query*); ``ids`` the posted ids (``{approval}`` filled in), ``data`` other
    fields; ``expect``: the allowed statuses (a redirect must stay in the inbox);
    ``refusal``: a refused decision, audited."""

    name: str
    ids: tuple[str, ...] = ()
    data: dict[str, Any] = field(default_factory=dict)
    who: str = "s:alice"
    query: str = ""
    method: str = "post"
    expect: tuple[int, ...] = (302,)
    refusal: bool = False


BULK = INBOX + "bulk/"


def bulk_cases() -> list[BulkCase]:
    from flowwarden_django.inbox.bulk import MAX_BULK_IDS

    cases: list[BulkCase] = []
    add = cases.append
    approve = {"approve": "Approve selected"}
    # Ids that are no approval id: a message, nothing decided.
    for name, ident in [
        ("empty", ""),
        ("NUL", "\x00"),
        ("not a UUID", "not-a-uuid"),
        ("SQL", "'; DROP TABLE flowwarden_django_approval; --"),
        ("emoji", "🦄"),
        ("right-to-left", "\u202e" + UNKNOWN_UUID),
        ("5000 chars", "d" * 5000),
        ("dot dot", "../../admin/"),
        ("a number", "-1"),
        ("a UUID and a NUL", UNKNOWN_UUID + "\x00"),
    ]:
        add(BulkCase(f"id {name}", (ident,), approve))
        add(BulkCase(f"id {name} with the approval", ("{approval}", ident), approve))
    add(BulkCase("unknown UUID", (UNKNOWN_UUID,), approve))
    add(BulkCase("unknown UUID, upper case", (UNKNOWN_UUID.upper(),), {"reject": "1"}))
    # Too many: refused before anything is read; past Django's field limit a 400.
    add(BulkCase("limit + 1 unknown ids", (UNKNOWN_UUID,) * (MAX_BULK_IDS + 1), approve))
    add(BulkCase("limit + 1 repeats", ("{approval}",) * (MAX_BULK_IDS + 1), approve))
    add(BulkCase("5000 ids", (UNKNOWN_UUID,) * 5000, approve, expect=(302, 400)))
    add(BulkCase("one 3 MB id", ("u" * 3_000_000,), approve, expect=(302, 400)))
    # No decision, or a bad comment: a message, nothing decided.
    add(BulkCase("no decision", ("{approval}",), {"comment": "x"}))
    add(BulkCase("no ids", (), approve))
    for name, comment in [("2001 chars", "x" * 2001), ("100000 chars", "x" * 100_000)]:
        add(BulkCase(f"comment {name}", ("{approval}",), {**approve, "comment": comment}))
    add(BulkCase("comment NUL", ("{approval}",), {"reject": "1", "comment": "a\x00b"}))
    # Who: a viewer is refused (audited once, however often the id is repeated);
    # who cannot see it leaves no trace; no session, no CSRF token: nothing.
    add(BulkCase("auditor", ("{approval}",), approve, who="s:auditor", refusal=True))
    add(
        BulkCase(
            "auditor, the id 50 times in three spellings",
            ("{approval}",) * 48 + ("{{approval}}", "urn:uuid:{approval}"),
            {"reject": "1", "comment": "ü" * 500},
            who="s:auditor",
            refusal=True,
        )
    )
    add(BulkCase("carol (cannot see it)", ("{approval}",), approve, who="s:carol"))
    add(BulkCase("anonymous", ("{approval}",), approve, who="anon"))
    add(BulkCase("no CSRF token", ("{approval}",), approve, who="csrf:alice", expect=(403,)))
    add(BulkCase("GET", ("{approval}",), approve, method="get", expect=(405,)))
    # The way back: hostile filters are dropped, the redirect stays in the inbox.
    for query in [
        "status=%00&due=%00&claim=%00",
        "q=" + "q" * 5000,
        "page=99999999999999999999",
        "next=https://evil.example/",
        "workflow=%0d%0aSet-Cookie:x=1",
        "due=overdue&status=approved&claim=mine&page=2",
    ]:
        add(BulkCase(f"back to ?{query[:40]}", (UNKNOWN_UUID,), approve, query=query))
    return cases


BULK_CASES = bulk_cases()
#: The list's deadline filter, with hostile values (always a 200).
DUE_QUERIES = ["due=%00", "due=bogus", "due=" + "o" * 5000, "due=overdue&status=%00"]


def test_inbox_bulk(lane: str, world: World) -> None:
    tally = Tally("inbox bulk", lane)

    def attempt(case: BulkCase) -> str | None:
        client = world.clients[case.who]
        path = BULK + (f"?{case.query}" if case.query else "")
        data = {"ids": [world.fill(i) for i in case.ids], **case.data}
        post = case.method == "post"
        response = client.post(path, data) if post else client.get(path, data)
        status = response.status_code
        if status >= 500:
            return f"status {status}"
        if status not in case.expect:
            return f"status {status}, expected one of {case.expect}"
        if status == 302 and not response["Location"].startswith(INBOX):
            return f"redirected out of the inbox: {short(response['Location'])}"
        return None

    run_cases(tally, BULK_CASES, attempt)
    for query in DUE_QUERIES:
        tally.inputs += 1
        status = world.clients["s:alice"].get(f"{INBOX}?{query}").status_code
        if status != 200:
            tally.wrong.append(f"list ?{query[:40]}: status {status}")
    tally.finish()


# == direct calls of the core ====================================================================


@dataclass(frozen=True)
class CoreCase:
    """A direct call of the core (no front end in between), which must raise
    ``UserJSONError`` and change nothing."""

    name: str
    call: Callable[[World], Any]
    refusal: bool = False


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


#: Python values no person-given JSON may be (a resume input, a decision payload).
BAD_VALUES: list[tuple[str, Any]] = [
    ("NaN", float("nan")),
    ("nested Infinity", {"x": float("inf")}),
    ("nested 500 deep", deep(500)),
    ("NUL in a string", {"x": "a\x00b"}),
    ("NUL in a key", {"k\x00": 1}),
    ("unpaired surrogate", {"x": "\ud800"}),
    ("a set", {1, 2}),
    ("bytes", {"x": b"raw"}),
    ("a non-string key", {1: "x"}),
    ("over 64 KiB", {"x": "y" * (MAX_PAYLOAD_BYTES + 16)}),
]
#: Texts no comment or note may be.
BAD_TEXTS: list[tuple[str, Any]] = [
    ("200000 chars", "c" * 200_000),
    ("2001 chars", "c" * 2001),
    ("NUL", "a\x00b"),
    ("unpaired surrogate", "a\ud800b"),
    ("not text", 5),
]


def core_cases() -> list[CoreCase]:
    from flowwarden_django.streams.operations.replay import (
        acknowledge_dead_letter,
        discard_dead_letter,
    )
    from flowwarden_django.workflows import Workflow
    from flowwarden_django.workflows.waiting.approvals import approve, decide, reject

    def admin() -> User:
        return User.objects.get(username="admin")

    cases: list[CoreCase] = []
    for name, text in BAD_TEXTS:
        cases += [
            CoreCase(
                f"approve, comment {name}",
                lambda w, t=text: approve(w.approval, admin(), comment=t),
            ),
            CoreCase(
                f"reject, comment {name}", lambda w, t=text: reject(w.approval, admin(), comment=t)
            ),
            CoreCase(
                f"acknowledge_dead_letter, note {name}",
                lambda w, t=text: acknowledge_dead_letter(ENTRY, note=t),
            ),
            CoreCase(
                f"discard_dead_letter, note {name}",
                lambda w, t=text: discard_dead_letter(ENTRY, note=t),
            ),
        ]
    for name, value in BAD_VALUES:
        cases += [
            CoreCase(
                f"decide, payload {name}",
                lambda w, v=value: decide(w.approval, "approved", admin(), payload=v),
            ),
            CoreCase(
                f"resume, input {name}",
                lambda w, v=value: Workflow.for_coordination(w.run).resume(input=v),
            ),
            CoreCase(
                f"run_local, input {name}",
                lambda w, v=value: Workflow.for_coordination(w.run).run_local(input=v),
            ),
        ]
    return cases


CORE_CASES = core_cases()


def test_core(lane: str, world: World) -> None:
    from flowwarden_django.common.user_input import UserJSONError

    tally = Tally("core", lane)

    def attempt(case: CoreCase) -> str | None:
        try:
            case.call(world)
        except UserJSONError as exc:
            return None if str(exc) else "a refusal without a message"
        return "accepted"

    run_cases(tally, CORE_CASES, attempt)
    tally.finish()


assert len(API_CASES) + len(ADMIN_CASES) + len(COMMAND_CASES) + len(CORE_CASES) >= 250
assert len(INBOX_CASES) >= 60


# == issue 49 (claims and typed forms): the claim, release and reassign endpoints, and a
# form-typed approval's payload through the decide endpoint ===================================
#
# The same machinery as the API's cases above: each request answered with a 4xx (a 400
# naming the bad field where the body is bad), never a 5xx, and nothing written. Its
# own world: the untyped approval of ``world`` (alice assigned, finance its group), a
# form-typed one (``RefundDecisionForm``: amount, reason, refund_on), an ``erin`` who
# may reassign, and a user deleted after its token was made.

CLAIM = "/approvals/{approval}/claim/"
RELEASE = "/approvals/{approval}/release/"
REASSIGN = "/approvals/{approval}/reassign/"
TYPED_APPROVE = "/approvals/{typed}/approve/"
TYPED_WORKFLOW = "hostile-typed-refund"
#: What a reassigner holds: the right, and seeing the approvals to reassign.
RIGHTS = ("reassign_approval", "view_approval")


@pytest.fixture
def claims_world(world: World) -> Iterator[World]:
    """*world*, plus ``{typed}`` (a form-typed approval), ``t:erin`` (may view and
    reassign approvals) and ``t:ghost`` (a token whose user was deleted since)."""
    from django.contrib.auth.models import Permission

    from flowwarden_django.models import Approval
    from flowwarden_django.workflows import workflow_registry
    from tests.support.typed_refund_workflow import define_typed_refunds

    typed = define_typed_refunds(TYPED_WORKFLOW)
    started = typed.start({"order": 9, "total": "120.00"})
    approval = Approval.objects.get(coordination_id=started.coordination_id)
    erin = User.objects.create_user("erin", password="pw")
    erin.user_permissions.add(*Permission.objects.filter(codename__in=RIGHTS))
    world.clients["t:erin"] = token_client(User.objects.get(pk=erin.pk))
    ghost = User.objects.create_user("ghost", password="pw")
    ghost.user_permissions.add(*Permission.objects.filter(codename__in=RIGHTS))
    world.clients["t:ghost"] = token_client(ghost)
    ghost.delete()
    User.objects.create_user("gone", password="pw").delete()  # a name reassigned to below
    world.typed = str(approval.pk)  # type: ignore[attr-defined]
    try:
        yield world
    finally:
        workflow_registry.unregister(TYPED_WORKFLOW)


def reassign_body(**fields: Any) -> str:
    return json.dumps(fields)


def claim_api_cases() -> list[ApiCase]:
    cases: list[ApiCase] = []
    add = cases.append
    long_name = "u" * (150 + 1)
    # Ids that name no approval: 404 (or another 4xx where the router refuses the path).
    for action in ("claim", "release", "reassign"):
        for name, text in [*POST_IDS, ("36 zeros", "0" * 36)]:
            body = reassign_body(to_group="finance") if action == "reassign" else "{}"
            path = f"/approvals/{text}/{action}/"
            add(
                ApiCase(
                    f"{action}, id {name}",
                    "post",
                    path,
                    body,
                    status=404,
                    code="approval_not_found",
                )
            )
    # Claim and release bodies, by alice (who may decide it): 400 on the comment.
    comments = [
        ("comment true", '{"comment": true}'),
        ("comment object", '{"comment": {"a": 1}}'),
        ("comment list", '{"comment": ["x"]}'),
        ("comment 2001 chars", '{"comment": "' + "x" * 2001 + '"}'),
        ("comment 100000 chars", '{"comment": "' + "x" * 100_000 + '"}'),
        ("comment with NUL", '{"comment": "a\\u0000b"}'),
        ("comment with a surrogate", '{"comment": "\\ud800"}'),
    ]
    for path, action in ((CLAIM, "claim"), (RELEASE, "release")):
        for name, text in comments:
            add(ApiCase(f"{action}, {name}", "post", path, text, who="t:alice", status=400))
        for name, text in [("malformed", '{"comment": '), ("NaN", '{"comment": NaN}')]:
            add(ApiCase(f"{action}, {name} body", "post", path, text, who="t:alice", status=400))
        # Who may not: carol cannot see it (404); a deleted user's token (401).
        add(ApiCase(f"{action} by carol", "post", path, "{}", who="t:carol", status=404))
        add(ApiCase(f"{action} by a deleted user", "post", path, "{}", who="t:ghost", status=401))
    add(ApiCase("claim by anonymous", "post", CLAIM, "{}", who="anon", status=(401, 403)))
    # Reassign bodies, by erin (who may reassign): 400 naming the field.
    for name, body, fld in [
        ("to_users a string", reassign_body(to_users="alice"), "to_users"),
        ("to_users an object", reassign_body(to_users={"alice": 1}), "to_users"),
        ("to_users null", reassign_body(to_users=None), "to_users"),
        ("to_users of objects", reassign_body(to_users=[{"u": "alice"}]), "to_users"),
        ("to_users of lists", reassign_body(to_users=[["alice"]]), "to_users"),
        ("to_users of booleans", reassign_body(to_users=[True]), "to_users"),
        ("to_users of numbers (no such users)", reassign_body(to_users=[5, 6.5]), "to_users"),
        ("to_users 151 chars", reassign_body(to_users=[long_name]), "to_users"),
        ("to_users 100000 chars", reassign_body(to_users=["v" * 100_000]), "to_users"),
        ("to_users with NUL (the parser)", reassign_body(to_users=["ali\x00ce"]), None),
        ("to_users a surrogate", '{"to_users": ["\\ud800"]}', None),
        ("to_users unicode, no such user", reassign_body(to_users=["Ålice🦄"]), "to_users"),
        ("to_users RTL override", reassign_body(to_users=["\u202ealice"]), "to_users"),
        ("to_users a deleted user", reassign_body(to_users=["gone"]), "to_users"),
        ("to_users a deleted and a live user", reassign_body(to_users=["gone", "bob"]), None),
        ("to_users 101 names", reassign_body(to_users=[f"n{i}" for i in range(101)]), None),
        ("to_users 100000 names", reassign_body(to_users=["x"] * 100_000), "to_users"),
        ("to_group a list", reassign_body(to_group=["finance"]), "to_group"),
        ("to_group an object", reassign_body(to_group={"name": "finance"}), "to_group"),
        ("to_group a boolean", reassign_body(to_group=True), "to_group"),
        ("to_group a number (no such group)", reassign_body(to_group=5), "to_group"),
        ("to_group 151 chars", reassign_body(to_group="g" * 151), "to_group"),
        ("to_group 100000 chars", reassign_body(to_group="g" * 100_000), "to_group"),
        ("to_group with NUL (the parser)", reassign_body(to_group="fin\x00ance"), None),
        ("to_group unicode, no such group", reassign_body(to_group="финансы"), "to_group"),
        ("to_group SQL", reassign_body(to_group="x' OR '1'='1"), "to_group"),
        ("no target at all", "{}", None),
        ("only blanks", reassign_body(to_users=[""], to_group=""), None),
        ("to_group null and no users", reassign_body(to_group=None), None),
        ("a good group, a bad comment", reassign_body(to_group="finance", comment=[1]), None),
        ("a good group, comment NUL", reassign_body(to_group="finance", comment="\x00"), None),
        ("a body that is a list", '["finance"]', None),
        ("a body that is a string", '"finance"', None),
        ("a body that is null", "null", None),
        ("malformed", '{"to_group": ', None),
        ("500 deep", '{"to_group": ' + nest(500) + "}", None),
    ]:
        add(
            ApiCase(
                f"reassign, {name}", "post", REASSIGN, body, who="t:erin", status=400, field=fld
            )
        )
    # Without reassign_approval: 403 before the body is judged; a deleted user: 401.
    for who, status in (("t:alice", 403), ("t:bob", 403), ("t:ghost", 401)):
        for name, body in [
            ("a good group", reassign_body(to_group="finance")),
            ("a hostile body", reassign_body(to_users="x" * 100_000, to_group=[1])),
        ]:
            add(
                ApiCase(
                    f"reassign by {who}, {name}", "post", REASSIGN, body, who=who, status=status
                )
            )
    add(
        ApiCase(
            "reassign by carol",
            "post",
            REASSIGN,
            reassign_body(to_group="finance"),
            who="t:carol",
            status=404,
        )
    )
    return cases


def typed_payload_cases() -> list[ApiCase]:
    """A form-typed approval's payload, approved by alice: 400 with the form's errors
    (``payload``), nothing decided and (a payload refused by its form) nothing audited."""
    cases: list[ApiCase] = []
    good = {"amount": "5", "reason": "late"}
    for name, payload in [
        ("no payload", None),
        ("empty payload", {}),
        ("amount a string", {**good, "amount": "five"}),
        ("amount true", {**good, "amount": True}),
        ("amount a list", {**good, "amount": [5]}),
        ("amount an object", {**good, "amount": {"value": 5}}),
        ("amount nested 50 deep", {**good, "amount": json.loads(nest(50))}),
        ("amount 100000 digits", {**good, "amount": "1" * 100_000}),
        ("amount NaN text", {**good, "amount": "NaN"}),
        ("amount Infinity text", {**good, "amount": "Infinity"}),
        ("amount 1e999999", {**good, "amount": "1e999999"}),
        ("amount 1e308", {**good, "amount": 1e308}),
        ("amount negative", {**good, "amount": "-1"}),
        ("amount over the total", {**good, "amount": "120.01"}),
        ("amount full-width, over the total", {**good, "amount": "\uff15\uff10\uff10"}),
        ("reason not a choice", {**good, "reason": "bored"}),
        ("reason 100000 chars", {**good, "reason": "late" * 25_000}),
        ("reason unicode", {**good, "reason": "låte🦄"}),
        ("reason a list", {**good, "reason": ["late"]}),
        ("reason null", {**good, "reason": None}),
        ("refund_on not a date", {**good, "refund_on": "99999-99-99"}),
        ("refund_on a huge number", {**good, "refund_on": 12345678901234567890}),
        ("refund_on an object", {**good, "refund_on": {"y": 2030}}),
        ("extra fields, a bad amount", {"amount": "x", "reason": "late", "admin": True}),
        ("extra __all__, a bad amount", {"__all__": "x", "amount": "-1", "reason": "late"}),
        ("extra 1000 fields, no reason", {"amount": "5", **{f"f{i}": i for i in range(1000)}}),
        ("payload a list", [good]),
        ("payload a string", "amount=5"),
        ("payload a number", 5),
        ("payload true", True),
    ]:
        body = json.dumps({"comment": "hostile", "payload": payload})
        cases.append(
            ApiCase(
                f"typed approve, {name}",
                "post",
                TYPED_APPROVE,
                body,
                who="t:alice",
                status=400,
                field="payload",
            )
        )
    # A NUL anywhere in the body is refused by the parser (400, before the form).
    for name, text in [
        ("a NUL in the amount", '{"payload": {"amount": "5\\u0000", "reason": "late"}}'),
        ("a NUL in the reason", '{"payload": {"amount": "5", "reason": "la\\u0000te"}}'),
        ("a surrogate reason", '{"payload": {"amount": "5", "reason": "\\ud800"}}'),
        ("a 5000 deep amount", '{"payload": {"amount": ' + "[" * 5000 + "]" * 5000 + "}}"),
        ("a NaN amount", '{"payload": {"amount": NaN, "reason": "late"}}'),
        ("over 64 KiB", '{"payload": ' + OVER_64_KIB_PAYLOAD + "}"),
    ]:
        cases.append(
            ApiCase(
                f"typed approve, {name}", "post", TYPED_APPROVE, text, who="t:alice", status=400
            )
        )
    return cases


CLAIM_API_CASES = claim_api_cases()
TYPED_PAYLOAD_CASES = typed_payload_cases()


def test_api_claims_and_typed_payloads(lane: str, claims_world: World) -> None:
    tally = Tally("api: claims and typed payloads", lane)

    def attempt(case: ApiCase) -> str | None:
        filled = replace(case, path=case.path.replace("{typed}", claims_world.typed))  # type: ignore[attr-defined]
        response = api_request(claims_world, filled)
        if response.status_code >= 500:
            return f"status {response.status_code}"
        return check_api_answer(case, response)

    run_cases(tally, CLAIM_API_CASES + TYPED_PAYLOAD_CASES, attempt)
    tally.finish()


assert len(CLAIM_API_CASES) >= 80 and len(TYPED_PAYLOAD_CASES) >= 30
