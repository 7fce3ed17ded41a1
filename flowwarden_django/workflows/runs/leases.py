"""Who holds a run, and until when: the runner and hand-off tokens, the lease and
recovery durations, and the filters of unclaimed and handed-off runs."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from datetime import timedelta
from functools import lru_cache

from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now
from django.utils.crypto import salted_hmac

from ...conf import fw_settings


def run_lease() -> timedelta:
    """``FLOWWARDEN["WORKFLOW_RUN_LEASE"]`` as a ``timedelta``."""
    return _as_timedelta(fw_settings.WORKFLOW_RUN_LEASE)


@lru_cache(maxsize=8)
def _as_timedelta(value: str | float) -> timedelta:
    # Read for every claim: parsed once per value.
    from ...common.durations import parse_duration

    return timedelta(seconds=parse_duration(value))


def recover_after() -> timedelta:
    """``FLOWWARDEN["WORKFLOW_RECOVER_AFTER"]`` as a ``timedelta``."""
    from ...common.durations import parse_duration

    return timedelta(seconds=parse_duration(fw_settings.WORKFLOW_RECOVER_AFTER))


#: How the token of a run handed from one step to the next begins (``handoff``): the
#: run is held between two steps, not by a step running, so an upgrade may take it.
HANDOFF_PREFIX = "handoff:"
_HANDOFF_SALT = "flowwarden_django.workflows.runs.handoff_token"


def new_handoff_token(*names: str) -> str:
    """A name for the claim one step hands the next (``handoff``): unique, so a late
    attempt of an earlier step never writes over a later one's. Derived from *names*
    when given (a provider's name for the step's task, the same for every copy and
    attempt of it), else random."""
    if not names:
        return f"{HANDOFF_PREFIX}{uuid.uuid4().hex}"
    # Keyed with SECRET_KEY: who knows a task's name cannot name the run's hold.
    digest = salted_hmac(_HANDOFF_SALT, "\x00".join(names), algorithm="sha256").hexdigest()
    return f"{HANDOFF_PREFIX}{digest[:32]}"


def new_runner_token() -> str:
    """A name for one ``run()`` call: ``<instance>:<thread>:<random>``.

    Unique per call, so a thread that runs the same coordination twice in a row
    never mistakes its old claim for its new one.
    """
    return f"{runner_instance()}:{threading.get_ident()}:{uuid.uuid4().hex[:12]}"[-255:]


def runner_instance() -> str:
    """The process a runner token names: ``FLOWWARDEN["INSTANCE_ID"]`` or
    ``<hostname>:<pid>`` (what the timeline shows as a step's worker)."""
    return fw_settings.INSTANCE_ID or _host_and_pid(os.getpid())


@lru_cache(maxsize=4)
def _host_and_pid(pid: int) -> str:
    # gethostname() is a system call: once per process (a forked child has its pid).
    return f"{socket.gethostname()}:{pid}"


def unclaimed() -> Q:
    """Runs no runner holds (none, or its lease ran out)."""
    return Q(runner="") | Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now())


def between_steps() -> Q:
    """Runs held by a hand-off token (``handoff``): between two steps, or in a step
    that runs from the hand-off, whose save is refused once the run is taken."""
    return Q(runner__startswith=HANDOFF_PREFIX)


def lease_end(lease: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(lease), output_field=DateTimeField())
