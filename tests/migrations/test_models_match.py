"""The migrations build the models' schema: ``makemigrations --check`` finds nothing to
write, and fails as soon as a model changes without its migration (what CI runs, so a
stale migration file fails the build)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from flowwarden_django.models import WorkflowRun


def makemigrations_check() -> tuple[int, str]:
    """``manage.py makemigrations flowwarden_django --check --dry-run``: its exit status
    and what it printed."""
    out = StringIO()
    try:
        call_command("makemigrations", "flowwarden_django", check=True, dry_run=True, stdout=out)
    except SystemExit as exit_:
        return int(exit_.code or 0), out.getvalue()
    return 0, out.getvalue()


# The command reads the default database's history (consistency of what it recorded).
@pytest.mark.django_db
def test_the_migrations_hold_every_change_of_the_models() -> None:
    status, printed = makemigrations_check()
    assert (status, printed.strip()) == (0, "No changes detected in app 'flowwarden_django'")


@pytest.mark.django_db
def test_a_model_change_without_its_migration_fails_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(WorkflowRun._meta.get_field("runner"), "max_length", 300)
    status, printed = makemigrations_check()
    assert status == 1
    assert "Alter field runner on workflowrun" in printed
