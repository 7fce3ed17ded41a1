"""Database models of flowwarden-django."""

from datetime import datetime

from django.db import models
from django.utils.translation import gettext_lazy as _


class StreamCheckpoint(models.Model):
    """The ORM checkpoint store's row: one per stream, both anchors side by side.

    Tokens are stored as their BSON bytes so that equality in SQL is exact on every
    database (the history-lost guard compares them in the UPDATE itself).
    Rows are written only through ``OrmCheckpointStore``.
    """

    stream_name = models.CharField(_("stream"), max_length=255, primary_key=True)
    # NULL and "" differ here: NULL means no owner was ever recorded.
    instance_id = models.CharField(  # noqa: DJ001
        _("instance id"), max_length=255, null=True, blank=True
    )
    last_seen_token = models.BinaryField(_("last seen token"), null=True)
    last_seen_at = models.DateTimeField(_("last seen at"), null=True)
    last_processed_token = models.BinaryField(_("last processed token"), null=True)
    last_processed_at = models.DateTimeField(_("last processed at"), null=True)
    last_heartbeat_at = models.DateTimeField(_("last heartbeat at"), null=True)
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)
    # The initial copy's progress; its "batch" is repeated in initial_sync_batch so
    # that save_initial_sync's condition is a plain column comparison on every database.
    initial_sync = models.JSONField(_("initial sync"), null=True, blank=True)
    initial_sync_batch = models.BigIntegerField(_("initial sync batch"), null=True, blank=True)

    class Meta:
        verbose_name = _("stream checkpoint")
        verbose_name_plural = _("stream checkpoints")
        ordering = ["stream_name"]

    def __str__(self) -> str:
        return self.stream_name


class DeadLetter(models.Model):
    """The ORM dead-letter store's row: one parked event (see ``streams/dlq.py``).

    BSON values (document key, full document, resume token) are stored as BSON
    bytes so they round-trip with their types; the admin shows them as JSON.
    Rows are written through ``OrmDlqStore`` and the replay/ack/discard operations.
    """

    class Status(models.TextChoices):
        PENDING = "PENDING", _("pending")
        REPLAYING = "REPLAYING", _("replaying")
        REPLAYED = "REPLAYED", _("replayed")
        ACKNOWLEDGED = "ACKNOWLEDGED", _("acknowledged")
        DISCARDED = "DISCARDED", _("discarded")

    id = models.CharField(_("id"), max_length=64, primary_key=True)
    stream_name = models.CharField(_("stream"), max_length=255)
    operation_type = models.CharField(_("operation"), max_length=32)
    document_key = models.BinaryField(_("document key"), null=True)
    full_document = models.BinaryField(_("full document"), null=True)
    resume_token = models.BinaryField(_("resume token"), null=True)
    error_type = models.CharField(_("error type"), max_length=255)
    error_message = models.TextField(_("error message"), blank=True)
    stack_trace = models.TextField(_("stack trace"), null=True, blank=True)  # noqa: DJ001
    attempts = models.PositiveIntegerField(_("attempts"), default=1)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PENDING
    )
    first_attempt_at = models.DateTimeField(_("first attempt at"))
    last_attempt_at = models.DateTimeField(_("last attempt at"))
    created_at = models.DateTimeField(_("created at"))
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)
    replay_count = models.PositiveIntegerField(_("replays"), default=0)
    last_replayed_at = models.DateTimeField(_("last replayed at"), null=True, blank=True)
    resolved_at = models.DateTimeField(_("resolved at"), null=True, blank=True)
    resolved_by = models.CharField(_("resolved by"), max_length=150, blank=True)
    note = models.TextField(_("note"), blank=True)

    class Meta:
        verbose_name = _("dead letter")
        verbose_name_plural = _("dead letters")
        ordering = ["-created_at", "id"]
        indexes = [
            models.Index(fields=["stream_name", "status"], name="fw_dlq_stream_status"),
            models.Index(fields=["expires_at"], name="fw_dlq_expires"),
        ]
        permissions = [
            ("replay_deadletter", _("Can replay dead letters")),
            ("resolve_deadletter", _("Can acknowledge or discard dead letters")),
        ]

    def __str__(self) -> str:
        return f"{self.stream_name} {self.operation_type} {self.id}"


