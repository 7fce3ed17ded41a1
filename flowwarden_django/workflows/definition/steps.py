"""Workflow steps: the ``WorkflowStep`` base class, the ``@step`` decorator, the
``StepContext`` a step may ask for, and the outcomes a step returns.

A step receives the state and returns one of ``advance(state)``, ``hibernate(state)``,
``sleep(state, for_=...)``, ``done(state)`` or ``fail(reason)``; ``advance``,
``hibernate`` and ``sleep`` (and ``wait_for``, ``waiting.messages``) take
``to="step"`` to continue at another step of the workflow, earlier or later (loops
and branches: ``definition.graph``). Steps must be idempotent: a retry runs the
step again, and so does a resume after a crash between the step's side effect and
its snapshot. ``ctx.idempotency_key`` is the same for every attempt and every run of
one step of one coordination, so a side effect keyed on it happens once.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, overload

from django.utils import timezone

from ..runs.records import RunStatus
from .decisions import ApprovalDecision
from .graph import check_goes_to, check_jump_target, continue_index
from .messages import Message, StepOutbox
from .metadata import WAKE_AT
from .patches import PatchBook, check_patches


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a step knows about its run.

    ``input`` is the value handed to ``Workflow.resume(input=...)`` (for the first
    step a resumed run executes; ``None`` for the others). ``decision`` is the
    ``ApprovalDecision`` of the step before it, when that step returned
    ``await_approval``: read from the decided ``Approval`` row, never from the input
    (``None`` for every other step). ``children`` holds the ``ChildResult`` of each
    child run the step before it started with ``spawn`` (empty for every other step).
    ``attempt`` counts from 1 within one run of the
    step (``max_retries + 1`` at most). ``idempotency_key`` is
    ``"<coordination_id>:<step_name>"``: stable across attempts, runs and processes.
    ``patched(id)`` answers whether the run takes the new code of a patch (see
    ``workflows.patches``). ``message`` is the ``Message`` delivered to the step
    before it, when that step returned ``wait_for``: read from the message's row,
    never from the input (``None`` after the wait's timeout, and for every other
    step). ``send`` sends a message to a run, ``set_event`` publishes a value (see
    ``waiting.messages``).
    """

    coordination_id: str
    workflow_name: str
    step_name: str
    attempt: int = 1
    input: Any = None
    decision: ApprovalDecision | None = None
    patch_book: PatchBook | None = dataclasses.field(default=None, repr=False, compare=False)
    #: The outcomes of the child runs the step before it spawned (``ChildResult`` each).
    children: tuple[Any, ...] = ()
    #: The message the step before it waited for (``wait_for``), or ``None``.
    message: Message | None = None
    #: Where ``send`` and ``set_event`` go: the engine gives each attempt its own.
    outbox: StepOutbox | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def idempotency_key(self) -> str:
        return f"{self.coordination_id}:{self.step_name}"

    def patched(self, patch_id: str) -> bool:
        """True when this run takes the new code of patch *patch_id* (it reached the
        step declaring it after the change), False when that step ran the old code;
        the same answer every time for one run. ``UndeclaredPatchError`` when no step
        declares it. Outside a run (a step called in a unit test): True."""
        if self.patch_book is None:
            return True
        return self.patch_book.answer(patch_id)

    def send(self, coordination_id: str, topic: str, payload: dict[str, Any]) -> Message:
        """Send *payload* (a JSON object) on *topic* to run *coordination_id* (see
        ``Workflow.send``), once: its idempotency key is made of the snapshot this
        step runs from, the step's name and how many sends this attempt made before,
        so a retry or a redelivery of the step sends nothing new. The sender is this
        run's coordination id."""
        return self._outbox("send").send(coordination_id, topic, payload)

    def set_event(self, key: str, value: Any) -> None:
        """Publish *value* (JSON) under *key* for ``Workflow.get_event``: the latest
        value set wins."""
        self._outbox("set_event").set_event(key, value)

    def _outbox(self, what: str) -> StepOutbox:
        if self.outbox is None:
            raise RuntimeError(
                f"ctx.{what}() works in a step of a running workflow; a StepContext "
                "made by hand needs an outbox="
            )
        return self.outbox


# -- outcomes ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What a step decided. Use the factories ``advance``, ``hibernate``, ``done``, ``fail``."""


