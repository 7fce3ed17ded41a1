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