class StreamSettledEvent(models.Model):
    """An event of a transactional stream handled in parallel that committed with its
    handler's transaction while an earlier event was still unsettled: the processed
    anchor (the low watermark) could not pass it yet.

    Written in the event's own transaction, deleted in the transaction that moves the
    anchor past it; a restart skips the events it finds here (``event_digest``: the
    SHA-256 of the resume token's BSON bytes), so a crash duplicates no effect.
    """

    stream_name = models.CharField(_("stream"), max_length=255)
    event_digest = models.CharField(_("event digest"), max_length=64)
    settled_at = models.DateTimeField(_("settled at"), auto_now_add=True)

    class Meta:
        verbose_name = _("settled stream event")
        verbose_name_plural = _("settled stream events")
        constraints = [
            models.UniqueConstraint(
                fields=["stream_name", "event_digest"], name="fw_settled_event_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.stream_name} {self.event_digest[:12]}"


class StreamLease(models.Model):
    """The ORM lock service's row: who leads a stream, until when, under which token.

    A release clears the owner but keeps the row, so fencing tokens never restart.
    """

    name = models.CharField(_("name"), max_length=255, primary_key=True)
    owner = models.CharField(_("owner"), max_length=255, blank=True)
    token = models.BigIntegerField(_("fencing token"), default=0)
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)

    class Meta:
        verbose_name = _("stream lease")
        verbose_name_plural = _("stream leases")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class StreamWorker(models.Model):
    """What one process says about one stream it runs (or stands by for).

    Each ``StreamManager`` upserts its rows every few seconds; the health view,
    ``flowwarden_streams status`` and the admin console read them, so they see
    streams running in other processes. A row not refreshed for a while belongs to
    a process that is gone.
    """

    stream_name = models.CharField(_("stream"), max_length=255)
    instance_id = models.CharField(_("instance"), max_length=255)
    state = models.CharField(_("state"), max_length=16)
    role = models.CharField(_("role"), max_length=16, blank=True)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    last_event_at = models.DateTimeField(_("last event at"), null=True, blank=True)
    events = models.BigIntegerField(_("events"), default=0)
    errors = models.BigIntegerField(_("errors"), default=0)
    retries = models.BigIntegerField(_("retries"), default=0)
    dead_lettered = models.BigIntegerField(_("dead-lettered"), default=0)
    restarts = models.BigIntegerField(_("restarts"), default=0)
    last_error = models.TextField(_("last error"), blank=True)
    #: The last error's class and where it arose, without its message (may be shown
    #: to anyone: it quotes no event data).
    error_kind = models.CharField(_("error kind"), max_length=255, blank=True)
    restarting_since = models.DateTimeField(_("restarting since"), null=True, blank=True)
    #: A stream handled in parallel: events admitted and not settled, events settled
    #: behind an unsettled one (the anchor's lag), keys parked behind a failing event.
    in_flight = models.IntegerField(_("in flight"), default=0)
    watermark_lag = models.IntegerField(_("watermark lag"), default=0)
    parked_keys = models.JSONField(_("parked keys"), default=list, blank=True)
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        verbose_name = _("stream worker")
        verbose_name_plural = _("stream workers")
        ordering = ["stream_name", "instance_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["stream_name", "instance_id"], name="fw_stream_worker_unique"
            )
        ]
        permissions = [("control_stream", _("Can start, stop and restart streams"))]

    def __str__(self) -> str:
        return f"{self.stream_name}@{self.instance_id}"


