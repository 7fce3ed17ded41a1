"""Execution providers: where a workflow's steps run.

``FLOWWARDEN["WORKFLOW_EXECUTION"]`` picks one: ``"inprocess"`` (the default: steps run
in the calling thread), ``"celery"``, or the dotted path of an ``ExecutionProvider``
subclass. ``resolve_provider()`` runs on every ``Workflow.run()`` / ``resume()``: when
the configured provider says it is not available (``is_available()`` is False or
raises: its broker is down, say), the run falls back to the in-process engine and
the fallback is logged (a WARNING when it starts, again when it ends); with
``FLOWWARDEN["WORKFLOW_FALLBACK_TO_INPROCESS"] = False`` it raises
``ExecutionUnavailableError`` instead, so steps never run inside a web request.

A provider must never call ``Workflow.run()`` or ``resume()`` (they resolve the
provider again); it calls ``Workflow.run_local()``, in this process or in a worker.

This is the engine's service provider interface: the engine imports it, and it
imports nothing of the engine. ``ExecutableWorkflow`` says what a provider may use
of the ``Workflow`` it is handed.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ...conf import SETTING_NAME, fw_settings
from ..runs.records import RunStatus

if TYPE_CHECKING:
    from ...models import WorkflowRun
    from ..definition.results import WorkflowResult
    from ..runs.records import RunRecords
    from ..storage.snapshot import WorkflowSnapshot

logger = logging.getLogger("flowwarden_django.workflows")

SETTING = f'{SETTING_NAME}["WORKFLOW_EXECUTION"]'

#: Short names accepted by the setting.
PROVIDER_ALIASES = {
    "inprocess": "flowwarden_django.workflows.execution.providers.InProcessProvider",
    "celery": "flowwarden_django.integrations.celery.provider.CeleryExecutionProvider",
    "temporal": "flowwarden_django.integrations.temporal.provider.TemporalExecutionProvider",
}


class InvalidExecutionProviderError(ImproperlyConfigured):
    """``FLOWWARDEN["WORKFLOW_EXECUTION"]`` names no usable provider."""


class ExecutionUnavailableError(ConnectionError):
    """The configured provider is unreachable and ``WORKFLOW_FALLBACK_TO_INPROCESS``
    is False: the run was not run here (nothing was written by ``run()`` or
    ``resume()``; a run ``start()`` recorded is continued by the sweep later)."""


class ExecutableWorkflow(Protocol):
    """What a provider may use of the workflow it runs (``engine.Workflow``): never
    ``run()`` or ``resume()``, which would resolve the provider again."""

    @property
    def name(self) -> str: ...

    @property
    def coordination_id(self) -> str: ...

    @property
    def version(self) -> int:
        """The version of the workflow's definition this is (and its run is on)."""
        ...

    @property
    def runs(self) -> RunRecords:
        """The run's ``WorkflowRun`` records (``runs.db``: its database)."""
        ...

    def run_local(
        self, initial_state: Any = None, input: Any = None, *, max_steps: int | None = None
    ) -> WorkflowResult:
        """Claim the run and execute (up to *max_steps*) steps in this thread."""
        ...

    def seed(self, initial_state: Any = None) -> WorkflowSnapshot:
        """Make sure the run and its seed snapshot exist; the latest snapshot."""
        ...

    def run_record(self) -> WorkflowRun | None: ...

    def current_result(self) -> WorkflowResult | None: ...