@dataclasses.dataclass(frozen=True)
class Advance(StepOutcome):
    """Persist *state* and continue with the next step, or with step *to* (a name of
    the same workflow, earlier or later: ``definition.graph``)."""

    state: Any = None
    to: str = dataclasses.field(default="", kw_only=True)


@dataclasses.dataclass(frozen=True)
class Pause(StepOutcome):
    """Persist *state* and return to the caller; the run continues at the next step
    when run or resumed again. No thread or task is held meanwhile.

    Subclasses set ``status`` (the run's status while paused) and may add snapshot
    metadata (``snapshot_metadata``), rows written in the pause's own transaction
    (``persist_with``) and act once it is persisted (``on_paused``): this is how
    waiting for an approval (status ``waiting``) plugs in. A run paused with status
    ``waiting`` only continues when resumed with input.
    """

    state: Any = None
    status: ClassVar[str] = RunStatus.HIBERNATED

    def snapshot_metadata(self) -> dict[str, str]:
        """Extra metadata for the paused step's snapshot."""
        return {}

    def run_fields(self) -> dict[str, Any]:
        """Extra ``WorkflowRun`` fields set with the pause's status (in the same
        statement)."""
        return {}

    def persist_with(self, workflow: Any, snapshot: Any) -> None:
        """Write what the pause needs in the transaction that saves its snapshot and
        sets the run's status (an ``Approval`` row, say), on the run's database: a
        reader never sees the paused run without it, and a crash leaves neither."""

    def on_paused(self, workflow: Any, snapshot: Any) -> None:
        """Called once the pause is persisted (the snapshot saved, the run's status set
        and its runner released), in the runner's thread: arm a reminder, notify
        someone. An exception propagates out of ``run()``; the pause stays persisted."""


@dataclasses.dataclass(frozen=True)
class Hibernate(Pause):
    """Persist *state* and return ``Hibernated``; resume starts at the next step (at
    step *to* when given)."""

    to: str = dataclasses.field(default="", kw_only=True)


@dataclasses.dataclass(frozen=True)
class Sleep(Pause):
    """Persist *state* and wait until *wake_at* (an aware ``datetime``): status
    ``sleeping``, no thread or task held. The recovery sweep (every Celery worker's,
    ``flowwarden_temporal_worker``'s, or ``flowwarden_workflows recover --every``)
    continues it once due; on Temporal a durable timer does. ``run()`` or
    ``resume()`` before then continues it early. It continues at the next step, or
    at step *to* when given."""

    wake_at: datetime | None = None
    status: ClassVar[str] = RunStatus.SLEEPING
    to: str = dataclasses.field(default="", kw_only=True)

    def snapshot_metadata(self) -> dict[str, str]:
        assert self.wake_at is not None
        return {WAKE_AT: self.wake_at.astimezone(UTC).isoformat()}

    def run_fields(self) -> dict[str, Any]:
        return {"wake_at": self.wake_at}


@dataclasses.dataclass(frozen=True)
class Done(StepOutcome):
    """Persist *state* and end the run (``Completed``), even before the last step."""

    state: Any = None


@dataclasses.dataclass(frozen=True)
class Fail(StepOutcome):
    """End this run as ``Failed`` without retrying and without persisting anything:
    a later run executes this step again."""

    reason: str = ""


def advance(state: Any, *, to: str | None = None) -> Advance:
    """Continue with the next step from *state*; or, *to* given, with that step of
    the same workflow, earlier or later (a loop, a branch; see ``definition.graph``).
    """
    return Advance(state, to=check_jump_target(to))


def hibernate(state: Any, *, to: str | None = None) -> Hibernate:
    """Persist *state* and stop until the workflow is run or resumed again; it then
    continues with the next step, or with step *to*."""
    return Hibernate(state, to=check_jump_target(to))


def deadline_after(duration: float | timedelta, what: str) -> datetime:
    """Now + *duration* (seconds or a ``timedelta``): when a sleep for it, or a wait
    with it as its timeout, ends. ``TypeError`` / ``ValueError`` (naming the
    parameter *what*) unless it is a finite duration >= 0."""
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{what} must be seconds or a timedelta, not {duration!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} must be a finite duration >= 0, not {duration!r}")
    return timezone.now() + timedelta(seconds=seconds)


