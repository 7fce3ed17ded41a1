"""The Python processes of the fault tests (``tests.faults.partitioned_workflow``,
``tests.faults.probe_client``), on the host or inside a namespace: see
``tests.support.line_processes``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tests.support.line_processes import JsonLinesProcess, database_env

__all__ = ["JsonLinesProcess", "WorkflowProcess", "database_env"]


class WorkflowProcess(JsonLinesProcess):
    """A ``python -m tests.faults.partitioned_workflow ARGS`` process."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str],
        log_path: Path,
        wrap: Callable[[list[str]], list[str]] = list,
    ) -> None:
        super().__init__(["tests.faults.partitioned_workflow", *args], env, log_path, wrap)
