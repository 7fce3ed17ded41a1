"""What the step runners of the remote execution providers share: the Celery
provider's step task and the Temporal provider's step activity each run one step of a
run in a worker, as a ``RemoteStepWorkflow``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..workflows.engine.workflow import Workflow
from ..workflows.runs.records import ClaimTerms, RunStatus

if TYPE_CHECKING:
    from ..models import WorkflowRun


class RemoteStepWorkflow(Workflow):
    """The workflow a remote step runner runs: one version of a registered
    workflow (*definition*) for one coordination, asked for by *origin* (``run``, a
    wake, the next step...), which may take the run from the hand-off tokens
    *held_by*. A refused claim of a run that is not ``running`` raises the
    subclass's ``stale_error``; a subclass may claim on stricter terms
    (``_claim_terms``, ``_stale``)."""

    #: What ``_stale`` raises: the step is no longer wanted.
    stale_error: ClassVar[type[Exception]]

    def __init__(
        self, *args: Any, origin: str, held_by: tuple[str, ...] = (), **options: Any
    ) -> None:
        # Made by ``WorkflowDefinition.workflow(cid, kind=..., origin=...)``: the
        # definition's name, steps, store, database, version and queue.
        super().__init__(*args, **options)
        self.origin = origin
        self.held_by = held_by

    def _claim_terms(self) -> ClaimTerms:
        # A paused or finished run is claimed only for run() / resume() (a "run"
        # wake); the input is stored with the claim, in one statement with (ORM
        # store) the head's read. A run handed on is taken from its hand-off tokens.
        return ClaimTerms(running_only=self.origin != "run", held_by=self.held_by)

    def _stale(self, current: WorkflowRun, terms: ClaimTerms) -> None:
        if terms.running_only and current.status != RunStatus.RUNNING:
            raise self.stale_error(
                f"the run is {current.status}; only run() or resume() continues it"
            )