class StreamControl(models.Model):
    """What operators asked of a stream, read by every ``StreamManager``.

    ``paused`` keeps the stream stopped in every process (and releases its lease);
    a ``restart_requested_at`` later than a consumer's start restarts it.
    """

    stream_name = models.CharField(_("stream"), max_length=255, primary_key=True)
    paused = models.BooleanField(_("paused"), default=False)
    restart_requested_at = models.DateTimeField(_("restart requested at"), null=True, blank=True)
    updated_by = models.CharField(_("updated by"), max_length=150, blank=True)
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        verbose_name = _("stream control")
        verbose_name_plural = _("stream controls")

    def __str__(self) -> str:
        return self.stream_name

    @classmethod
    def request(
        cls, stream_name: str, *, by: str = "", at: datetime | None = None, **changes: object
    ) -> None:
        """Record an operator's request (``paused=...``, ``restart_requested_at=...``).

        One autocommitted statement at a time, never a read-then-write transaction:
        on SQLite such a transaction fails at once while a stream process writes
        its status, where a plain statement waits for its turn.
        """
        from django.db import IntegrityError
        from django.utils import timezone

        values = {**changes, "updated_by": by, "updated_at": at or timezone.now()}
        rows = cls.objects.filter(stream_name=stream_name)
        if rows.update(**values):
            return
        try:
            cls.objects.create(stream_name=stream_name, **values)
        except IntegrityError:  # created meanwhile by another request
            rows.update(**values)


