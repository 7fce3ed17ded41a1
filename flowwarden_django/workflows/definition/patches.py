"""Patches: small changes to a step that runs already under way must not see.

A step declares the patches it introduces, ``@step("ship", patches=["tracked"])``,
and any step asks ``ctx.patched("tracked")``: True for a run that reaches ``ship``
after the change (it started after it, or had not completed ``ship`` yet), False for
a run that had already completed ``ship`` before (its ``ship`` ran the old code, so
later steps must not expect what the new one does). As Temporal's
``workflow.patched()`` and DBOS's ``DBOS.patch()``, without their replay: the answer
is worked out once per run and recorded with the run (the ``workflow.patches``
metadata of its snapshots, carried from each snapshot to the next), so it never flips,
however often a step is retried or the run is moved. A step that completes records
its own patches (True, unless the run had completed it before the change). Once no
run older than the change is unfinished, the patch and its old branch can go.

A run that loops (``advance(state, to=...)``: ``definition.graph``) may stand before
a step it has already completed: "completed" is then the furthest step it has
reached, which its snapshots record once it jumps (``workflow.furthestStep``), not
the step it stands at. A run that completed ``ship`` with the old code and then loops
back before it answers False, as it would have at any later step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...common.json_metadata import json_object
from .graph import non_blank_strings

if TYPE_CHECKING:
    from .steps import WorkflowStep

#: The snapshot metadata key: JSON ``{"patch id": true/false}``, the run's answers.
PATCHES_METADATA = "workflow.patches"


class UndeclaredPatchError(ValueError):
    """``ctx.patched(id)`` names a patch no step of the run's workflow declares."""


def recorded_patches(metadata: Mapping[str, str]) -> dict[str, bool]:
    """The answers a snapshot's metadata records (``{}`` when none)."""
    found = json_object(metadata, PATCHES_METADATA) or {}
    return {str(k): bool(v) for k, v in found.items()}


class PatchBook:
    """The answers of one step execution: those the run recorded, and the ones it
    works out (``answer``) for patches declared by the steps of *steps*; the step
    at *index* is the one executing. *furthest*: the index of the furthest step the
    run has completed, when it recorded one (it has jumped); else every step before
    *index*, and none after it, were completed."""

    def __init__(
        self,
        recorded: dict[str, bool],
        steps: Sequence[WorkflowStep],
        index: int,
        furthest: int | None = None,
    ) -> None:
        self.recorded = recorded
        self.steps = steps
        self.index = index
        self.furthest = index - 1 if furthest is None else furthest
        self.answers: dict[str, bool] = {}

    def answer(self, patch_id: str) -> bool:
        if patch_id in self.recorded:
            return self.recorded[patch_id]
        if patch_id in self.answers:
            return self.answers[patch_id]
        for position, candidate in enumerate(self.steps):
            if patch_id in candidate.patches:
                # Not completed yet (this step or a later one): it reaches the change.
                value = position > self.furthest
                self.answers[patch_id] = value
                return value
        raise UndeclaredPatchError(
            f"no step declares patch {patch_id!r}: declare it on the step whose change "
            f'it marks, @step("...", patches=[{patch_id!r}])'
        )

    def after(self, completed: WorkflowStep) -> dict[str, bool]:
        """The answers to record with the snapshot of *completed*: the recorded ones,
        those worked out, and its own patches (True: its new code ran; False when the
        run had completed it before, with the old code, and looped back)."""
        ran_new = self.index > self.furthest  # *completed* is the step at index
        for patch_id in completed.patches:
            if patch_id not in self.recorded:
                self.answers.setdefault(patch_id, ran_new)
        return {**self.recorded, **self.answers}


#: The book of a workflow none of whose steps declares a patch: every id is undeclared.
NO_PATCHES = PatchBook({}, (), 0)


def patches_metadata(answers: dict[str, bool]) -> dict[str, str]:
    """The metadata entry of *answers* (none when empty)."""
    if not answers:
        return {}
    return {PATCHES_METADATA: json.dumps(answers, sort_keys=True, separators=(",", ":"))}


def check_patches(value: Any) -> tuple[str, ...]:
    """A step's ``patches`` as a tuple of non-blank strings; ``ValueError`` otherwise."""
    return non_blank_strings(
        value, "patches is a list of patch ids", "a patch id is a non-blank string"
    )
