"""Paging: page numbers for runs and approvals, keyset cursors for snapshots.

Snapshot pages come from the store itself (``CheckpointQuery`` with ``limit`` and
``after``), so the first page of a newest-first listing holds the newest snapshots
and following ``next`` walks every snapshot exactly once, even while new ones are
written. The cursor is the sealed (encrypted and authenticated) position of the last
snapshot of the page.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from django.utils.translation import gettext_lazy as _
from rest_framework import serializers
from rest_framework.pagination import BasePagination, PageNumberPagination, _positive_int
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from ..common.sealing import seal, unseal
from ..workflows.storage.snapshot import CheckpointQuery, WorkflowSnapshot


class PagePagination(PageNumberPagination):
    """``?page=2&page_size=100``: 50 rows a page by default, at most 200."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class SnapshotCursorPagination(BasePagination):
    """``?cursor=<opaque>&page_size=100`` over a ``SnapshotStore``: 50 a page by default,
    at most 200. The response is ``{"next": <url or null>, "results": [...]}``.

    The store does the filtering (the query's ``coordination_ids`` holds what the
    user may read) and lists positions only (``with_state=False``), so a page costs
    one indexed query whatever else the store holds. The cursor is sealed
    (``common.sealing``, AES-GCM under a key derived from ``SECRET_KEY``): it names
    the last row of the page, a row the user could see, without showing it, and a
    tampered or forged one is refused with 400.
    """

    page_size = 50
    max_page_size = 200
    page_size_query_param = "page_size"
    cursor_query_param = "cursor"

    def __init__(self) -> None:
        self.base_url = ""
        self.next_mark: WorkflowSnapshot | None = None

    # -- paging ----------------------------------------------------------------------

    def paginate_store(
        self,
        list_snapshots: Callable[[CheckpointQuery], list[WorkflowSnapshot]],
        query: CheckpointQuery,
        request: Request,
    ) -> list[WorkflowSnapshot]:
        """One page of *query* (listed by *list_snapshots*, a store's ``list``)."""
        self.base_url = request.build_absolute_uri()
        size = self.get_page_size(request)
        query = dataclasses.replace(query, after=self.get_cursor(request), limit=size + 1)
        # One row more than the page tells whether there is a next page.
        rows = list_snapshots(query)
        page = rows[:size]
        self.next_mark = page[-1] if len(rows) > size else None
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
        except ValueError:
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


#: The purpose snapshot cursors are sealed for (a cursor is valid for this listing only).
CURSOR_SALT = "flowwarden_django.api.snapshot-cursor"


def encode_cursor(snapshot: WorkflowSnapshot) -> str:
    """The sealed cursor of the position just after *snapshot*: authentic and opaque
    (``common.sealing``), so it shows no id, sequence number or time."""
    mark = [
        snapshot.id,
        snapshot.coordination_id,
        snapshot.seq or 0,
        snapshot.created_at.isoformat(),
    ]
    return seal(json.dumps(mark, separators=(",", ":")).encode(), purpose=CURSOR_SALT)


def decode_cursor(text: str) -> WorkflowSnapshot:
    """The position *text* (from ``encode_cursor``) names, as a snapshot to page
    ``after``; ``ValueError`` when it is not a cursor this site sealed."""
    try:
        mark = json.loads(unseal(text, purpose=CURSOR_SALT))
        snapshot_id, coordination_id, seq, created_at = mark
        texts = (snapshot_id, coordination_id, created_at)
        if not all(isinstance(t, str) and "\x00" not in t for t in texts):
            raise ValueError("not a cursor")
        if not isinstance(seq, int) or not 0 <= seq < 2**63:  # a 64-bit column
            raise ValueError("not a cursor")
        return WorkflowSnapshot(
            id=snapshot_id,
            coordination_id=coordination_id,
            seq=seq,
            created_at=datetime.fromisoformat(created_at).astimezone(UTC),
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError("not a cursor") from exc
