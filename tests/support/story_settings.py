"""Settings of the sample's story on PostgreSQL, whatever runs the workflow steps.

The base of ``tests/support/story_celery_settings.py`` and
``tests/support/story_temporal_settings.py``
(the settings of ``tests/sample/test_story_celery.py`` and ``test_story_temporal.py``):
the sample project's settings, with what production would change:

* the ``default`` database is PostgreSQL: the database ``FLOWWARDEN_STORY_DB_NAME``
  (the test creates it and drops it) on ``FLOWWARDEN_TEST_POSTGRES`` (host:port,
  ``127.0.0.1:5432``) as ``FLOWWARDEN_TEST_POSTGRES_USER`` (``postgres``);
* MongoDB is ``FLOWWARDEN_MONGO_URL`` (the test's scripted replica set).

Every process of a story (``manage.py`` commands, ``runserver``, the workers) runs
with the settings of its story.
"""

import os

from sampleproject.settings import *  # noqa: F403
from sampleproject.settings import FLOWWARDEN


def host_port(env: str, default_port: int) -> tuple[str, str]:
    host, _, port = os.environ.get(env, f"127.0.0.1:{default_port}").rpartition(":")
    return host or "127.0.0.1", port or str(default_port)


_pg_host, _pg_port = host_port("FLOWWARDEN_TEST_POSTGRES", 5432)

DEBUG = False
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("FLOWWARDEN_STORY_DB_NAME", "fw_story"),
        "HOST": _pg_host,
        "PORT": _pg_port,
        "USER": os.environ.get("FLOWWARDEN_TEST_POSTGRES_USER", "postgres"),
        "PASSWORD": os.environ.get("FLOWWARDEN_TEST_POSTGRES_PASSWORD", ""),
    }
}
# Fast logins for the approver the test makes.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

FLOWWARDEN = {
    **FLOWWARDEN,
    "MONGO_CLIENTS": {
        "default": {
            "URL": os.environ.get("FLOWWARDEN_MONGO_URL", "mongodb://127.0.0.1:1/"),
            "OPTIONS": {"serverSelectionTimeoutMS": 5000},
        }
    },
}
