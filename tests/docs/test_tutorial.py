"""The tutorial runs as written: every Python block of ``docs/tutorial.md``, in order,
against a scripted replica set and the test database, as a reader would use them.

* A block whose first line is ``# <path>/settings.py`` is settings: its
  ``INSTALLED_APPS`` (``...`` standing for the project's own), ``REST_FRAMEWORK`` and
  ``FLOWWARDEN`` (the replica set's URI for the URL) are applied.
* ``# <path>/urls.py`` is the project's URLconf (``ROOT_URLCONF``).
* ``# shop/workflows.py`` (any other ``# <file>.py``) is a file of the reader's app,
  written to a temporary directory on ``sys.path`` before the settings are applied,
  so Django's start-up (``AppConfig.ready``) imports it as it would in every
  process: the workflow comes from that module, not from the shell.
* The other blocks run in one namespace, as typed into ``manage.py shell``.

The approval is made where the tutorial makes it: Ann (not staff) logs in to the
inbox's page with the tutorial's password and presses Approve; then the run is
completed, and the inbox said so with no warning.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse

pytest.importorskip("mockupdb", reason="the tutorial's MongoDB is the scripted replica set")
pytest.importorskip("rest_framework", reason="the tutorial installs the drf extra")

from flowwarden_django.models import Approval
from flowwarden_django.streams.registry import stream_registry
from flowwarden_django.testkit.scripted_mongo import ScriptedReplicaSet
from flowwarden_django.workflows import workflow_registry

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FILE = re.compile(r"^# ([\w/]+\.py)\n")
#: The tutorial's app (``startapp shop``) and the workflow it defines.
APP, WORKFLOW = "shop", "tutorial-refund"


def python_blocks() -> list[str]:
    return list(BLOCK.findall(TUTORIAL.read_text()))


def test_the_development_mongodb_is_started_once_its_app_is_installed():
    """``flowwarden_mongo_dev`` exists once ``flowwarden_django`` is installed: the
    tutorial runs it after the settings, not before."""
    text = TUTORIAL.read_text()
    assert text.index("flowwarden_mongo_dev --port") > text.index('"flowwarden_django",')


def file_of(code: str) -> str | None:
    """The file a block goes in (its first line, ``# shop/workflows.py``), if any."""
    match = FILE.match(code)
    return match.group(1) if match else None


def tutorial_settings(code: str, mongo_uri: str) -> dict[str, Any]:
    """The settings block's values, applied to the test project: ``...`` in
    ``INSTALLED_APPS`` stands for its own apps, the MongoDB URL is the replica set's."""
    values: dict[str, Any] = {}
    exec(compile(code, str(TUTORIAL), "exec"), values)
    apps: list[str] = []
    for app in values["INSTALLED_APPS"]:
        for name in settings.INSTALLED_APPS if app is Ellipsis else [app]:
            if name not in apps:
                apps.append(name)
    flowwarden = values["FLOWWARDEN"]
    assert set(flowwarden["MONGO_CLIENTS"]) == {"default"}
    flowwarden["MONGO_CLIENTS"]["default"]["URL"] = mongo_uri
    return {
        "INSTALLED_APPS": apps,
        "REST_FRAMEWORK": values["REST_FRAMEWORK"],
        "FLOWWARDEN": flowwarden,
    }


@contextlib.contextmanager
def module_named(name: str, code: str) -> Iterator[None]:
    """*code* importable as module *name* while inside."""
    module = types.ModuleType(name)
    exec(compile(code, str(TUTORIAL), "exec"), module.__dict__)
    sys.modules[name] = module
    try:
        yield
    finally:
        sys.modules.pop(name, None)


@contextlib.contextmanager
def app_files(files: dict[str, str], root: Path) -> Iterator[None]:
    """The reader's app files under *root*, importable while inside."""
    for path, code in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        (target.parent / "__init__.py").touch()
        target.write_text(code)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == APP or m.startswith(f"{APP}.")]:
            del sys.modules[name]


def approve_in_the_inbox(namespace: dict[str, Any], code: str) -> list[tuple[str, str]]:
    """What the tutorial tells Ann to do between two shell blocks: log in to the
    inbox with her password, open the refund, press Approve. The messages shown."""
    password = re.search(r'create_user\("ann", password="([^"]+)"\)', code)
    assert password, "the tutorial gives Ann a password"
    ann = namespace["ann"]
    assert not ann.is_staff
    client = Client()
    inbox = reverse("flowwarden-inbox:list")
    login = reverse("flowwarden-inbox:login")
    listed = client.post(
        login, {"username": "ann", "password": password.group(1), "next": inbox}, follow=True
    )
    assert listed.status_code == 200 and "Refund 900?" in listed.content.decode()
    approval = Approval.objects.get(coordination_id=namespace["big"].coordination_id)
    page = reverse("flowwarden-inbox:approval", kwargs={"pk": approval.pk})
    assert page in listed.content.decode()
    assert client.get(page).status_code == 200
    decided = client.post(page, {"approve": "Approve"}, follow=True)
    assert decided.status_code == 200
    return [(m.level_tag, str(m)) for m in decided.context["messages"]]


@pytest.mark.django_db(transaction=True)
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    blocks = python_blocks()
    assert len(blocks) >= 6
    settings_block = next(code for code in blocks if (file_of(code) or "").endswith("settings.py"))
    urls_block = next(code for code in blocks if (file_of(code) or "").endswith("urls.py"))
    files = {
        file_of(code): code
        for code in blocks
        if file_of(code) and not file_of(code).endswith(("settings.py", "urls.py"))
    }
    assert set(files) == {f"{APP}/workflows.py"}
    shell = [code for code in blocks if file_of(code) is None]
    namespace: dict[str, object] = {"__name__": "tutorial"}
    printed = io.StringIO()
    shown: list[tuple[str, str]] = []
    with (
        ScriptedReplicaSet() as mongo,
        app_files(files, tmp_path),
        module_named("tutorial_urls", urls_block),
        override_settings(ROOT_URLCONF="tutorial_urls"),
        override_settings(**tutorial_settings(settings_block, mongo.uri)),
    ):
        try:
            # The REST API is installed and mounted as the tutorial shows.
            assert reverse("flowwarden-api:api-root").startswith("/api/")
            # Django's start-up imported the app's workflows.py: no shell defined it.
            assert WORKFLOW in workflow_registry
            definition = workflow_registry.get(WORKFLOW)
            assert {s.fn.__module__ for s in definition.steps} == {f"{APP}.workflows"}
            with contextlib.redirect_stdout(printed):
                previous = ""
                for code in shell:
                    if code.startswith("# Back in the shell"):
                        shown = approve_in_the_inbox(namespace, previous)
                    exec(compile(code, str(TUTORIAL), "exec"), namespace)
                    previous = code
        finally:
            stream_registry.unregister("tutorial-orders")
            workflow_registry.unregister(WORKFLOW)
    assert shown == [("success", "Approved: Refund 900?")]  # no warning: the run went on
    lines = printed.getvalue().splitlines()
    # What the comments beside each print() say it prints.
    assert lines[0] == "[1, 2]"
    assert lines[1].startswith("Completed(final_state={") and "'refunded': True" in lines[1]
    assert lines[2:] == ["waiting", "completed"]
