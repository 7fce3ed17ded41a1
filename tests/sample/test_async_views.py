"""The sample's async views under ASGI, on SQLite and PostgreSQL: an ``async def`` view
starts the order workflow (``Workflow.astart``), the large order's run waits for an
approval, an async view approves it (``aapprove``), and the run completes.

The sample project has its own settings (the ``shop`` app), so the requests run in a
child process (``tests/sample/asgi_story.py``) through Django's ``AsyncClient``, on a
freshly migrated database: a SQLite file, or a PostgreSQL database made for the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.lanes import lane_marks
from tests.support.services import SERVICES

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env.pop("FLOWWARDEN_MONGO_URL", None)
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=lane_marks("postgres"))],
)
def sample_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The child's environment, on a migrated database of its own."""
    if request.param == "sqlite":
        env = child_env(
            DJANGO_SETTINGS_MODULE="sampleproject.settings",
            SAMPLEPROJECT_DB=str(tmp_path / "async.sqlite3"),
        )
        yield migrated(env)
        return
    from tests.support.story_procs import StoryDatabase

    pg = SERVICES["postgres"]
    db = StoryDatabase(
        f"fw_async_{uuid.uuid4().hex[:10]}",
        pg.host,
        pg.port,
        os.environ.get("FLOWWARDEN_TEST_POSTGRES_USER", "postgres"),
        os.environ.get("FLOWWARDEN_TEST_POSTGRES_PASSWORD", ""),
    )
    db.create()
    try:
        # The sample's settings on PostgreSQL (tests/support/story_settings.py).
        env = child_env(
            DJANGO_SETTINGS_MODULE="tests.support.story_settings", FLOWWARDEN_STORY_DB_NAME=db.name
        )
        yield migrated(env)
    finally:
        db.drop()


def migrated(env: dict[str, str]) -> dict[str, str]:
    result = run(["manage.py", "migrate", "--noinput", "-v", "0"], env)
    assert result.returncode == 0, result.stderr
    return env


def test_an_async_view_starts_the_order_workflow_and_another_approves_it(
    sample_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "seen.json"
    result = run(["-m", "tests.sample.asgi_story", str(out)], sample_env)
    assert result.returncode == 0, result.stderr
    seen: dict[str, Any] = json.loads(out.read_text())

    # Refused before anything runs.
    assert seen["anonymous"] == {
        "status": 401,
        "body": {"code": "not_authenticated", "detail": "log in to start a workflow"},
    }
    assert seen["unknown_order"]["status"] == 404
    assert seen["huge_order_id"]["status"] == 404
    assert seen["get"] == 405
    # Starting needs the permission, and an order that predates the app starts none.
    assert seen["no_permission"]["status"] == 403
    assert seen["no_permission"]["body"]["code"] == "permission_denied"
    assert seen["predates_app"]["status"] == 409
    assert seen["predates_app"]["body"]["code"] == "order_predates_app"

    # A small order: the run completes in the request, no approval needed.
    small = seen["small"]
    assert small["status"] == 201
    assert small["body"] | {"coordination_id": None} == {
        "created": True,
        "coordination_id": None,
        "status": "completed",
        "approval_id": None,
        "order_approval": "not needed",
    }

    # A large order: the run waits for an approver; starting it again finds that run.
    large = seen["large"]
    assert large["status"] == 201
    cid, approval = large["body"]["coordination_id"], large["body"]["approval_id"]
    assert large["body"] == {
        "created": True,
        "coordination_id": cid,
        "status": "waiting",
        "approval_id": approval,
        "order_approval": "waiting",
    }
    assert seen["large_again"] == {"status": 200, "body": {**large["body"], "created": False}}

    # The clerk cannot see the approval: 404 (as for none), and no audit row; the
    # viewer sees it, may not decide it: 403, audited with bounded data.
    assert seen["clerk_approves"]["status"] == 404
    assert seen["clerk_approves"]["body"]["code"] == "approval_not_found"
    assert seen["after_clerk"] == seen["before_refusals"]
    assert seen["viewer_approves"]["status"] == 403
    assert seen["viewer_approves"]["body"]["code"] == "approval_forbidden"
    assert seen["viewer_refusals"] == [
        {
            "actor": "viewer",
            "code": "approval_forbidden",
            "comment_chars": 200,
            "payload": {"decision": "approved"},
        }
    ]
    # The approver approves (the run resumes and completes).
    assert seen["bad_body"]["status"] == 400
    # Hostile bodies: a 400 with the reason each, and nothing decided or recorded.
    for name, answer in seen["hostile"].items():
        assert answer["status"] == 400, (name, answer)
        assert answer["body"]["code"] == "invalid" and answer["body"]["detail"], (name, answer)
    assert seen["after_hostile"] == seen["before_hostile"]
    assert seen["before_hostile"] == {"runs": 2, "approvals": ["pending"], "events": 2}
    # The typed decision form: field errors, nothing decided.
    missing = seen["form_missing"]
    assert missing["status"] == 400 and missing["body"]["code"] == "approval_payload_invalid"
    assert set(missing["body"]["errors"]) == {"approved_amount", "reason"}
    too_much = seen["form_too_much"]["body"]["errors"]
    assert seen["form_too_much"]["status"] == 400 and set(too_much) == {"approved_amount", "reason"}
    assert seen["after_form"]["approvals"] == ["pending"]
    assert seen["approved"] == {
        "status": 200,
        "body": {
            "approval_id": approval,
            "status": "approved",
            "decided_by": "approver",
            "repeated": False,
            "run_status": "completed",
        },
    }
    again = seen["approved_again"]
    assert again["status"] == 200 and again["body"]["repeated"] is True
    assert again["body"]["run_status"] is None
    assert seen["rejected_late"]["status"] == 409
    assert seen["rejected_late"]["body"]["code"] == "approval_already_decided"
    assert seen["unknown_approval"]["status"] == 404

    # The run completed with the decision applied to the order.
    assert seen["large_after"] == {
        "status": 200,
        "body": {
            "created": False,
            "coordination_id": cid,
            "status": "completed",
            "approval_id": None,
            "order_approval": "approved",
        },
    }
    assert seen["run"] == {"status": "completed", "runs": 2}
    assert seen["chain"] == ["", "review", "fulfil"]
    final = seen["final_state"]
    assert (final["outcome"], final["decided_by"], final["comment"]) == (
        "fulfilled",
        "approver",
        "fine",
    )
    # The form's cleaned data reached the next step.
    assert (final["approved_cents"], final["reason"]) == (200_000, "known_customer")