class SnapshotRecord(models.Model):
    """The ORM snapshot store's row: one ``WorkflowSnapshot``.

    ``(coordination_id, seq)`` is unique: a coordination's snapshots are ordered by
    ``seq``, and a second runner that tries to write the same step fails on it.
    ``state`` and ``metadata`` hold the serializer's text (encrypted when the store
    has a key: ``enc:v1:...``).
    """

    id = models.CharField(_("id"), max_length=64, primary_key=True)
    parent_id = models.CharField(_("parent"), max_length=64, null=True, blank=True)  # noqa: DJ001
    coordination_id = models.CharField(_("coordination"), max_length=255)
    seq = models.BigIntegerField(_("sequence"))
    agent_name = models.CharField(_("agent"), max_length=255, null=True, blank=True)  # noqa: DJ001
    state = models.TextField(_("state"), null=True, blank=True)  # noqa: DJ001
    state_type = models.CharField(_("state type"), max_length=255, blank=True)
    metadata = models.TextField(_("metadata"), blank=True)
    created_at = models.DateTimeField(_("created at"))

    class Meta:
        verbose_name = _("workflow snapshot")
        verbose_name_plural = _("workflow snapshots")
        ordering = ["coordination_id", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["coordination_id", "seq"], name="fw_snapshot_coordination_seq"
            )
        ]
        indexes = [
            models.Index(fields=["created_at"], name="fw_snapshot_created"),
            models.Index(fields=["agent_name"], name="fw_snapshot_agent"),
            models.Index(fields=["parent_id"], name="fw_snapshot_parent"),
            # A page of the runs a user may read: each run's newest rows (listings).
            models.Index(
                fields=["coordination_id", "created_at", "seq"], name="fw_snapshot_run_created"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.coordination_id}#{self.seq}"


class WorkflowRun(models.Model):
    """One workflow run (a coordination): its status, where it is, and who runs it.

    The engine claims the run (``runner``, ``claimed_until``) with one conditional
    ``UPDATE`` before advancing it, so two runners cannot drive one coordination.
    ``idempotency_key`` is unique: ``Workflow.start(..., idempotency_key=...)``
    starts at most one run per key.
    """

    class Status(models.TextChoices):
        RUNNING = "running", _("running")
        HIBERNATED = "hibernated", _("hibernated")
        WAITING = "waiting", _("waiting for approval")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")
        NEEDS_UPGRADE = "needs_upgrade", _("needs upgrade")
        SLEEPING = "sleeping", _("sleeping")
        WAITING_CHILDREN = "waiting_children", _("waiting for child runs")
        CANCELLED = "cancelled", _("cancelled")
        WAITING_MESSAGE = "waiting_message", _("waiting for a message")
        WAITING_SLOT = "waiting_slot", _("waiting for a slot")

    coordination_id = models.CharField(_("coordination"), max_length=255, primary_key=True)
    workflow_name = models.CharField(_("workflow"), max_length=255)
    #: The version of the workflow's definition the run started on (or was upgraded
    #: to): it continues on that definition only. Runs made before versions: 1.
    # db_default too: the previous release's processes, which leave the column out of
    # their INSERTs, keep starting runs between `migrate` and the end of a rollout.
    workflow_version = models.PositiveIntegerField(_("version"), default=1, db_default=1)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.RUNNING
    )
    last_step = models.CharField(_("last step"), max_length=255, blank=True)
    head_snapshot_id = models.CharField(  # noqa: DJ001
        _("head snapshot"), max_length=64, null=True, blank=True
    )
    idempotency_key = models.CharField(
        _("idempotency key"), max_length=255, null=True, blank=True, unique=True
    )
    failure_reason = models.TextField(_("failure reason"), blank=True)
    resume_input = models.JSONField(_("resume input"), null=True, blank=True)
    runner = models.CharField(_("runner"), max_length=255, blank=True)
    claimed_until = models.DateTimeField(_("claimed until"), null=True, blank=True)
    #: Retries: a failed run run again, or a dead runner's claim taken over.
    attempts = models.PositiveIntegerField(_("retries"), default=0)
    #: When a ``sleeping`` run wakes (a step returned ``sleep(...)``).
    wake_at = models.DateTimeField(_("wakes at"), null=True, blank=True)
    #: The errors of the failed attempts of the step in progress, when its provider
    #: runs each attempt on its own (Temporal); its snapshot takes them.
    step_errors = models.JSONField(_("step errors"), null=True, blank=True, editable=False)
    #: The run whose step started this one (``spawn``); it waits for it to finish.
    parent_coordination_id = models.CharField(  # noqa: DJ001
        _("parent run"), max_length=255, null=True, blank=True, db_index=True
    )
    #: The topic a ``waiting_message`` run waits for (``wait_for``); its deadline is
    #: ``wake_at``. Meaningful only in that status. (db_default: see workflow_version.)
    waiting_topic = models.CharField(
        _("waiting for topic"), max_length=255, blank=True, default="", db_default=""
    )
    #: The queue whose limits its steps obey (``FLOWWARDEN["WORKFLOW_QUEUES"]``), when
    #: ``start(queue=...)`` named one; "" : its workflow's (``define(queue=...)``), if any.
    queue = models.CharField(_("queue"), max_length=100, blank=True, default="", db_default="")
    #: The partition of a partitioned queue it counts in (``start(partition_key=...)``).
    queue_partition = models.CharField(
        _("queue partition"), max_length=255, blank=True, default="", db_default=""
    )
    #: Lower runs first, on a queue with priorities (``start(priority=...)``); 0: none
    #: given, ahead of every priority.
    queue_priority = models.IntegerField(_("priority"), default=0, db_default=0)
    #: Since when a ``waiting_slot`` run waits (its place in the queue, after priority).
    queued_at = models.DateTimeField(_("queued at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"))
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        verbose_name = _("workflow run")
        verbose_name_plural = _("workflow runs")
        ordering = ["-updated_at"]
        permissions = [
            ("fork_workflowrun", _("Can fork a workflow run from a snapshot")),
            ("upgrade_workflowrun", _("Can upgrade workflow runs to another version")),
            ("cancel_workflowrun", _("Can cancel workflow runs")),
            ("send_message_workflowrun", _("Can send messages to workflow runs")),
        ]
        indexes = [
            models.Index(fields=["status", "updated_at"], name="fw_run_status"),
            # The sweep's due sleepers (and message waits past their deadline):
            # status IN ('sleeping', 'waiting_message') AND wake_at <= now.
            models.Index(fields=["status", "wake_at"], name="fw_run_wake"),
            # The runs' listings: the admin's changelist and the API's, newest first.
            models.Index(fields=["-updated_at", "coordination_id"], name="fw_run_updated"),
            # A queue's waiting runs, in the order they get slots.
            models.Index(
                fields=["status", "queue", "queue_partition", "queue_priority", "queued_at"],
                name="fw_run_queued",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.coordination_id}"


class DefinedWorkflow(WorkflowRun):
    """The admin's "Workflows" page: every defined workflow, its versions, its runs by
    status and its diagram. A proxy of ``WorkflowRun`` (no table, no permissions of
    its own: the page needs ``view_workflowrun``)."""

    class Meta:
        proxy = True
        verbose_name = _("workflow")
        verbose_name_plural = _("workflows")
        default_permissions = ()


class Approval(models.Model):
    """A workflow run waiting for a person: made when a step returns
    ``await_approval(...)``, decided once (approved or rejected), or expired or
    cancelled. The decision is handed to the next step when the run resumes.

    Who may decide: the ``assignees`` (usernames), members of ``group``, holders of
    ``permission`` ("app_label.codename"), and holders of ``decide_approval``.
    Decisions go through ``flowwarden_django.workflows.waiting.approvals`` (never a plain
    ``save()``), which makes them idempotent and audits them as ``ApprovalEvent``s.
    """

    class Status(models.TextChoices):
        PENDING = "pending", _("pending")
        APPROVED = "approved", _("approved")
        REJECTED = "rejected", _("rejected")
        EXPIRED = "expired", _("expired")
        CANCELLED = "cancelled", _("cancelled")

    class OnExpiry(models.TextChoices):
        RESUME = "resume", _("resume with an expired decision")
        FAIL = "fail", _("fail the run")

    id = models.UUIDField(_("id"), primary_key=True)
    coordination_id = models.CharField(_("coordination"), max_length=255)
    workflow_name = models.CharField(_("workflow"), max_length=255)
    step_name = models.CharField(_("step"), max_length=255)
    snapshot_id = models.CharField(_("snapshot"), max_length=64, unique=True)
    prompt = models.TextField(_("prompt"), blank=True)
    group = models.CharField(_("group"), max_length=150, blank=True)
    permission = models.CharField(_("permission"), max_length=255, blank=True)
    status = models.CharField(
        _("status"), max_length=16, choices=Status.choices, default=Status.PENDING
    )
    requested_at = models.DateTimeField(_("requested at"))
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    on_expiry = models.CharField(
        _("on expiry"), max_length=8, choices=OnExpiry.choices, default=OnExpiry.RESUME
    )
    #: The decider's username ("" until decided, and for an expiry). A name, not a
    #: foreign key: the audit outlives the account, and the stream half of this app
    #: must not need ``django.contrib.auth``.
    decided_by = models.CharField(_("decided by"), max_length=150, blank=True)
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    comment = models.TextField(_("comment"), blank=True)
    payload = models.JSONField(_("decision payload"), null=True, blank=True)
    #: The import path of the Django ``Form`` that validates the decision's payload
    #: (``await_approval(form=...)``), and its initial data; "": an untyped payload.
    form = models.CharField(_("form"), max_length=255, blank=True, default="", db_default="")
    form_initial = models.JSONField(_("form initial data"), null=True, blank=True)
    #: Who said "I am on this" (a username; "": unclaimed), and when. While it is
    #: claimed only the claimant decides.
    claimed_by = models.CharField(
        _("claimed by"), max_length=150, blank=True, default="", db_default=""
    )
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    #: Reminders (``await_approval(remind_every=...)``): how often, when the next is
    #: due, and how many were sent.
    remind_every = models.DurationField(_("remind every"), null=True, blank=True)
    next_reminder_at = models.DateTimeField(_("next reminder at"), null=True, blank=True)
    reminders_sent = models.PositiveIntegerField(_("reminders sent"), default=0, db_default=0)
    #: Escalation (``await_approval(escalate_after=..., escalate_to=...)``): when it is
    #: due, to whom (a group, usernames), and when it happened.
    escalate_at = models.DateTimeField(_("escalates at"), null=True, blank=True)
    escalate_to_group = models.CharField(
        _("escalates to group"), max_length=150, blank=True, default="", db_default=""
    )
    escalate_to_users = models.JSONField(_("escalates to users"), null=True, blank=True)
    escalated_at = models.DateTimeField(_("escalated at"), null=True, blank=True)

    class Meta:
        verbose_name = _("approval")
        verbose_name_plural = _("approvals")
        ordering = ["-requested_at", "id"]
        permissions = [
            ("decide_approval", _("Can decide any approval")),
            ("reassign_approval", _("Can reassign approvals")),
        ]
        indexes = [
            models.Index(fields=["status", "requested_at"], name="fw_approval_status"),
            models.Index(fields=["coordination_id"], name="fw_approval_coordination"),
            models.Index(fields=["status", "expires_at"], name="fw_approval_expiry"),
            # The approvals' listings, in their order (and the admin's date hierarchy),
            # and of one workflow (and the admin's workflow filter).
            models.Index(fields=["-requested_at", "id"], name="fw_approval_requested"),
            models.Index(
                fields=["workflow_name", "-requested_at", "id"], name="fw_approval_workflow"
            ),
            # The sweep's due reminders and escalations.
            models.Index(fields=["status", "next_reminder_at"], name="fw_approval_remind"),
            models.Index(fields=["status", "escalate_at"], name="fw_approval_escalate"),
        ]

    def __str__(self) -> str:
        return f"{self.workflow_name} {self.coordination_id} @ {self.step_name} ({self.status})"

    @property
    def assignees(self) -> list[str]:
        """The usernames the approval is assigned to, sorted."""
        return sorted(a.username for a in self.assignments.all())

    @property
    def decider(self) -> str | None:
        """The decider's username, or ``None``."""
        return self.decided_by or None

    @property
    def is_decided(self) -> bool:
        return self.status != self.Status.PENDING


class ApprovalAssignee(models.Model):
    """One username an ``Approval`` is assigned to (a row, so "mine" is one indexed
    query on every database)."""

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="assignments")
    username = models.CharField(_("username"), max_length=150)

    class Meta:
        verbose_name = _("approval assignee")
        verbose_name_plural = _("approval assignees")
        constraints = [
            models.UniqueConstraint(fields=["approval", "username"], name="fw_approval_assignee")
        ]
        indexes = [models.Index(fields=["username"], name="fw_assignee_username")]

    def __str__(self) -> str:
        return self.username


