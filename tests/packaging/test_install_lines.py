"""The install lines docs/install.md gives for scheduled starts on Django 6.1, installed
as written into a new virtualenv: Django stays 6.1, and django-celery-beat works.

The slow test runs on the Python 3.13 + Django 6.1 lane (``make test PYTHON=python3.13``,
which .ci/run runs); it needs PyPI (or the machine's wheel cache)."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import django
import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- tested-install: django-celery-beat on Django 6.1"
PROJECT = "flowwarden-django"
INSTALL_TIMEOUT = 900


def documented_lines() -> list[list[str]]:
    """The ``pip install`` lines of the block after the marker, as argument lists."""
    text = (ROOT / "docs" / "install.md").read_text()
    assert MARKER in text, "docs/install.md lost its tested install block"
    block = re.search(r"```sh\n(.*?)```", text.split(MARKER, 1)[1], re.DOTALL)
    assert block is not None
    lines = [shlex.split(line) for line in block.group(1).splitlines() if line.strip()]
    assert lines and all(line[:2] == ["pip", "install"] for line in lines), lines
    return [line[2:] for line in lines]


def project_requirements(argument: str) -> list[str]:
    """``flowwarden-django[extra,...]`` as the requirements setup.cfg gives it (the
    package itself is not built: its dependencies are what the resolution is about)."""
    match = re.fullmatch(rf"{PROJECT}(?:\[(?P<extras>[\w,-]+)\])?", argument)
    assert match is not None, argument
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")

    def requirements(value: str) -> list[str]:
        return [
            line.strip()
            for line in value.splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]

    found = requirements(config["options"]["install_requires"])
    for extra in (match.group("extras") or "").split(","):
        if extra:
            found += requirements(config["options.extras_require"][extra])
    return found


def test_the_makefile_installs_the_documented_lines() -> None:
    """The test virtualenv (Makefile) and the docs give django-celery-beat the same way."""
    makefile = (ROOT / "Makefile").read_text()
    installed = [
        [
            arg
            for arg in shlex.split(line.split("install", 1)[1].rstrip().rstrip("\\"))
            if arg != "--quiet"
        ]
        for line in makefile.splitlines()
        if line.strip().startswith("$(PIP) install")
    ]
    for line in documented_lines():
        if any(arg.startswith(PROJECT) for arg in line):
            continue
        assert line in installed, f"the Makefile does not run the documented: pip install {line}"


def _run(*command: str | Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


SMOKE = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_celery_beat"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
from django_celery_beat.models import CrontabSchedule
from django_celery_beat.schedulers import DatabaseScheduler  # noqa: F401
from flowwarden_django.integrations.celery.schedules import beat_schedule_entry

print(CrontabSchedule(minute="0", hour="2").human_readable)
print(beat_schedule_entry("n", "w", crontab={"minute": "0"})["task"])
print(django.get_version())
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_documented_lines_keep_django_6_1(tmp_path: Path) -> None:
    if sys.version_info[:2] != (3, 13) or django.VERSION[:2] != (6, 1):
        pytest.skip("runs on the Python 3.13 + Django 6.1 lane (make test PYTHON=python3.13)")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    env.pop("PYTHONPATH", None)
    pip = (python, "-m", "pip", "install", "--quiet")
    # A project on Django 6.1, as a new user's is.
    _run(*pip, f"Django=={django.get_version()}", env=env)
    for line in documented_lines():
        arguments = [
            requirement
            for argument in line
            for requirement in (
                project_requirements(argument) if argument.startswith(PROJECT) else [argument]
            )
        ]
        _run(*pip, *arguments, env=env)
        version = _run(python, "-c", "import django; print(django.get_version())", env=env)
        assert version.strip() == django.get_version(), f"pip install {line} moved Django"

    smoke = _run(python, "-c", SMOKE, env={**env, "PYTHONPATH": str(ROOT)})
    description, task, version = smoke.strip().splitlines()[-3:]
    assert version == django.get_version()
    assert description.startswith("At 02:00"), description
    assert task == "flowwarden_django.start_scheduled_workflow"
    cron = _run(python, "-c", "import importlib.metadata as m; print(m.version('cron-descriptor'))")
    assert int(cron.split(".")[0]) < 2
