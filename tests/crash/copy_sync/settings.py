"""Settings of the initial-sync crash test's consumer subprocess.

Run as ``DJANGO_SETTINGS_MODULE=tests.crash.copy_sync.settings python manage.py
flowwarden_streams run --stream copy-mirror``. Everything comes from
``tests.crash.settings`` (the same ``FLOWWARDEN_CRASH_*`` environment: the PostgreSQL
test database, the scripted server's URI, ``application_name=fw-crash-consumer``),
except the installed apps: this package replaces ``tests.crash``, so the process
declares only the streams of ``tests/crash/copy_sync/streams.py``.
"""

from tests.crash.settings import *  # noqa: F403

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "flowwarden_django",
    "tests.testapp",
    "tests.crash.copy_sync",  # its streams.py declares copy-mirror and copy-mirror-tx
]
