"""The core installs and imports without the optional extras.

The check runs in a child interpreter in which pymongo/bson, redis, django-redis,
celery, DRF and OpenTelemetry cannot be imported, as in an install without extras.
"""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: It runs processes of its own (the sample project, a child interpreter).
pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, sys
    for name in ("pymongo", "bson", "gridfs", "redis", "django_redis", "celery",
                 "rest_framework", "drf_spectacular", "mongomock", "opentelemetry"):
        sys.modules[name] = None  # import fails; importlib.util.find_spec returns None
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django
    django.setup()
    from django.core.checks import run_checks
    from django.test.utils import override_settings
    import flowwarden_django.streams
    from flowwarden_django.exceptions import MissingExtraError
    from flowwarden_django.streams import Checkpoint
    from flowwarden_django.streams.backends import memory, mongo, orm, redis  # noqa: F401
    from flowwarden_django.streams.tokens import encode_token

    assert [m.id for m in run_checks(databases=[]) if m.id.startswith("flowwarden")] == [
        "flowwarden_django.W001"
    ]
    redis_store = {"BACKEND": "flowwarden_django.streams.backends.redis.RedisCheckpointStore"}
    with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": {"default": redis_store}}):
        errors = [m for m in run_checks(databases=[]) if m.id.startswith("flowwarden")]
    assert sorted(e.id for e in errors) == ["flowwarden_django.E005", "flowwarden_django.W001"]
    missing_redis = next(e for e in errors if e.id.endswith("E005"))
    assert missing_redis.hint == 'pip install "flowwarden-django[redis]"'
    store = memory.InMemoryCheckpointStore()
    store.save(Checkpoint("no-tokens"))
    assert store.find("no-tokens") == Checkpoint("no-tokens")
    try:
        encode_token({"_data": "82"})
    except MissingExtraError as exc:
        assert 'pip install "flowwarden-django[mongo]"' in str(exc)
    else:
        raise AssertionError("tokens need bson")
    # No OpenTelemetry: spans are no-ops and nothing of it is imported.
    import flowwarden_django.workflows  # noqa: F401
    from flowwarden_django.common import tracing
    with tracing.span("flowwarden.workflow.run", {"flowwarden.workflow": "w"}):
        pass
    assert not tracing.recording() and tracing.current_headers() == {}
    assert sys.modules.get("opentelemetry") is None
    assert not any(name.startswith("opentelemetry.") for name in sys.modules)
    print("core without extras: ok")
    """
)


def test_core_works_without_optional_extras():
    result = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "core without extras: ok" in result.stdout


@pytest.mark.slow
def test_the_celery_and_redis_extras_give_a_working_redis_transport(tmp_path):
    """Issue 27: with ``pip install ".[celery,redis]"`` in a clean virtualenv, kombu's
    Redis transport imports (kombu 5.7 needs ``packaging``, which neither redis nor
    celery brings), so a worker on a Redis broker starts."""
    # A copy of the project: building it writes an egg-info beside the sources, which
    # another lane running this test at the same time must not share.
    project = tmp_path / "project"
    project.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "flowwarden_django",
        project / "flowwarden_django",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"{project}[celery,redis]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run(
        [str(python), "-c", "import kombu.transport.redis, celery.bin.celery; print('ok')"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.strip() == "ok", check.stderr