def sleep(
    state: Any,
    for_: float | timedelta | None = None,
    *,
    until: datetime | None = None,
    to: str | None = None,
) -> Sleep:
    """Persist *state* and wait, holding nothing, for *for_* (seconds or a
    ``timedelta``) or *until* an aware ``datetime`` (exactly one of them); the run
    then continues with the next step, or with step *to*. A time already past
    continues it at the next sweep (see ``Sleep``)."""
    if (for_ is None) == (until is None):
        raise ValueError("sleep() takes exactly one of for_= and until=")
    if until is None:
        until = deadline_after(for_, "for_")  # type: ignore[arg-type]
    elif not isinstance(until, datetime) or timezone.is_naive(until):
        raise ValueError(f"until must be an aware datetime, not {until!r}")
    return Sleep(state, wake_at=until, to=check_jump_target(to))


def done(state: Any) -> Done:
    """Finish the workflow with *state*."""
    return Done(state)


def fail(reason: str) -> Fail:
    """Fail the run with *reason* (not retried; nothing persisted)."""
    return Fail(str(reason))


# -- steps ---------------------------------------------------------------------------

#: The kinds a step may declare (``WorkflowStep.kind``), shown by the admin's diagram:
#: it asks for an approval, sleeps, spawns child runs, or waits for a message.
STEP_KINDS = ("approval", "sleep", "spawn", "wait")


