"""README command 1: the sample project's demo runs on SQLite with no servers."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args, env):
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_writes_and_shows_checkpoints(tmp_path):
    env = {**os.environ, "SAMPLEPROJECT_DB": str(tmp_path / "demo.sqlite3")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    assert run("migrate", "--noinput", "-v", "0", env=env).returncode == 0
    for _ in range(2):  # a second run works on the existing data
        result = run("demo", env=env)
        assert result.returncode == 0, result.stderr
    for stream in ("orders", "inventory", "payments"):
        assert stream in result.stdout
    assert "/admin/flowwarden_django/streamcheckpoint/" in result.stdout
    shown = run("flowwarden_checkpoints", "show", "orders", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "demo-host:shop:8000" in shown.stdout
    assert run("check", env=env).returncode == 0
