"""A run's snapshot pages in the admin: the snapshot tree (a page at a time, and its
next pages as JSON) and one snapshot with its state and its diff against its parent."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.utils.http import urlencode
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..common.formatting import state_json
from ..models import WorkflowRun
from ..workflows.definition.metadata import LAST_STEP
from ..workflows.execution.step_timings import step_timing_of
from ..workflows.storage.snapshot import WorkflowSnapshot
from ..workflows.waiting.cancellation import cancellation_of
from .base import page_context
from .details import error_text
from .run_stores import RunStore
from .run_texts import tree_step_text
from .snapshots import (
    DiffLine,
    NotListableError,
    TreeNode,
    build_forest,
    describe,
    flatten,
    load_page,
    node_badges,
    state_diff,
)

logger = logging.getLogger("flowwarden_django.admin")

#: The words of the tree's badges.
BADGE_LABELS = {"root": _("root"), "fork": _("fork"), "head": _("head")}

#: How deep branches nest in the drawn tree; deeper ones are drawn as chains of their own.
MAX_BRANCH_DEPTH = 8

TEMPLATES = "admin/flowwarden_django/workflowrun"


class SnapshotPagesMixin:
    """The snapshot tree and snapshot pages of the run admin, and the steps the
    snapshot pages share (the run, the page context, one snapshot)."""

    def _run_or_redirect(
        self, request: HttpRequest, object_id: str
    ) -> tuple[WorkflowRun | None, HttpResponse | None]:
        run = self.get_object(request, unquote(object_id))
        if run is None:
            return None, self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_permission(request, run) or not self.has_snapshot_permission(request):
            raise PermissionDenied
        return run, None

    def _context(self, request: HttpRequest, run: WorkflowRun, title: str) -> dict[str, Any]:
        return page_context(
            self,
            request,
            title,
            run=run,
            run_url=self._url("change", run.pk),
            tree_url=self.tree_url(run.pk),
        )

    def _load_snapshot(
        self, request: HttpRequest, run: WorkflowRun, snapshot_id: str
    ) -> tuple[RunStore, WorkflowSnapshot] | None:
        """The run's store and its snapshot *snapshot_id*, or ``None`` with a message."""
        try:
            found = self.store_of(run)
            snapshot = found.store.load(snapshot_id)
        except Exception as exc:  # a broken store or an undecodable row: say so, don't 500
            logger.exception("snapshot %s of run %s cannot be read", snapshot_id, run.pk)
            text = gettext("Snapshot “%(id)s” cannot be read: %(error)s")
            values = {"id": snapshot_id, "error": error_text(request, exc)}
            self.message_user(request, text % values, messages.ERROR)
            return None
        if snapshot is None or snapshot.coordination_id != run.coordination_id:
            text = gettext("Run “%(run)s” has no snapshot “%(id)s” in %(store)s.")
            values = {"run": run.coordination_id, "id": snapshot_id, "store": found.label}
            self.message_user(request, text % values, messages.WARNING)
            return None
        return found, snapshot

    # -- the snapshot tree -----------------------------------------------------------

    def tree_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The run's snapshots as a tree, a page at a time (``?after=<seq>``)."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return redirect
        assert run is not None
        after = _int_param(request, "after")
        title = gettext("Snapshot tree of run %(run)s") % {"run": run.coordination_id}
        context = self._context(request, run, title)
        context.update(
            head_id=run.head_snapshot_id,
            after=after,
            chains=[],
            page=None,
            error=None,
            not_listable=None,
            store_label="",
            nodes_url=self._url("tree_nodes", run.pk),
        )
        try:
            found = self.store_of(run)
            context["store_label"] = found.label
            page = load_page(found.store, run.coordination_id, after, self.tree_page_size)
        except NotListableError as exc:
            context["not_listable"] = str(exc)
        except Exception as exc:  # a broken store or an undecodable row: say so, don't 500
            logger.exception("snapshot tree of run %s failed", run.coordination_id)
            context["error"] = error_text(request, exc)
        else:
            starts = build_forest(page.snapshots)
            context.update(
                page=page,
                count=len(page.snapshots),
                chains=self._chains(starts, run),
                next_url=self._page_url(run, page.next_after),
            )
        if context["head_id"]:
            context["head_url"] = self.snapshot_url(run.pk, context["head_id"])
        return TemplateResponse(request, f"{TEMPLATES}/snapshot_tree.html", context)

    def tree_nodes_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The page of the tree after ``?after=<seq>`` as JSON: each node's HTML and
        parent, in ``seq`` order, and the ``after`` of the page that follows."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return JsonResponse({"error": gettext("No such workflow run.")}, status=404)
        assert run is not None
        after = _int_param(request, "after")
        try:
            page = load_page(
                self.store_of(run).store, run.coordination_id, after, self.tree_page_size
            )
        except Exception as exc:
            logger.exception("snapshot tree of run %s failed", run.coordination_id)
            return JsonResponse({"error": error_text(request, exc)}, status=500)
        nodes = []
        for node in flatten(build_forest(page.snapshots)):
            html = render_to_string(
                f"{TEMPLATES}/tree_node.html",
                {"item": self._item(node, run)},
                request=request,
            )
            nodes.append({**describe(node.snapshot), "html": html})
        return JsonResponse(
            {
                "nodes": nodes,
                "after": after,
                "next_after": page.next_after,
                "next_url": self._page_url(run, page.next_after),
            }
        )

    def _page_url(self, run: WorkflowRun, after: int | None) -> str | None:
        if after is None:
            return None
        return f"{self.tree_url(run.pk)}?{urlencode({'after': after})}"

    def _chains(self, starts: list[TreeNode], run: WorkflowRun) -> list[list[dict[str, Any]]]:
        """The chains to draw, each a list of items with their branches nested.

        Branches nest at most ``MAX_BRANCH_DEPTH`` deep (templates render them
        recursively); deeper ones are drawn as chains of their own after the others,
        each naming its parent.
        """
        chains: list[list[dict[str, Any]]] = []
        pending = [(start, False) for start in starts]
        while pending:
            start, moved = pending.pop(0)
            overflow: list[TreeNode] = []
            chain = self._chain(start, run, 0, overflow)
            if moved:
                chain[0]["parent_url"] = self.snapshot_url(run.pk, start.snapshot.parent_id or "")
            chains.append(chain)
            pending.extend((branch, True) for branch in overflow)
        return chains

    def _chain(
        self, start: TreeNode, run: WorkflowRun, depth: int, overflow: list[TreeNode]
    ) -> list[dict[str, Any]]:
        items = []
        for node in start.chain:
            item = self._item(node, run)
            if depth < MAX_BRANCH_DEPTH:
                item["branches"] = [
                    self._chain(branch, run, depth + 1, overflow) for branch in node.branches
                ]
            else:
                item["moved_branches"] = [
                    (branch.snapshot.id, branch.seq) for branch in node.branches
                ]
                overflow.extend(node.branches)
            items.append(item)
        return items

    def _item(self, node: TreeNode, run: WorkflowRun) -> dict[str, Any]:
        """What the node template needs to draw *node* (without its branches)."""
        snapshot = node.snapshot
        item = {
            "node": node,
            "snapshot": snapshot,
            "url": self.snapshot_url(run.pk, snapshot.id),
            "badges": [(key, BADGE_LABELS[key]) for key in node_badges(node, run.head_snapshot_id)],
            "is_head": snapshot.id == run.head_snapshot_id,
            "branches": [],
            "moved_branches": [],
            "parent_url": None,
            "step": tree_step_text(snapshot),
        }
        if node.detached and snapshot.parent_id:
            item["parent_url"] = self.snapshot_url(run.pk, snapshot.parent_id)
        return item

    # -- one snapshot ----------------------------------------------------------------

    def snapshot_view(self, request: HttpRequest, object_id: str, snapshot_id: str) -> HttpResponse:
        """A snapshot: its fields, its state as JSON, and the diff against its parent."""
        run, redirect = self._run_or_redirect(request, object_id)
        if redirect is not None:
            return redirect
        assert run is not None
        loaded = self._load_snapshot(request, run, unquote(snapshot_id))
        if loaded is None:
            return HttpResponseRedirect(self.tree_url(run.pk))
        found, snapshot = loaded
        parent = None
        if snapshot.parent_id:
            try:
                parent = found.store.load(snapshot.parent_id)
            except Exception:  # shown as "not in the store": the page is about the child
                logger.exception("parent %s cannot be read", snapshot.parent_id)
        state_text = state_json(snapshot.state)
        diff: list[DiffLine] | None = None
        if parent is not None:
            diff = state_diff(state_json(parent.state), state_text)
        title = gettext("Snapshot #%(seq)s of run %(run)s") % {
            "seq": snapshot.seq,
            "run": run.coordination_id,
        }
        parent_url = fork_url = None
        if snapshot.parent_id:
            parent_url = self.snapshot_url(run.pk, snapshot.parent_id)
        if self.has_fork_permission(request, run):
            fork_url = self.fork_url(run.pk, snapshot.id)
        context = self._context(request, run, title)
        context.update(
            snapshot=snapshot,
            parent=parent,
            parent_url=parent_url,
            is_head=snapshot.id == run.head_snapshot_id,
            last_step=snapshot.metadata.get(LAST_STEP, ""),
            # The page shows the state: the errors' messages too.
            timing=step_timing_of(snapshot.metadata),
            cancellation=cancellation_of(snapshot),
            metadata_text=state_json(dict(snapshot.metadata)),
            state_text=state_text,
            diff=diff,
            store_label=found.label,
            fork_url=fork_url,
        )
        return TemplateResponse(request, f"{TEMPLATES}/snapshot.html", context)


def _int_param(request: HttpRequest, name: str) -> int:
    try:
        return max(int(request.GET.get(name, 0)), 0)
    except ValueError:
        return 0