class WorkflowStep:
    """One step of a workflow. Subclass and implement ``execute(state, ctx)``.

    ``name`` is the stable resume key (a run paused after a step its workflow no
    longer has waits as ``needs_upgrade``: give a changed workflow a new version).
    ``max_retries``: extra attempts after an exception (a returned ``fail`` is never
    retried); ``retry_delay``: seconds between attempts;
    ``timeout``: seconds an attempt may take (``None`` = no limit), see
    ``StepTimeoutError``. ``short``: whether the step is short work that needs no
    heartbeat (``True``), is not (``False``), or is judged by its ``timeout``
    (``None``, the default); on Temporal a short step runs as a local activity (see
    ``integrations.temporal``), elsewhere it changes nothing. ``patches``: the ids of
    the changes this step introduces for runs that reach it from now on
    (``ctx.patched(id)``; see ``workflows.patches``). ``goes_to``: the steps it may
    jump to (``advance(state, to=...)``) besides the next one; ``None`` (the default):
    any step (see ``definition.graph``). ``kind``: what the step does, for the
    admin's diagram: one of ``STEP_KINDS`` (``"approval"``, ``"sleep"``, ``"spawn"``,
    ``"wait"``), or ``None`` (the default: a plain step; nothing checks it).
    ``transactional``: the step's writes to the runs' database commit in one
    transaction with its snapshot, so a save the fence refuses rolls them back (see
    ``engine.transactional``); it takes no ``timeout``.
    """

    name: str = ""
    max_retries: int = 0
    retry_delay: float = 0.1
    timeout: float | None = None
    short: bool | None = None
    patches: tuple[str, ...] = ()
    goes_to: tuple[str, ...] | None = None
    kind: str | None = None
    transactional: bool = False

    def __init__(
        self,
        name: str | None = None,
        *,
        max_retries: int | None = None,
        retry_delay: float | None = None,
        timeout: float | None = None,
        short: bool | None = None,
        patches: Sequence[str] | None = None,
        goes_to: Sequence[str] | None = None,
        kind: str | None = None,
        transactional: bool | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        if patches is not None:
            self.patches = check_patches(patches)
        self.goes_to = check_goes_to(self.goes_to if goes_to is None else goes_to)
        if max_retries is not None:
            self.max_retries = max_retries
        if retry_delay is not None:
            self.retry_delay = retry_delay
        if timeout is not None:
            self.timeout = timeout
        if short is not None:
            self.short = short
        if kind is not None:
            self.kind = kind
        if transactional is not None:
            self.transactional = transactional
        if self.kind is not None and self.kind not in STEP_KINDS:
            raise ValueError(
                f"kind must be one of {', '.join(STEP_KINDS)} or None, not {self.kind!r}"
            )
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a step needs a non-blank name, not {self.name!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, not {self.max_retries!r}")
        if self.retry_delay < 0:
            raise ValueError(f"retry_delay must be >= 0, not {self.retry_delay!r}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds or None, not {self.timeout!r}")
        if self.short is not None and not isinstance(self.short, bool):
            raise ValueError(f"short must be True, False or None, not {self.short!r}")
        if not isinstance(self.transactional, bool):
            raise ValueError(f"transactional must be True or False, not {self.transactional!r}")
        if self.transactional and self.timeout is not None:
            raise ValueError(
                f"step {self.name!r}: a transactional step takes no timeout (its "
                "transaction lives on the runner's thread, which a timeout would give up on)"
            )

    def execute(self, state: Any, ctx: StepContext) -> StepOutcome:
        """Do the step's work on *state*; return an outcome."""
        raise NotImplementedError(f"{type(self).__name__}.execute")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class FunctionStep(WorkflowStep):
    """A step made from a function ``fn(state)`` or ``fn(state, ctx)`` (see ``step``)."""

    def __init__(self, fn: Callable[..., StepOutcome], name: str | None = None, **options: Any):
        self.fn = fn
        self._wants_ctx = _accepts_two_arguments(fn)
        super().__init__(name or getattr(fn, "__name__", None), **options)

    def execute(self, state: Any, ctx: StepContext) -> StepOutcome:
        return self.fn(state, ctx) if self._wants_ctx else self.fn(state)

    def __call__(self, state: Any, ctx: StepContext | None = None) -> StepOutcome:
        """Call the function directly (handy in unit tests of a step)."""
        if ctx is None:
            ctx = StepContext("test", "test", self.name)
        return self.execute(state, ctx)


def _accepts_two_arguments(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    return len(positional) >= 2 or variadic


@overload
def step(name: Callable[..., StepOutcome], /) -> FunctionStep: ...


@overload
def step(
    name: str | None = None,
    *,
    max_retries: int = 0,
    retry_delay: float = 0.1,
    timeout: float | None = None,
    short: bool | None = None,
    patches: Sequence[str] | None = None,
    goes_to: Sequence[str] | None = None,
    kind: str | None = None,
    transactional: bool = False,
) -> Callable[[Callable[..., StepOutcome]], FunctionStep]: ...


def step(
    name: str | Callable[..., StepOutcome] | None = None,
    *,
    max_retries: int = 0,
    retry_delay: float = 0.1,
    timeout: float | None = None,
    short: bool | None = None,
    patches: Sequence[str] | None = None,
    goes_to: Sequence[str] | None = None,
    kind: str | None = None,
    transactional: bool = False,
) -> FunctionStep | Callable[[Callable[..., StepOutcome]], FunctionStep]:
    """Make a ``WorkflowStep`` from a function::

        @step("charge", max_retries=2, timeout=30)
        def charge(state, ctx):
            payments.charge(state["order"], idempotency_key=ctx.idempotency_key)
            return advance({**state, "charged": True})

    The function takes ``(state)`` or ``(state, ctx)``; the name defaults to the
    function's. ``@step`` without arguments works too. ``short=True`` marks quick
    work that needs no heartbeat (a local activity on Temporal; see ``WorkflowStep``).
    ``goes_to=["poll", "ship"]`` declares the steps it may jump to besides the next
    one (``advance(state, to="poll")``; see ``definition.graph``). ``kind="approval"``
    (or ``"sleep"``, ``"spawn"``, ``"wait"``) names what the step does for the admin's
    diagram. ``transactional=True`` commits the step's database writes with its
    snapshot, in one transaction of the runs' database (see ``WorkflowStep``).
    """
    if callable(name):
        return FunctionStep(name)

    def decorate(fn: Callable[..., StepOutcome]) -> FunctionStep:
        return FunctionStep(
            fn,
            name,
            max_retries=max_retries,
            retry_delay=retry_delay,
            timeout=timeout,
            short=short,
            patches=patches,
            goes_to=goes_to,
            kind=kind,
            transactional=transactional,
        )

    return decorate


def step_after(
    steps: Sequence[WorkflowStep], last_step: str, next_step: str = ""
) -> WorkflowStep | None:
    """The step a run continues at: *next_step* when its last step jumped there
    (``workflow.nextStep``), else the step after *last_step* (the first when it is
    ``""``); ``None`` after the last, and when the step named is not a step (the run
    needs an upgrade)."""
    index = continue_index(steps, last_step, next_step)
    return steps[index] if index is not None and index < len(steps) else None
