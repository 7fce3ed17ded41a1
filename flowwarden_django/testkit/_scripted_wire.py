"""Reply shapes, error codes, code names and error labels for :mod:`.scripted_mongo`.

The labels matter more than anything else here: pymongo 4.x resumes a change
stream after an ``OperationFailure`` only when the reply carries the
``ResumableChangeStreamError`` label (plus CursorNotFound and the "not primary"
codes, which it maps to ``ConnectionFailure``). A fake that forgets the labels
tests a driver path production never takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bson import Int64, ObjectId, Timestamp

MAX_WIRE_VERSION = 21  # MongoDB 7.0
MAX_BSON_SIZE = 16 * 1024 * 1024

#: ``codeName`` of every code the fake can reply with (from the server's error_codes.yml).
CODE_NAMES: dict[int, str] = {
    1: "InternalError",
    2: "BadValue",
    6: "HostUnreachable",
    7: "HostNotFound",
    8: "UnknownError",
    9: "FailedToParse",
    11: "UserNotFound",
    13: "Unauthorized",
    14: "TypeMismatch",
    26: "NamespaceNotFound",
    43: "CursorNotFound",
    47: "NoMatchingDocument",
    50: "MaxTimeMSExpired",
    59: "CommandNotFound",
    63: "StaleShardVersion",
    73: "InvalidNamespace",
    89: "NetworkTimeout",
    91: "ShutdownInProgress",
    96: "OperationFailed",
    112: "WriteConflict",
    115: "CommandNotSupported",
    133: "FailedToSatisfyReadPreference",
    134: "ReadConcernMajorityNotAvailableYet",
    136: "CappedPositionLost",
    150: "StaleEpoch",
    175: "QueryPlanKilled",
    189: "PrimarySteppedDown",
    234: "RetryChangeStream",
    237: "CursorKilled",
    260: "InvalidResumeToken",
    262: "ExceededTimeLimit",
    280: "ChangeStreamFatalError",
    286: "ChangeStreamHistoryLost",
    9001: "SocketException",
    10107: "NotWritablePrimary",
    11600: "InterruptedAtShutdown",
    11602: "InterruptedDueToReplStateChange",
    13388: "StaleConfig",
    13435: "NotPrimaryNoSecondaryOk",
    13436: "NotPrimaryOrSecondary",
}

#: Codes a 4.4+ server labels ``ResumableChangeStreamError`` on change-stream commands.
RESUMABLE_CHANGE_STREAM_CODES: frozenset[int] = frozenset(
    {6, 7, 43, 63, 89, 91, 133, 150, 189, 234, 262, 9001, 10107, 11600, 11602, 13388, 13435, 13436}
)

#: Codes a server labels ``NonResumableChangeStreamError``.
NON_RESUMABLE_CHANGE_STREAM_CODES: frozenset[int] = frozenset({280, 286})

HISTORY_LOST_MESSAGE = (
    "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
)
RESUME_FROM_INVALIDATE_MESSAGE = (
    "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
    "invalidate notification."
)

_DEFAULT_MESSAGES: dict[int, str] = {
    260: RESUME_FROM_INVALIDATE_MESSAGE,
    280: "cannot resume stream; the resume token was not found.",
    286: HISTORY_LOST_MESSAGE,
}


def code_name(code: int) -> str:
    """The server's ``codeName`` for *code* (``Location<code>`` for unnamed assertion codes)."""
    return CODE_NAMES.get(code, f"Location{code}")


def error_labels(command: str, code: int) -> list[str]:
    """The change-stream labels a 4.4+ server attaches to *code* failing *command*.

    ``command`` is ``"aggregate"`` or ``"getMore"`` on a change stream; the server labels
    both (``ErrorLabelBuilder::isResumableChangeStreamError``), no other command.
    """
    if code in NON_RESUMABLE_CHANGE_STREAM_CODES:
        return ["NonResumableChangeStreamError"]
    if command.lower() in ("aggregate", "getmore") and code in RESUMABLE_CHANGE_STREAM_CODES:
        return ["ResumableChangeStreamError"]
    return []


class CommandError(Exception):
    """A command failure to send back as an ``ok: 0`` reply."""

    def __init__(self, code: int, errmsg: str, *, labels: list[str] | None = None) -> None:
        super().__init__(f"{errmsg} (code {code})")
        self.code = code
        self.errmsg = errmsg
        self.labels = list(labels or [])

    @classmethod
    def injected(cls, command: str, code: int, errmsg: str | None = None) -> CommandError:
        """The reply a real server would send for *code* on *command*, with its labels."""
        if errmsg is None:
            errmsg = _DEFAULT_MESSAGES.get(
                code, f"{code_name(code)} (injected by ScriptedReplicaSet.fail_next)"
            )
        return cls(code, errmsg, labels=error_labels(command, code))

    @classmethod
    def history_lost(cls) -> CommandError:
        """ChangeStreamHistoryLost (286), exactly as a 4.4+ server words and labels it."""
        return cls(286, HISTORY_LOST_MESSAGE, labels=["NonResumableChangeStreamError"])

    def reply_fields(self) -> dict[str, Any]:
        """The fields of the error reply (``ok: 0`` is added by the sender)."""
        fields: dict[str, Any] = {
            "errmsg": self.errmsg,
            "code": self.code,
            "codeName": code_name(self.code),
        }
        if self.labels:
            fields["errorLabels"] = list(self.labels)
        return fields