class ApprovalEvent(models.Model):
    """The audit trail of an ``Approval``: its request, every decision, expiry and
    cancellation, and every refused attempt (a conflicting or late decision)."""

    class Action(models.TextChoices):
        REQUESTED = "requested", _("requested")
        APPROVED = "approved", _("approved")
        REJECTED = "rejected", _("rejected")
        EXPIRED = "expired", _("expired")
        CANCELLED = "cancelled", _("cancelled")
        REPEATED = "repeated", _("same decision repeated")
        REFUSED = "refused", _("decision refused")
        CLAIMED = "claimed", _("claimed")
        RELEASED = "released", _("released")
        REASSIGNED = "reassigned", _("reassigned")
        REMINDED = "reminded", _("reminder sent")
        ESCALATED = "escalated", _("escalated")

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="events")
    action = models.CharField(_("action"), max_length=16, choices=Action.choices)
    actor = models.CharField(_("actor"), max_length=150, blank=True)
    at = models.DateTimeField(_("at"))
    comment = models.TextField(_("comment"), blank=True)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    detail = models.TextField(_("detail"), blank=True)

    class Meta:
        verbose_name = _("approval event")
        verbose_name_plural = _("approval events")
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor or 'system'} at {self.at:%Y-%m-%d %H:%M:%S}"


