"""Paging: page numbers for runs and approvals, keyset cursors for snapshots.

Snapshot pages come from the store itself (``CheckpointQuery`` with ``limit`` and
``after``), so the first page of a newest-first listing holds the newest snapshots
and following ``next`` walks every snapshot exactly once, even while new ones are
written. The cursor is the position of the last snapshot of the page.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers
from rest_framework.pagination import BasePagination, PageNumberPagination, _positive_int
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from ..workflows.snapshot import CheckpointQuery, WorkflowSnapshot


class PagePagination(PageNumberPagination):
    """``?page=2&page_size=100``: 50 rows a page by default, at most 200."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class SnapshotCursorPagination(BasePagination):
    """``?cursor=<opaque>&page_size=100`` over a ``SnapshotStore``: 50 a page by default,
    at most 200. The response is ``{"next": <url or null>, "results": [...]}``.

    When only some coordinations are readable (``allows``), rows are read in batches
    and filtered; after ``max_batches`` batches the page is returned as far as it
    got (maybe short, or empty) with a ``next`` that continues after the last row
    read, so one request never scans the whole store.
    """

    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    cursor_query_param = "cursor"
    batch_size = 500
    max_batches = 10

    def __init__(self) -> None:
        self.base_url = ""
        self.next_mark: WorkflowSnapshot | None = None

    # -- paging ----------------------------------------------------------------------

    def paginate_store(
        self,
        list_snapshots: Callable[[CheckpointQuery], list[WorkflowSnapshot]],
        query: CheckpointQuery,
        request: Request,
        allows: Callable[[str], bool] | None = None,
    ) -> list[WorkflowSnapshot]:
        """One page of *query* (listed by *list_snapshots*, a store's ``list``),
        keeping only snapshots whose coordination *allows* accepts (all when None)."""
        self.base_url = request.build_absolute_uri()
        size = self.get_page_size(request)
        query = dataclasses.replace(query, after=self.get_cursor(request))
        if allows is None:
            # One row more than the page tells whether there is a next page.
            rows = list_snapshots(dataclasses.replace(query, limit=size + 1))
            page = rows[:size]
            self.next_mark = page[-1] if len(rows) > size else None
            return page
        page: list[WorkflowSnapshot] = []
        batch_query = dataclasses.replace(query, limit=max(self.batch_size, size + 1))
        for _batch in range(self.max_batches):
            rows = list_snapshots(batch_query)
            for row in rows:
                if not allows(row.coordination_id):
                    continue
                if len(page) == size:  # a further readable row: there is a next page
                    self.next_mark = page[-1]
                    return page
                page.append(row)
            following = batch_query.next_page(rows)
            if following is None:
                self.next_mark = None
                return page
            batch_query = following
        self.next_mark = batch_query.after
        return page

    def get_page_size(self, request: Request) -> int:
        try:
            return _positive_int(
                request.query_params[self.page_size_query_param],
                strict=True,
                cutoff=self.max_page_size,
            )
        except (KeyError, ValueError):
            return self.page_size

    def get_cursor(self, request: Request) -> WorkflowSnapshot | None:
        """The position the request's cursor names (400 when it is malformed)."""
        text = request.query_params.get(self.cursor_query_param)
        if not text:
            return None
        try:
            return decode_cursor(text)
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise serializers.ValidationError(
                {self.cursor_query_param: [_("Invalid cursor.")]}
            ) from None

    def get_next_link(self) -> str | None:
        if self.next_mark is None:
            return None
        return replace_query_param(
            self.base_url, self.cursor_query_param, encode_cursor(self.next_mark)
        )

    def get_paginated_response(self, data: Sequence[Any]) -> Response:
        return Response({"next": self.get_next_link(), "results": data})

    # -- the schema ------------------------------------------------------------------

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "required": ["next", "results"],
            "properties": {
                "next": {
                    "type": "string",
                    "nullable": True,
                    "format": "uri",
                    "description": "The next page, or null after the last one.",
                },
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": str(_("The position to continue from (from a `next` link).")),
                "schema": {"type": "string"},
            },
            {
                "name": self.page_size_query_param,
                "required": False,
                "in": "query",
                "description": str(
                    _("Snapshots per page (default %(default)d, at most %(most)d).")
                    % {"default": self.page_size, "most": self.max_page_size}
                ),
                "schema": {"type": "integer"},
            },
        ]


def encode_cursor(snapshot: WorkflowSnapshot) -> str:
    """The opaque cursor of the position just after *snapshot*."""
    mark = {
        "id": snapshot.id,
        "c": snapshot.coordination_id,
        "s": snapshot.seq or 0,
        "t": snapshot.created_at.isoformat(),
    }
    text = json.dumps(mark, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(text).decode("ascii").rstrip("=")


def decode_cursor(text: str) -> WorkflowSnapshot:
    """The position *text* (from ``encode_cursor``) names, as a snapshot to page
    ``after``; ``ValueError``, ``KeyError`` or ``TypeError`` when it is not a cursor."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    mark = json.loads(raw)
    if not isinstance(mark, dict) or not isinstance(mark.get("s"), int):
        raise ValueError("not a cursor")
    if not 0 <= mark["s"] < 2**63:  # a 64-bit column
        raise ValueError("not a cursor")
    created_at = datetime.fromisoformat(mark["t"])
    return WorkflowSnapshot(
        id=mark["id"], coordination_id=mark["c"], seq=mark["s"], created_at=created_at
    )
