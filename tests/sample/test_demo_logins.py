"""The logins ``manage.py demo --serve`` makes: the approver is not staff (approvers
need none, as the README says) and still decides in the inbox; the admin is the
operator. And the printout names the inbox (``/approvals/``).

The sample project has its own settings, so this runs in a child process
(``tests/sample/demo_logins_story.py``) on a freshly migrated SQLite database.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.sample.test_async_views import child_env, migrated, run

#: It runs processes of its own (the sample project's settings).
pytestmark = pytest.mark.subprocess

BASE = "http://127.0.0.1:8123"


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("demo-logins")
    env = migrated(
        child_env(
            DJANGO_SETTINGS_MODULE="sampleproject.settings",
            SAMPLEPROJECT_DB=str(tmp / "demo.sqlite3"),
        )
    )
    out = tmp / "seen.json"
    result = run(["-m", "tests.sample.demo_logins_story", str(out)], env)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def test_the_demo_approver_is_not_staff_and_decides_in_the_inbox(seen: dict[str, Any]) -> None:
    assert seen["approver"] == {
        "is_staff": False,
        "is_superuser": False,
        "groups": ["approvers"],
        "permissions": 0,  # an earlier demo's admin permissions are taken back
    }
    assert seen["admin_for_the_approver"] == 302  # the admin's login page: not staff
    assert seen["run_before"] == "waiting"
    assert seen["inbox"] == {"status": 200, "lists_the_approval": True}
    assert seen["form_refused"] == {"status": 400, "shows_errors": True, "approval": "pending"}
    assert seen["decided_status"] == 200
    assert seen["approval"] == {"status": "approved", "decided_by": "approver"}
    assert seen["run_after"] == "completed"
    # The operator's pages are the admin's.
    assert seen["admin_is_staff"] is True and seen["admin_login"] is True
    assert seen["console_for_the_admin"] == 200


def test_the_serve_printout_names_the_inbox(seen: dict[str, Any]) -> None:
    printout = seen["printout"]
    assert f"\n  {BASE}/approvals/   the approver's inbox" in printout
    assert "log in as approver / " in printout and "at /approvals/: not staff" in printout
    assert "or as admin / " in printout and "superuser" in printout