class WorkflowMessage(models.Model):
    """A message sent to a workflow run (``Workflow.send``, ``ctx.send``): its mailbox
    is its rows of one ``coordination_id`` and ``topic``.

    Sent in the sender's transaction; delivered once, to the first wait for its topic
    (``wait_for``) that finds it, oldest (``id``) first: ``delivered_to`` is then the
    waiting snapshot it was bound to, unique, so a snapshot gets one message and a
    retry of the step after it reads the same one. ``idempotency_key`` is unique per
    run (``NULL`` keys never clash): a second send with the same key stores nothing.
    """

    coordination_id = models.CharField(_("coordination"), max_length=255)
    topic = models.CharField(_("topic"), max_length=255)
    payload = models.JSONField(_("payload"))
    sender = models.CharField(_("sender"), max_length=255, blank=True)
    sent_at = models.DateTimeField(_("sent at"))
    idempotency_key = models.CharField(  # noqa: DJ001
        _("idempotency key"), max_length=255, null=True, blank=True
    )
    #: The id of the waiting snapshot the message was delivered to (``None``: not yet).
    delivered_to = models.CharField(
        _("delivered to snapshot"), max_length=64, null=True, blank=True, unique=True
    )
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)

    class Meta:
        verbose_name = _("workflow message")
        verbose_name_plural = _("workflow messages")
        ordering = ["coordination_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["coordination_id", "idempotency_key"], name="fw_message_key"
            )
        ]
        indexes = [
            # The oldest undelivered message of a run's topic (delivered_to IS NULL),
            # and the sweep's "a waiting run has one".
            models.Index(
                fields=["coordination_id", "topic", "delivered_to", "id"], name="fw_message_mailbox"
            ),
        ]

    def __str__(self) -> str:
        state = "delivered" if self.delivered_to else "pending"
        return f"{self.topic} to {self.coordination_id} ({state})"


