"""The package layout's promises (docs/architecture.md): every import path the README
and the docs show resolves, the core imports before Django is set up, the old root modules are
gone, and the package root holds only the app plumbing."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The README and the documentation pages: every import and dotted name they show.
README = "\n".join(
    path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
)
PACKAGE = ROOT / "flowwarden_django"

#: ``from flowwarden_django... import a, b`` or ``import (a, b)`` across lines.
IMPORT = re.compile(r"^\s*from (flowwarden_django[\w.]*) import (\([^)]*\)|[^\n]+)", re.M)
#: Dotted names the README writes in prose or settings.
DOTTED = re.compile(r"\bflowwarden_django(?:\.\w+)+")
CHECK_ID = re.compile(r"^flowwarden_django\.[EW](\d+|\d*x)$")


def readme_imports() -> list[tuple[str, str]]:
    pairs = []
    for module, names in IMPORT.findall(README):
        for name in names.strip("()").replace("\n", " ").split(","):
            name = name.split("#")[0].split(" as ")[0].strip()
            if name:
                pairs.append((module, name))
    return sorted(set(pairs))


def resolve(dotted: str) -> object:
    """Import the longest importable module prefix of *dotted*, then get the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize(("module", "name"), readme_imports())
def test_readme_import_statements_resolve(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"


def test_readme_shows_import_statements() -> None:
    assert len(readme_imports()) >= 10


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_every_dotted_name_in_the_readme_is_a_path_a_permission_a_task_or_a_check() -> None:
    from celery import current_app
    from django.apps import apps

    import flowwarden_django.tasks  # noqa: F401  (registers the shared tasks)

    permissions = set()
    for model in apps.get_app_config("flowwarden_django").get_models():
        codenames = [
            f"{action}_{model._meta.model_name}" for action in model._meta.default_permissions
        ]
        codenames += [codename for codename, _ in model._meta.permissions]
        permissions.update(f"flowwarden_django.{codename}" for codename in codenames)
    tasks = set(current_app.tasks)
    unresolved = []
    for dotted in sorted(set(DOTTED.findall(README))):
        if CHECK_ID.match(dotted) or dotted in permissions or dotted in tasks:
            continue
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as exc:
            unresolved.append(f"{dotted}: {exc}")
    assert not unresolved


@pytest.mark.django_db
def test_permissions_named_in_the_readme_exist() -> None:
    from django.contrib.auth.models import Permission

    for codename in ("decide_approval", "view_approval", "view_workflowrun", "control_stream"):
        assert Permission.objects.filter(
            content_type__app_label="flowwarden_django", codename=codename
        ).exists()


@pytest.mark.subprocess
def test_the_core_and_the_celery_integration_import_before_django_is_set_up() -> None:
    """A project's Celery app module, settings-time code or models may import these
    while the app registry is still loading: no model may be imported at module level."""
    code = (
        "import flowwarden_django.streams, flowwarden_django.workflows, "
        "flowwarden_django.workflows.waiting.approvals, flowwarden_django.integrations.celery, "
        "flowwarden_django.testkit, flowwarden_django.tasks\n"
        "from django.apps import apps\n"
        "assert not apps.ready, 'the imports set Django up'\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.subprocess
def test_the_integrations_lazy_names_load_nothing_until_read() -> None:
    """``integrations.temporal`` stays sandbox-safe (its ``__init__`` loads only the
    standard library) and both integrations resolve their lazy names on first read."""
    code = (
        "import sys\n"
        "import flowwarden_django.integrations.temporal as temporal\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('django', 'temporalio')]\n"
        "assert not loaded, loaded\n"
        "import django; django.setup()\n"
        "import flowwarden_django.integrations.celery as celery\n"
        "assert temporal.TemporalExecutionProvider.__name__ == 'TemporalExecutionProvider'\n"
        "assert celery.CeleryExecutionProvider.__name__ == 'CeleryExecutionProvider'\n"
        "for package in (temporal, celery):\n"
        "    try:\n"
        "        package.nope\n"
        "    except AttributeError as exc:\n"
        "        assert 'nope' in str(exc)\n"
        "    else:\n"
        "        raise AssertionError('nope resolved')\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("old", ["flowwarden_django.celery", "flowwarden_django.prometheus"])
def test_the_old_root_modules_are_gone(old: str) -> None:
    """They moved to ``flowwarden_django.integrations`` before any release shipped them."""
    sys.modules.pop(old, None)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_the_package_root_holds_only_the_app_plumbing() -> None:
    plumbing = {
        "__init__", "apps", "models", "conf", "urls", "views", "signals", "exceptions", "tasks",
    }  # fmt: skip
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    assert modules == plumbing
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert packages == {
        "admin", "api", "checks", "common", "inbox", "integrations", "management", "migrations",
        "streams", "templatetags", "testkit", "workflows",
    }  # fmt: skip
    # The system checks, one module per area, all registered by importing the package.
    assert {path.stem for path in (PACKAGE / "checks").glob("*.py")} == {
        "__init__", "configuration", "stores", "streams", "workflows", "approvals", "queues",
        "endpoints", "network", "transactional", "migrations",
    }  # fmt: skip


#: The streams modules that issue 28 moved, kept at their old paths until 0.3 (each a
#: one-line alias that warns: tests/public_api/test_deprecations.py).
DEPRECATED_STREAMS_PATHS = {
    "async_manager", "async_runtime", "copy_filter", "copy_progress", "display",
    "leadership", "manager", "observed_store", "policy", "replay", "resync", "status",
}  # fmt: skip


def test_streams_shows_its_architecture() -> None:
    """At the root, what a project declares and implements (the spec, the context, the
    three SPIs, the change source and how an event goes to another process); beside it,
    one package a job: the decisions (``core``), what runs them (``runtime``), the
    initial sync, the operators' tools and the backends."""
    streams = PACKAGE / "streams"
    packages = {path.name for path in streams.iterdir() if (path / "__init__.py").is_file()}
    assert packages == {"backends", "core", "initial_sync", "operations", "runtime"}
    assert {path.stem for path in streams.glob("*.py")} == {
        "__init__", "announcer", "async_source", "checkpoint", "clients", "context", "dispatch",
        "dlq",
        "locks", "metrics", "registry", "remote_events", "source", "spec", "stores", "tokens",
        "validation",
        # how the SPIs make their async twins from their sync signatures
        "_twins",
        # 0.1.0's paths of modules that moved below: deprecated, removed in 0.3
        *DEPRECATED_STREAMS_PATHS,
    }  # fmt: skip
    for stem in DEPRECATED_STREAMS_PATHS:
        assert "moved_module" in (streams / f"{stem}.py").read_text(), stem
    assert {path.stem for path in (streams / "runtime").glob("*.py")} == {
        "__init__", "threaded", "event_loop", "policy", "observed_store", "manager",
        "async_manager", "leadership", "lease_calls",
        # the events an asyncio stream's last getMore already brought
        "buffered",
        # a stream handled in parallel: its window on threads, on the loop, the settled
        # marks of transactional ones, and one event in a Celery worker
        "parallel", "async_parallel", "settled_marks", "remote_runner",
    }  # fmt: skip


@pytest.mark.subprocess
def test_the_import_contracts_hold() -> None:
    """The same check ``make test`` runs first, so a plain ``pytest`` catches a cycle."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_tests_root_holds_only_the_test_plumbing() -> None:
    """Tests live in the folder of what they test, helpers in ``tests/support/``: the root
    keeps the package marker, the conftest, and the settings and URLs Django loads."""
    tests = ROOT / "tests"
    assert {path.name for path in tests.iterdir() if path.is_file()} == {
        "__init__.py", "conftest.py", "settings.py", "urls.py",
    }  # fmt: skip


def test_no_import_cycle_between_modules_counting_function_local_imports() -> None:
    """import-linter checks cycles between siblings; this checks every pair of modules,
    with the imports made inside functions (only ``if TYPE_CHECKING:`` ones aside)."""
    import grimp

    graph = grimp.build_graph("flowwarden_django", exclude_type_checking_imports=True)
    cycles = sorted(
        {
            tuple(sorted((module, imported)))
            for module in graph.modules
            for imported in graph.find_modules_directly_imported_by(module)
            if graph.chain_exists(importer=imported, imported=module)
        }
    )
    assert cycles == []


#: 0.1.0's module paths of the workflows package, kept until 0.3 as one-line aliases
#: that warn (tests/public_api/test_deprecations.py).
DEPRECATED_WORKFLOWS_PATHS = {
    "approvals", "cancellation", "encryption", "journal", "patches", "registry", "results",
    "schedule_ticks", "serializers", "signals", "snapshot", "step_timings", "steps", "store",
    "upgrades", "user_json",
}  # fmt: skip


def test_workflows_shows_its_architecture() -> None:
    """One package a job, as in streams: what a workflow is (``definition``), its run
    records (``runs``) and snapshots (``storage``), where and how a step runs
    (``execution``), how a run waits (``waiting``) and queues (``queues``), the
    operations around runs, the engine on top, and the stores (``backends``); no module
    over 700 lines."""
    workflows = PACKAGE / "workflows"
    packages = {path.name for path in workflows.iterdir() if (path / "__init__.py").is_file()}
    assert packages == {
        "backends", "definition", "engine", "execution", "operations", "queues", "runs",
        "storage", "waiting",
    }  # fmt: skip
    assert {path.stem for path in workflows.glob("*.py")} == {
        "__init__",
        *DEPRECATED_WORKFLOWS_PATHS,
    }
    for stem in DEPRECATED_WORKFLOWS_PATHS:
        assert "moved_module" in (workflows / f"{stem}.py").read_text(), stem
    assert {path.stem for path in (workflows / "engine").glob("*.py")} == {
        "__init__", "workflow", "opening", "loop", "saving", "calling", "starting", "signals",
        "transactional",
    }  # fmt: skip
    too_long = {
        str(path.relative_to(PACKAGE)): length
        for path in workflows.rglob("*.py")
        if (length := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not too_long


#: The most lines a module of the package may have: a longer one holds more than one job
#: and is split into modules that each say what they are (issue 46).
MAX_MODULE_LINES = 700


def test_no_module_is_over_700_lines() -> None:
    """Every module anywhere in the package (the migrations and the testkit too)."""
    too_long = {
        str(path.relative_to(PACKAGE)): length
        for path in sorted(PACKAGE.rglob("*.py"))
        if (length := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}
