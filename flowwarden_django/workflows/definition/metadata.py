"""The metadata keys of every snapshot the engine writes.

They live below the engine so that what reads them (approvals, the recovery sweep,
execution providers) needs no engine import. ``engine`` re-exports them.
"""

#: The step whose snapshot this is (``""`` for the seed snapshot).
LAST_STEP = "workflow.lastStep"
#: The name of the workflow the snapshot belongs to.
WORKFLOW_NAME = "workflow.name"
#: ``"true"`` once the run is done (a ``done`` outcome), else ``"false"``.
WORKFLOW_DONE = "workflow.done"
#: On the snapshot of a ``sleep`` outcome: when the run wakes (ISO 8601, UTC).
WAKE_AT = "workflow.wakeAt"
#: On the snapshot ``Workflow.cancel`` writes: JSON ``{"reason": ..., "by": ...}``.
CANCELLED = "workflow.cancelled"
#: On every step's snapshot: how long its last attempt took (milliseconds, as text).
STEP_DURATION_MS = "workflow.step.durationMs"
#: On every step's snapshot: how many attempts the step took (as text).
STEP_ATTEMPTS = "workflow.step.attempts"
#: On a step's snapshot when attempts failed before it succeeded: JSON list of
#: ``{"attempt": n, "error": class name, "message": text}`` (the message is shown
#: only to those who may read the run's state: ``workflows.step_timings``).
STEP_ERRORS = "workflow.step.errors"
#: On the snapshot of a step that jumped (``advance(state, to="poll")``, see
#: ``definition.graph``): the step the run continues at, instead of the one after
#: ``workflow.lastStep``.
NEXT_STEP = "workflow.nextStep"
#: On every snapshot once a run has jumped: the furthest step in the list's order it
#: has completed (what a patch's answer is worked out from: ``definition.patches``).
FURTHEST_STEP = "workflow.furthestStep"
#: On every step's snapshot: when its last attempt started (ISO 8601, UTC).
STEP_STARTED_AT = "workflow.step.startedAt"
#: On every step's snapshot: the process its last attempt ran in (``<instance>``:
#: ``FLOWWARDEN["INSTANCE_ID"]`` or ``<hostname>:<pid>``).
STEP_WORKER = "workflow.step.worker"
#: On every step's snapshot: the execution provider that ran it (``inprocess``,
#: ``celery``, ``temporal``).
STEP_PROVIDER = "workflow.step.provider"
#: On the snapshot of a pausing step: the status the run waits in (``waiting``,
#: ``sleeping``, ``waiting_children``, ``waiting_message``, ...), for the timeline.
PAUSE_STATUS = "workflow.pause.status"
