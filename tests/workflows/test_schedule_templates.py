"""Scheduled starts' state templates: every failure is a ScheduleError, and a format
spec that would build a huge string is refused before anything is formatted."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from flowwarden_django.workflows.operations.schedule_ticks import (
    MAX_FORMAT_WIDTH,
    ScheduleError,
    check_state_template,
    render_state,
)

VALUES = {"tick": "2026-12-03T02:00:00+00:00", "date": "2026-12-03", "schedule": "nightly"}


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{tick.nope}", "not a field"),
        ("{tick[0]}", "not a field"),
        ("{nope}", "not a field"),
        ("{}", "not a field"),
        ("{0}", "not a field"),
        ("{tick!x}", "not a conversion"),
        ("{tick:{date}}", "holds a field"),
        ("{tick:>300000000}", f"width '300000000' of {{tick}} is more than {MAX_FORMAT_WIDTH}"),
        ("{date:0300000000}", "width '300000000'"),
        ("{schedule:.999999}", "precision '999999'"),
        ("{tick:d}", "Unknown format code"),
        ("{tick", "expected '}'"),
        ("}", "Single '}'"),
    ],
)
def test_a_template_that_cannot_format_is_a_schedule_error(template: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message.replace("[", r"\[").replace(".", r"\.")):
        render_state({"nested": [template]}, **VALUES)


def test_a_huge_width_is_refused_before_formatting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is formatted for a template that is refused: not even part of it."""
    formatted: list[str] = []

    class Watched(str):
        def format(self, *args: Any, **kwargs: Any) -> str:
            formatted.append(self)
            return super().format(*args, **kwargs)

    with pytest.raises(ScheduleError):
        render_state(Watched("{tick:>300000000}"), **VALUES)
    assert formatted == []
    with pytest.raises(ScheduleError, match="width"):
        check_state_template({"a": ["ok {date}", {"b": "{tick:^200}"}]})


def test_templates_within_the_bounds_format() -> None:
    template = {
        "day": "{date}",
        "padded": f"[{{schedule:>{MAX_FORMAT_WIDTH}}}]",
        "cut": "{tick:.4}",
        "repr": "{schedule!r}",
        "literal": "{{x}}",
        "items": ["{schedule}", 3, None],
    }
    check_state_template(template)
    rendered = render_state(template, **VALUES)
    assert rendered["day"] == "2026-12-03"
    assert rendered["padded"] == "[" + "nightly".rjust(MAX_FORMAT_WIDTH) + "]"
    assert rendered["cut"] == "2026"
    assert rendered["repr"] == "'nightly'"
    assert rendered["literal"] == "{x}"
    assert rendered["items"] == ["nightly", 3, None]


def test_the_error_quotes_a_long_template_cut_short() -> None:
    with pytest.raises(ScheduleError) as info:
        render_state("x" * 10_000 + "{nope}", **VALUES)
    assert len(str(info.value)) < 400


def test_the_temporal_schedule_refuses_a_bad_template_before_connecting() -> None:
    pytest.importorskip("temporalio", reason="the Temporal extra")
    from flowwarden_django.integrations.temporal.schedules import schedule_workflow

    with pytest.raises(ScheduleError, match="not a field"):
        schedule_workflow("s", "wf", every=timedelta(hours=1), state={"x": "{tick.nope}"})
