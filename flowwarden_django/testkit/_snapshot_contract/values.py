"""The state types and the base time the snapshot contract stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

from ...workflows.storage.serializers import workflow_state


@workflow_state
@dataclass(frozen=True)
class ContractLine:
    """A registered dataclass nested in :class:`ContractOrder` (state round trips)."""

    sku: str
    quantity: int


@workflow_state
@dataclass
class ContractOrder:
    """A registered dataclass the contract stores as state."""

    number: str
    total: Decimal
    placed_at: datetime
    lines: list[ContractLine] = field(default_factory=list)
    tags: tuple[str, ...] = ()


#: A fixed, timezone-aware base time for snapshots whose created_at matters.
BASE = datetime(2031, 5, 17, 9, 30, tzinfo=UTC)
