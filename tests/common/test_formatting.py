"""Times and ages as the admin and the commands write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flowwarden_django.common.formatting import age_text, relative_time

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_relative_times_read_naturally_both_ways() -> None:
    assert relative_time(NOW - timedelta(minutes=3), NOW) == "3\xa0minutes ago"
    assert relative_time(NOW + timedelta(days=2), NOW) == "in 2\xa0days"  # an expiry
    assert relative_time(NOW - timedelta(seconds=7), NOW) == "7 seconds ago"  # not "0 minutes"
    assert relative_time(NOW + timedelta(seconds=1), NOW) == "in 1 second"


def test_ages_in_the_commands() -> None:
    assert age_text(NOW - timedelta(seconds=12), NOW) == "12s ago"
    assert age_text(NOW + timedelta(days=1), NOW) == "in 1d"