class WorkflowEvent(models.Model):
    """A value a workflow run publishes under *key* (``ctx.set_event``), read with
    ``Workflow.get_event``: one row per run and key, the latest value wins."""

    coordination_id = models.CharField(_("coordination"), max_length=255)
    key = models.CharField(_("key"), max_length=255)
    value = models.JSONField(_("value"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"))

    class Meta:
        verbose_name = _("workflow event")
        verbose_name_plural = _("workflow events")
        ordering = ["coordination_id", "key"]
        constraints = [
            models.UniqueConstraint(fields=["coordination_id", "key"], name="fw_event_key")
        ]

    def __str__(self) -> str:
        return f"{self.coordination_id}: {self.key}"


class WorkflowQueueSlot(models.Model):
    """One unit of a workflow queue's capacity in one partition (``workflows.queues``).

    A ``concurrency`` slot is held by one step (its run: ``holder``, under ``token``)
    until ``held_until``, a lease its runner renews while the step runs; a ``rate``
    slot is one start of the queue's rate, spent until ``held_until`` (its use plus
    the rate's period). A slot is free when ``held_until`` is unset or past. It is
    taken by one conditional ``UPDATE`` on its ``token``, so two holders never share
    it, and a dead holder's slot is free again when its lease runs out.
    """

    class Kind(models.TextChoices):
        CONCURRENCY = "concurrency", _("concurrency")
        RATE = "rate", _("rate")

    queue = models.CharField(_("queue"), max_length=100)
    partition = models.CharField(_("partition"), max_length=255, blank=True, default="")
    kind = models.CharField(_("kind"), max_length=12, choices=Kind.choices)
    number = models.PositiveIntegerField(_("number"))
    holder = models.CharField(_("held by run"), max_length=255, blank=True, default="")
    token = models.CharField(_("token"), max_length=64, blank=True, default="")
    held_until = models.DateTimeField(_("held until"), null=True, blank=True)

    class Meta:
        verbose_name = _("workflow queue slot")
        verbose_name_plural = _("workflow queue slots")
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "partition", "kind", "number"], name="fw_queue_slot_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.queue}[{self.partition}] {self.kind} #{self.number}"


class ApprovalNotification(models.Model):
    """One notification of an ``Approval`` event (its request, an assignment, a
    reminder, an escalation) to its recipients: written with the event, in its
    transaction, and unique per event, so a retry or a crash never notifies twice;
    ``sent_at`` says the email went out (``FLOWWARDEN["APPROVAL_EMAILS"]``)."""

    class Event(models.TextChoices):
        REQUESTED = "requested", _("requested")
        ASSIGNED = "assigned", _("assigned")
        REMINDED = "reminded", _("reminder")
        ESCALATED = "escalated", _("escalated")

    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(_("event"), max_length=16, choices=Event.choices)
    #: Which one of its kind (the reminder's number; 0 otherwise).
    number = models.PositiveIntegerField(_("number"), default=0)
    recipients = models.JSONField(_("recipients"), default=list)
    created_at = models.DateTimeField(_("created at"))
    #: When a sender took it on (taken once: a crash after this loses the email
    #: rather than sending it twice), and when it was sent.
    sending_at = models.DateTimeField(_("sending at"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True)

    class Meta:
        verbose_name = _("approval notification")
        verbose_name_plural = _("approval notifications")
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "event", "number"], name="fw_approval_notification_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.event} #{self.number} of {self.approval_id}"
