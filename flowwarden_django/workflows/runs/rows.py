"""The ``WorkflowRun`` rows of one database, and the reads of one run: what the run
records' statements start from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import router

from ...common.app_models import models

if TYPE_CHECKING:
    from ...models import WorkflowRun


class RunRows:
    """``WorkflowRun`` rows of one database (``using``; by default the router's
    ``db_for_write``, for reads too)."""

    def __init__(self, using: str | None = None) -> None:
        self.using = using

    @property
    def db(self) -> str:
        return self.using or router.db_for_write(models.WorkflowRun)

    def _rows(self) -> Any:
        return models.WorkflowRun.objects.using(self.db)

    # -- reads ---------------------------------------------------------------------------

    def get(self, coordination_id: str) -> WorkflowRun | None:
        """The run of *coordination_id*, or ``None``."""
        return self._rows().filter(pk=coordination_id).first()

    def get_by_key(self, idempotency_key: str) -> WorkflowRun | None:
        """The run started with *idempotency_key*, or ``None``."""
        return self._rows().filter(idempotency_key=idempotency_key).first()