def hello_reply(
    doc: Mapping[str, Any], *, set_name: str, address: str, election_id: ObjectId
) -> dict[str, Any]:
    """A single-node replica-set primary's answer to ``hello`` / legacy ``isMaster``."""
    reply: dict[str, Any] = {"isWritablePrimary": True} if "hello" in doc else {"ismaster": True}
    if doc.get("helloOk"):
        reply["helloOk"] = True
    # No "topologyVersion": pymongo then polls instead of streaming hello, which
    # mockupdb cannot hold open.
    reply.update(
        setName=set_name,
        setVersion=1,
        electionId=election_id,
        hosts=[address],
        primary=address,
        me=address,
        secondary=False,
        minWireVersion=0,
        maxWireVersion=MAX_WIRE_VERSION,
        logicalSessionTimeoutMinutes=30,
        maxBsonObjectSize=MAX_BSON_SIZE,
        maxMessageSizeBytes=48_000_000,
        maxWriteBatchSize=100_000,
        localTime=datetime.now(UTC),
        readOnly=False,
    )
    return reply


def build_info_reply() -> dict[str, Any]:
    """``buildInfo`` of a 7.0 server (maxWireVersion 21)."""
    return {
        "version": "7.0.0",
        "versionArray": [7, 0, 0, 0],
        "gitVersion": "scripted",
        "bits": 64,
        "maxBsonObjectSize": MAX_BSON_SIZE,
    }


def oplog_entry(ts: Timestamp, *, first: bool) -> dict[str, Any]:
    """A no-op oplog entry at *ts*, as ``local.oplog.rs`` holds them."""
    return {
        "op": "n",
        "ns": "",
        "o": {"msg": "initiating set" if first else "periodic noop"},
        "ts": ts,
        "t": Int64(1),
        "v": Int64(2),
        "wall": datetime.fromtimestamp(ts.time, UTC),
    }


def _projection_tree(projection: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """``(tree, inclusion)`` of a validated projection, ``_id`` handled apart.

    The tree maps each path segment to a subtree or ``True`` (the leaf). Raises
    ``CommandError`` for what the fake does not model (operators, expressions) and for
    mixing inclusion and exclusion, as the server does.
    """
    tree: dict[str, Any] = {}
    inclusion: bool | None = None
    for path, value in projection.items():
        if isinstance(value, bool) or (isinstance(value, int | float) and value in (0, 1)):
            included = bool(value)
        else:
            raise CommandError(
                2,
                f"ScriptedReplicaSet models only 1/0/true/false projections, not "
                f"{path!r}: {value!r}",
            )
        if path == "_id":
            continue
        if path.startswith("$") or ".$" in path:
            raise CommandError(2, f"ScriptedReplicaSet does not model the projection {path!r}")
        if inclusion is None:
            inclusion = included
        elif inclusion and not included:
            raise CommandError(
                31254, f"Cannot do exclusion on field {path} in inclusion projection"
            )
        elif included and not inclusion:
            raise CommandError(
                31253, f"Cannot do inclusion on field {path} in exclusion projection"
            )
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            child = node.get(part)
            if child is True:
                break
            node = node.setdefault(part, {})
        else:
            node[leaf] = True
    if inclusion is None:
        # Only _id was named: {_id: 0} excludes it, {_id: 1} keeps only it.
        return {"_id": True}, bool(projection.get("_id", 1))
    # The tree names _id when it is kept by an inclusion or dropped by an exclusion.
    if bool(projection.get("_id", 1)) == inclusion:
        tree["_id"] = True
    return tree, inclusion


def check_projection(projection: Any) -> None:
    """Raise ``CommandError`` if :func:`project` cannot apply *projection*."""
    if projection is None:
        return
    if not isinstance(projection, Mapping):
        raise CommandError(14, "projection must be a document")
    if projection:
        _projection_tree(projection)


def _projected(doc: Mapping[str, Any], tree: Mapping[str, Any], inclusion: bool) -> dict[str, Any]:
    """*doc* through the projection *tree*: with *inclusion* the paths it names stay
    and nothing else; without, they go and everything else stays."""
    kept: dict[str, Any] = {}
    for key, value in doc.items():
        branch = tree.get(key)
        if branch is True or branch is None:
            if (branch is True) == inclusion:
                kept[key] = value
        elif isinstance(value, Mapping):
            kept[key] = _projected(value, branch, inclusion)
        elif isinstance(value, list):
            kept[key] = [
                _projected(item, branch, inclusion) if isinstance(item, Mapping) else item
                for item in value
                if isinstance(item, Mapping) or not inclusion
            ]
        elif not inclusion:
            kept[key] = value
    return kept


def project(doc: dict[str, Any], projection: Any) -> dict[str, Any]:
    """Apply an inclusion or exclusion projection of 1/0/true/false values.

    As on the server: ``_id`` is kept unless excluded by name, dotted paths reach into
    sub-documents and arrays of sub-documents, field order is the document's. Other
    projections (operators, expressions, mixed inclusion and exclusion) raise
    ``CommandError``; see :func:`check_projection`.
    """
    if not projection:
        return doc
    tree, inclusion = _projection_tree(projection)
    return _projected(doc, tree, inclusion)
