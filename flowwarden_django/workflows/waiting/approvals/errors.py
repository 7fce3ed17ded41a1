"""Why a decision on an approval was refused; each error has a stable ``code``."""

from __future__ import annotations


class ApprovalError(Exception):
    """A decision that cannot be made. ``code`` is stable (API clients match on it)."""

    code = "approval_error"

    def __init__(self, message: str, *, approval_id: str = "", status: str = "") -> None:
        super().__init__(message)
        self.approval_id = approval_id
        self.status = status


class UnknownApprovalError(ApprovalError, LookupError):
    """No approval with that id."""

    code = "approval_not_found"


class ApprovalConflictError(ApprovalError):
    """The approval was already decided the other way (``approval_already_decided``),
    is no longer wanted (``approval_cancelled``: the run moved on), or is claimed by
    someone else (``approval_claimed``)."""

    code = "approval_already_decided"

    def __init__(self, message: str, *, code: str | None = None, **kwargs: str) -> None:
        super().__init__(message, **kwargs)
        if code is not None:
            self.code = code


class ApprovalExpiredError(ApprovalError):
    """The approval expired before it was decided."""

    code = "approval_expired"


class ApprovalPermissionError(ApprovalError, PermissionError):
    """The user may not decide this approval."""

    code = "approval_forbidden"
