"""Times and ages as the admin and the commands write them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import translation
from django.utils.timesince import timesince, timeuntil

from flowwarden_django.common.formatting import _TIME_STRINGS, age_text, relative_time

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def test_relative_times_read_naturally_both_ways() -> None:
    assert relative_time(NOW - timedelta(minutes=3), NOW) == "3\xa0minutes ago"
    assert relative_time(NOW + timedelta(days=2), NOW) == "in 2\xa0days"  # an expiry
    assert relative_time(NOW - timedelta(seconds=7), NOW) == "7 seconds ago"  # not "0 minutes"
    assert relative_time(NOW + timedelta(seconds=1), NOW) == "in 1 second"


@pytest.mark.parametrize("language", ["en", "de", "pl", "ja"])
def test_the_age_texts_are_djangos_own_in_every_language(language: str) -> None:
    spans = [timedelta(seconds=61), timedelta(hours=2), timedelta(days=3, hours=5)]
    spans += [timedelta(days=40), timedelta(days=800, minutes=1)]
    with translation.override(language):
        for span in spans:
            assert timesince(NOW - span, NOW, time_strings=_TIME_STRINGS) == timesince(
                NOW - span, NOW
            )
            assert timeuntil(NOW + span, NOW, _TIME_STRINGS) == timeuntil(NOW + span, NOW)


def test_ages_in_the_commands() -> None:
    assert age_text(NOW - timedelta(seconds=12), NOW) == "12s ago"
    assert age_text(NOW + timedelta(days=1), NOW) == "in 1d"
