"""What the step runners of the remote execution providers share: the Celery
provider's step task and the Temporal provider's step activity each run one step of a
run in a worker, as a ``RemoteStepWorkflow``."""

from __future__ import annotations

from ..workflows.definition.registry import RegisteredWorkflow
from ..workflows.engine.workflow import Workflow


class RemoteStepWorkflow(Workflow):
    """The workflow a remote step runner runs: one version of a registered
    workflow (*definition*) for one coordination, asked for by *origin* (``run``, a
    wake, the next step...), which may take the run from the hand-off tokens
    *held_by*. Subclasses name the terms of its claim (``_claim_terms``) and why a
    refused claim means the step is no longer wanted (``_stale``)."""

    def __init__(
        self,
        definition: RegisteredWorkflow,
        coordination_id: str,
        origin: str,
        held_by: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            definition.name,
            coordination_id,
            definition.steps,
            definition.store,
            using=definition.using,
            version=definition.version,
        )
        self.origin = origin
        self.held_by = held_by
