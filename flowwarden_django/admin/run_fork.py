"""Forking a run from one of its snapshots in the admin: edit the state, check it and
confirm, fork."""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.text import capfirst
from django.utils.translation import gettext

from ..common.formatting import state_json
from ..common.user_input import UserJSONError, parse_user_json
from ..models import WorkflowRun
from ..workflows.storage.snapshot import WorkflowSnapshot
from .details import error_text
from .run_snapshot_pages import TEMPLATES
from .run_stores import fork_snapshot
from .snapshots import state_diff

logger = logging.getLogger("flowwarden_django.admin")


class ForkPageMixin:
    """The fork page of the run admin (``fork_workflowrun``)."""

    def fork_view(self, request: HttpRequest, object_id: str, snapshot_id: str) -> HttpResponse:
        """Fork the run off a snapshot: edit the state (GET), check it and ask (POST),
        fork (POST ``post=yes``)."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return redirect
        assert run is not None
        if not self.has_fork_permission(request, run):
            raise PermissionDenied
        loaded = self._load_snapshot(request, run, unquote(snapshot_id))
        if loaded is None:
            return HttpResponseRedirect(self.tree_url(run.pk))
        found, snapshot = loaded
        render = partial(self._fork_page, request, run, snapshot)
        if request.method != "POST":
            return render(state_json(snapshot.state))
        text = request.POST.get("state", "")
        try:
            state = parse_user_json(text, what="the state")
        except UserJSONError as exc:
            return render(text, error=capfirst(str(exc)))
        if request.POST.get("post") != "yes":
            return render(text, question=_question(snapshot, state))
        try:
            child = fork_snapshot(run, found, snapshot.id, state)
        except (ValueError, TypeError) as exc:  # the state typed was refused: say why
            logger.info("fork of snapshot %s refused: %s", snapshot.id, exc)
            error = gettext("The fork failed: %(error)s") % {
                "error": f"{type(exc).__name__}: {exc}"
            }
            return render(text, error=error)
        except Exception as exc:  # the store or its driver failed: as HEALTH_DETAILS says
            logger.exception("fork of snapshot %s failed", snapshot.id)
            error = gettext("The fork failed: %(error)s") % {"error": error_text(request, exc)}
            return render(text, error=error)
        values = {
            "source": snapshot.seq,
            "run": run.coordination_id,
            "seq": child.seq,
            "id": child.id,
        }
        self.log_change(
            request, run, gettext("Forked snapshot #%(source)s as #%(seq)s (%(id)s).") % values
        )
        done = gettext(
            "Forked snapshot #%(source)s of run “%(run)s”: new snapshot #%(seq)s (%(id)s). "
            "The next run of the workflow continues from it."
        )
        self.message_user(request, done % values, messages.SUCCESS)
        return HttpResponseRedirect(self.snapshot_url(run.pk, child.id))

    def _fork_page(
        self,
        request: HttpRequest,
        run: WorkflowRun,
        snapshot: WorkflowSnapshot,
        text: str,
        *,
        error: str | None = None,
        question: dict[str, Any] | None = None,
    ) -> TemplateResponse:
        """The fork page: the state's *text* to edit and what is wrong with it, or,
        given the *question* (:func:`_question`), the page asking to confirm."""
        if question is not None:
            title = gettext("Fork snapshot #%(seq)s of run %(run)s?")
        else:
            title = gettext("Fork snapshot #%(seq)s of run %(run)s")
        context = self._context(
            request, run, title % {"seq": snapshot.seq, "run": run.coordination_id}
        )
        context.update(
            snapshot=snapshot,
            snapshot_url=self.snapshot_url(run.pk, snapshot.id),
            state_text=text,
            error=error,
            confirm=question is not None,
            **(question or {}),
        )
        return TemplateResponse(request, f"{TEMPLATES}/fork.html", context)


def _question(snapshot: WorkflowSnapshot, state: Any) -> dict[str, Any]:
    """What the page asking to confirm a fork shows of the checked *state*: it
    indented and compact, and how it differs from *snapshot*'s."""
    pretty = state_json(state)
    return {
        "pretty_state": pretty,
        "compact_state": json.dumps(state, ensure_ascii=False, separators=(",", ":")),
        "diff": state_diff(state_json(snapshot.state), pretty),
    }