class ExecutionProvider(ABC):
    """Runs workflows somewhere. Subclasses set ``name`` and implement ``run``.

    * ``is_available()``: whether it can run workflows right now (runtime truth: a
      reachable broker, say). Called on every run, so cache a failed probe for a
      while. Not available means the in-process engine runs the workflow instead.
    * ``run(workflow, initial_state, input)``: run or continue *workflow* (through
      ``workflow.run_local``, never ``workflow.run``) and return its
      ``WorkflowResult``. An asynchronous provider persists what the run needs
      first (``workflow.seed(initial_state)``), queues the work (each step can be
      ``run_local(input=..., max_steps=1)`` in a worker, with the workflow rebuilt by
      ``Workflow.for_coordination(cid)``) and returns ``Running``.
    * ``run_changed(coordination_id, using)``: the run changed outside its steps (a
      fork); a provider that waits on its own (Temporal: a waiting run's expiry timer)
      re-reads it. Called once the change has committed; by default nothing happens.
    * ``cancelled(workflow)``: the run was cancelled (``Workflow.cancel``); called once
      the cancel committed. Temporal cancels the run's workflow; by default nothing
      happens (queued work finds the run cancelled and does nothing).
    * ``continue_running(workflow)``: a queue handed the waiting run a slot and made it
      ``running``, held by nobody (``workflows.queues.dispatch``): continue it. By
      default ``run(workflow)``; Temporal only signals the run's workflow, which
      waits for that.
    """

    name: ClassVar[str] = ""

    def is_available(self) -> bool:
        return True

    def run_changed(self, coordination_id: str, using: str) -> None:
        """The run changed outside its steps (see the class docstring)."""
        return None

    def cancelled(self, workflow: ExecutableWorkflow) -> None:
        """The run was cancelled (see the class docstring)."""
        return None

    def continue_running(self, workflow: ExecutableWorkflow) -> None:
        """Continue a run a queue made ``running`` (see the class docstring)."""
        self.run(workflow)

    @abstractmethod
    def run(
        self,
        workflow: ExecutableWorkflow,
        initial_state: Any = None,
        input: Any = None,
    ) -> WorkflowResult:
        """Run or continue *workflow*; see the class docstring."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class RemoteExecutionProvider(ExecutionProvider):
    """A provider whose steps run elsewhere (a broker's workers, a Temporal server).

    ``is_available()`` asks :meth:`probe` and trusts the answer for a while: a failed
    check for :attr:`failure_ttl` seconds (the runs meanwhile go in-process, and the
    return is noticed within seconds), a good one for :attr:`success_ttl`, so runs do
    not each pay for a connection. :meth:`handover` seeds a run and says whether there
    is anything to hand over.
    """

    #: Seconds a failed check is trusted.
    failure_ttl: float = 2.0
    #: Seconds a good check is trusted.
    success_ttl: float = 5.0
    #: Raised by ``is_available()`` with the probe's reason.
    unavailable_error: ClassVar[type[Exception]] = ConnectionError

    def __init__(self) -> None:
        self._health_lock = threading.Lock()
        self._last_check: tuple[float, str] | None = None  # (monotonic time, error or "")

    @abstractmethod
    def probe(self) -> str:
        """Why workflows cannot be run there right now; ``""`` when they can."""

    def is_available(self) -> bool:
        """True when the last probe (or a new one) succeeded, else
        :attr:`unavailable_error` with its reason."""
        with self._health_lock:
            last = self._last_check
        if last is not None:
            checked_at, error = last
            if time.monotonic() - checked_at < (self.failure_ttl if error else self.success_ttl):
                if error:
                    raise self.unavailable_error(error)
                return True
        error = self.probe()
        self.remember(error)
        if error:
            raise self.unavailable_error(error)
        return True

    def remember(self, error: str) -> None:
        """Record a check's outcome (a failed hand-over counts as a failed check)."""
        with self._health_lock:
            self._last_check = (time.monotonic(), error)

    @staticmethod
    def handover(
        workflow: ExecutableWorkflow, initial_state: Any, input: Any
    ) -> tuple[Any, Any, WorkflowResult | None]:
        """Seed the run: its head snapshot, its record, and its current result when
        there is nothing to hand over (completed or cancelled, or waiting and given no
        input)."""
        started = getattr(workflow, "started_with", None)
        if started is not None and input is None:
            # Just created and seeded by ``WorkflowDefinition.start``: running at its
            # seed (whatever happened since, the step that runs it checks again).
            workflow.started_with = None
            head, record = started
            return head, record, None
        head = workflow.seed(initial_state)
        record = workflow.run_record()
        assert record is not None  # seed() made it
        if record.status in RunStatus.FINAL or (
            record.status == RunStatus.WAITING
            and input is None
            and record.head_snapshot_id == head.id
        ):
            return head, record, workflow.current_result()
        return head, record, None


class InProcessProvider(ExecutionProvider):
    """Runs the steps in the calling thread (``Workflow.run_local``). Always available."""

    name = "inprocess"

    def run(
        self,
        workflow: ExecutableWorkflow,
        initial_state: Any = None,
        input: Any = None,
    ) -> WorkflowResult:
        return workflow.run_local(initial_state, input)


_in_process = InProcessProvider()
_providers: dict[Any, ExecutionProvider] = {}
_falling_back: set[Any] = set()
_lock = threading.Lock()


def configured_provider() -> ExecutionProvider:
    """The provider ``FLOWWARDEN["WORKFLOW_EXECUTION"]`` names (one instance per value),
    without checking that it is available. ``InvalidExecutionProviderError`` when the
    setting names nothing usable."""
    value = fw_settings.WORKFLOW_EXECUTION
    if isinstance(value, ExecutionProvider):
        return value
    with _lock:
        provider = _providers.get(value)
        if provider is None:
            provider = _providers[value] = _build(value)
        return provider


def _build(value: Any) -> ExecutionProvider:
    cls = value
    if isinstance(value, str):
        path = PROVIDER_ALIASES.get(value, value)
        if path == PROVIDER_ALIASES["inprocess"]:
            return _in_process
        try:
            cls = import_string(path)
        except ImportError as exc:
            hint = "" if "." in value else f" (use one of: {', '.join(PROVIDER_ALIASES)})"
            raise InvalidExecutionProviderError(
                f"{SETTING} = {value!r} cannot be imported: {exc}{hint}"
            ) from exc
    if not (isinstance(cls, type) and issubclass(cls, ExecutionProvider)):
        raise InvalidExecutionProviderError(
            f"{SETTING} = {value!r} is not an ExecutionProvider subclass"
        )
    return cls()


def resolve_provider() -> ExecutionProvider:
    """The provider for the next run: the configured one when it is available, else
    the in-process one (logged)."""
    provider = configured_provider()
    if isinstance(provider, InProcessProvider):
        return provider
    try:
        available = bool(provider.is_available())
        problem = "is not available"
    except Exception as exc:
        available = False
        problem = f"failed its health check ({exc!r})"
    key = id(provider)
    with _lock:
        was_falling_back = key in _falling_back
        if available:
            _falling_back.discard(key)
        else:
            _falling_back.add(key)
    if available:
        if was_falling_back:
            logger.warning("workflow execution provider %r is available again", provider.name)
        return provider
    if not fw_settings.WORKFLOW_FALLBACK_TO_INPROCESS:
        raise ExecutionUnavailableError(
            f"workflow execution provider {provider.name!r} {problem}, and "
            f'{SETTING_NAME}["WORKFLOW_FALLBACK_TO_INPROCESS"] is False: not running it '
            "in this process. Try again once the provider answers."
        )
    log = logger.debug if was_falling_back else logger.warning
    log(
        "workflow execution provider %r %s; running workflows in-process instead",
        provider.name,
        problem,
    )
    return _in_process


def reset_providers() -> None:
    """Forget provider instances (tests; ``FLOWWARDEN`` changes)."""
    with _lock:
        _providers.clear()
        _falling_back.clear()
