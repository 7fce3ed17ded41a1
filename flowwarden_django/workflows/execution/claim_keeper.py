"""Keeping a runner's claim on a workflow run alive while its step runs.

A claim (``WorkflowRun.runner`` and ``claimed_until``) lasts ``WORKFLOW_RUN_LEASE``
(10 s by default) from its last renewal. While this process holds a claim, one
daemon thread, :data:`claim_keeper`, renews it every quarter of the lease with one
conditional ``UPDATE`` (``claimed_until`` only, on the runner's own token), whatever
provider runs the step: the in-process engine, a Celery task, a Temporal activity.
So:

* a step that runs for minutes is never taken over while its process lives: its
  claim is renewed every few seconds;
* a runner that dies (SIGKILL, a lost machine) stops renewing, and its claim is free
  within one lease; the recovery sweep, a redelivered task or Temporal's activity
  retry then continues the run;
* two runners still never both write a step: each step's snapshot is saved at an
  explicit ``seq``, and a runner whose claim was taken over gets ``LeaseLostError``.

A renewal that fails (the database is away) is tried again every half second; one
that finds the claim gone (taken over, or released) stops renewing it. A renewal is
also what tells the engine its lease is young (``on_renewed``): nobody can take the
run over before the lease that renewal set has run out.

Each execution holds its claim under a key of its own (``HeldClaim.key``): two
copies of one handed step run under the hand-off's one token (``workflows.handoff``),
and the copy that ends first must not stop the renewals of the other. The keeper
indexes the copies of each run by ``(database, run, token)``: :meth:`ClaimKeeper.leave`
takes one out and says, in the same locked step, whether it was the last, so when
two copies fail at once exactly one (the last out) records the failure.

A claim taken inside an open transaction is not kept alive: other runners cannot see
it before the transaction commits, and renewing it from another connection would
wait on that transaction's row lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ...common.connections import discard_unusable_connections
from ...common.failure_log import FailureLog

logger = logging.getLogger("flowwarden_django.workflows")

#: Seconds between two tries of a renewal that failed (the database did not answer).
RETRY_SECONDS = 0.5
#: The shortest renewal interval, whatever the lease.
MIN_INTERVAL = 0.05


@dataclass(eq=False)
class HeldClaim:
    """One claim this process keeps alive: *runner*'s claim on *coordination_id* in
    database *using*, renewed for *lease* every ``interval`` seconds, held under
    *key* (default: the runner's token; an execution's own key, see the module)."""

    using: str
    coordination_id: str
    runner: str
    lease: timedelta
    #: Called with the ``time.monotonic()`` at which a renewal that held was sent.
    on_renewed: Callable[[float], None] | None = None
    due: float = field(default=0.0)
    key: str = ""
    #: Called after each renewal that held: what else the step holds on a lease (its
    #: queue slot, ``workflows.queues``) is renewed with the claim.
    also_renew: Callable[[], None] | None = None
    #: When (``time.monotonic()``) the last renewal that held was sent: set when the
    #: claim is first held (it was just taken or renewed).
    renewed_at: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.key = self.key or self.runner

    def unrenewed_for(self, now: float | None = None) -> float:
        """Seconds since the last renewal that held was sent."""
        return (time.monotonic() if now is None else now) - self.renewed_at

    @property
    def interval(self) -> float:
        return max(self.lease.total_seconds() / 4, MIN_INTERVAL)


class ClaimKeeper:
    """Renews the claims of this process (see the module docstring). Thread-safe; its
    thread starts with the first claim, in each process (a forked pool child gets its
    own), and closes its database connections while it holds none."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._claims: dict[str, HeldClaim] = {}
        #: The keys of the claims held on each ``(using, coordination_id, runner)``.
        self._copies: dict[tuple[str, str, str], set[str]] = {}
        self._thread: threading.Thread | None = None
        #: When (``time.monotonic()``) the thread wakes next; ``None``: only when told.
        self._wake_at: float | None = None
        self._pid = 0
        self.failure_log = FailureLog(logger, "workflows: renewing run claims")

    def hold(self, claim: HeldClaim) -> None:
        """Keep *claim* alive from now on, until :meth:`drop`."""
        claim.renewed_at = time.monotonic()
        claim.due = claim.renewed_at + claim.interval
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._claims.clear()
                self._copies.clear()
                self._thread, self._pid = None, os.getpid()
            self._claims[claim.key] = claim
            self._copies.setdefault(_run_of(claim), set()).add(claim.key)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._work, name="fw-claim-keeper", daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or claim.due < self._wake_at:
                # Woken only when it would sleep past the new claim's renewal: a
                # process running short steps back to back holds and drops a claim
                # per step, and waking a thread for each costs more than the step's
                # own bookkeeping.
                self._lock.notify()

    def drop(self, key: str) -> None:
        """Stop renewing the claim held under *key* (it was released, or its runner is
        done). With none left, the thread closes its connections when it next wakes."""
        with self._lock:
            claim = self._claims.pop(key, None)
            if claim is not None:
                self._forget(claim)

    def leave(self, claim: HeldClaim) -> bool:
        """Stop renewing *claim* and say whether no other copy (another key on the
        same run and token) still holds its run: one locked step, so of copies that
        leave at once exactly one is told it was the last."""
        with self._lock:
            if self._claims.get(claim.key) is claim:
                del self._claims[claim.key]
                self._forget(claim)
            return not self._copies.get(_run_of(claim))

    def held_elsewhere(self, claim: HeldClaim) -> bool:
        """Whether another key of this process holds *claim*'s run under the same
        runner token: another copy of the same handed step."""
        with self._lock:
            return any(key != claim.key for key in self._copies.get(_run_of(claim), ()))

    def lapsing(self, fraction: float = 0.5) -> list[HeldClaim]:
        """The claims whose renewals have not held for *fraction* of their lease or
        more: their database has not answered (a renewal blocked on a silent
        connection, or failing), and their runs pass to another runner once the whole
        lease is out. A provider that learns this can hand the step back early."""
        now = time.monotonic()
        with self._lock:
            return [
                claim
                for claim in self._claims.values()
                if claim.unrenewed_for(now) >= fraction * claim.lease.total_seconds()
            ]

    def unrenewed_for(self, using: str, coordination_id: str) -> float:
        """Seconds since a claim of this process on run *coordination_id* was last
        renewed (the freshest of its copies'); 0.0 when none is held."""
        now = time.monotonic()
        with self._lock:
            ages = [
                claim.unrenewed_for(now)
                for claim in self._claims.values()
                if claim.using == using and claim.coordination_id == coordination_id
            ]
        return min(ages, default=0.0)

    def _forget(self, claim: HeldClaim) -> None:
        """Take *claim* out of the index of copies (the lock held)."""
        run = _run_of(claim)
        keys = self._copies.get(run)
        if keys is not None:
            keys.discard(claim.key)
            if not keys:
                del self._copies[run]

    def __len__(self) -> int:
        with self._lock:
            return len(self._claims)

    def renew_due(self) -> float | None:
        """Renew every claim that is due; the seconds until the next one is (``None``
        when none is held)."""
        now = time.monotonic()
        with self._lock:
            due = [claim for claim in self._claims.values() if claim.due <= now]
        for claim in due:
            self._renew(claim)
        with self._lock:
            if not self._claims:
                return None
            return max(min(claim.due for claim in self._claims.values()) - time.monotonic(), 0)

    def _renew(self, claim: HeldClaim) -> None:
        from ..runs.records import RunRecords

        sent = time.monotonic()
        try:
            held = RunRecords(claim.using).renew(claim.coordination_id, claim.runner, claim.lease)
        except Exception as exc:
            self.failure_log.failed(exc)
            discard_unusable_connections()
            claim.due = time.monotonic() + min(RETRY_SECONDS, claim.interval)
            return
        self.failure_log.succeeded()
        if not held:  # released or taken over: nothing of ours to keep
            self.drop(claim.key)
            return
        claim.renewed_at = max(claim.renewed_at, sent)
        claim.due = sent + claim.interval
        if claim.on_renewed is not None:
            claim.on_renewed(sent)
        also = claim.also_renew
        if also is not None:
            try:
                also()
            except Exception as exc:
                self.failure_log.failed(exc)

    def _work(self) -> None:
        from django.db import connections

        while True:
            wait = self.renew_due()
            with self._lock:
                if wait is None:
                    try:  # no claim held: no connection kept open
                        connections.close_all()
                    except Exception:
                        discard_unusable_connections()
                    self._wake_at = None
                    while not self._claims:
                        self._lock.wait()
                    continue
                self._wake_at = time.monotonic() + wait
                self._lock.wait(timeout=wait)


def _run_of(claim: HeldClaim) -> tuple[str, str, str]:
    return (claim.using, claim.coordination_id, claim.runner)


#: This process's claim keeper.
claim_keeper = ClaimKeeper()
