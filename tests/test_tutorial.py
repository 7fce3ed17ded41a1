"""The tutorial's code runs: every Python block of ``docs/tutorial.md``, in order, in
one namespace, against a scripted replica set and the test database, as a reader
would type them into ``manage.py shell``. A block that starts with ``# settings.py``
is settings, which the test applies itself (the replica set's URI for the URL)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from django.test import override_settings

pytest.importorskip("mockupdb", reason="the tutorial's MongoDB is the scripted replica set")

from flowwarden_django.streams.registry import stream_registry
from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet
from flowwarden_django.workflows import workflow_registry

TUTORIAL = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return [code for code in BLOCK.findall(TUTORIAL.read_text())]


@pytest.mark.django_db(transaction=True)
def test_the_tutorial_runs_as_written():
    blocks = python_blocks()
    assert len(blocks) >= 4
    namespace: dict[str, object] = {"__name__": "tutorial"}
    printed = io.StringIO()
    with (
        ScriptedReplicaSet() as mongo,
        override_settings(FLOWWARDEN={"MONGO_CLIENTS": {"default": {"URL": mongo.uri}}}),
    ):
        try:
            with contextlib.redirect_stdout(printed):
                for code in blocks:
                    if code.startswith("# settings.py"):
                        continue
                    exec(compile(code, str(TUTORIAL), "exec"), namespace)
        finally:
            stream_registry.unregister("tutorial-orders")
            workflow_registry.unregister("tutorial-refund")
    lines = printed.getvalue().splitlines()
    # What the comments beside each print() say it prints.
    assert lines[0] == "[1, 2]"
    assert lines[1].startswith("Completed(") and "'refunded': True" in lines[1]
    assert lines[2:] == ["waiting", "completed"]
