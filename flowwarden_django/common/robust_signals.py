"""Sending a Django signal whose receivers' errors are logged, never raised."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal


def send_logged(
    signal: Signal, logger: logging.Logger, failed: str, *failed_args: Any, **named: Any
) -> None:
    """``signal.send_robust(**named)`` (*named* includes ``sender``); each receiver
    that raised is logged as a warning with its traceback: *failed* % (the receiver,
    *failed_args*)."""
    for receiver, result in signal.send_robust(**named):
        if isinstance(result, Exception):
            logger.warning(
                failed,
                receiver,
                *failed_args,
                exc_info=(type(result), result, result.__traceback__),
            )
