"""Settings of the crash test's consumer subprocess (``tests/streams/test_crash.py``).

Run as ``DJANGO_SETTINGS_MODULE=tests.crash.settings python manage.py flowwarden_streams run``.

The test passes everything through the environment:

* ``FLOWWARDEN_CRASH_DB_NAME`` / ``_HOST`` / ``_PORT`` / ``_USER`` / ``_PASSWORD``: the
  PostgreSQL test database pytest-django created (it is this process's ``default``);
* ``FLOWWARDEN_CRASH_MONGO_URL``: the scripted MongoDB server's URI;
* ``FLOWWARDEN_CRASH_MODE`` and ``FLOWWARDEN_CRASH_SAVE_EVERY_N``: read by ``streams.py``.

The connection carries ``application_name=fw-crash-consumer`` so the test can see in
``pg_stat_activity`` when a killed consumer's sessions are gone.
"""

import os

SECRET_KEY = "tests-only-not-secret"
DEBUG = False  # DEBUG would log every query and take the ORM store's slow path
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

#: The ``application_name`` of the consumer's PostgreSQL sessions.
APPLICATION_NAME = "fw-crash-consumer"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "flowwarden_django",
    "tests.testapp",
    "tests.crash",  # its streams.py declares the crash-orders stream
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("FLOWWARDEN_CRASH_DB_NAME", "test_fw_tests"),
        "HOST": os.environ.get("FLOWWARDEN_CRASH_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("FLOWWARDEN_CRASH_DB_PORT", "5432"),
        "USER": os.environ.get("FLOWWARDEN_CRASH_DB_USER", "postgres"),
        "PASSWORD": os.environ.get("FLOWWARDEN_CRASH_DB_PASSWORD", ""),
        "OPTIONS": {"application_name": APPLICATION_NAME},
    }
}

FLOWWARDEN = {
    "CHECKPOINT_STORES": {
        "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
    },
    "MONGO_CLIENTS": {
        "default": {
            "URL": os.environ.get("FLOWWARDEN_CRASH_MONGO_URL", "mongodb://127.0.0.1:1/"),
            "OPTIONS": {"serverSelectionTimeoutMS": 10_000},
        }
    },
    # Short polls: a consumer that has caught up notices new events at once.
    "STREAM_MAX_AWAIT_MS": 50,
    # Leader mode (tests/streams/test_leader_kill.py): this process's name and short leases.
    "INSTANCE_ID": os.environ.get("FLOWWARDEN_CRASH_INSTANCE"),
    "LEADER_LEASE_TTL": os.environ.get("FLOWWARDEN_CRASH_LEASE_TTL", "60s"),
    "LEADER_RENEW_INTERVAL": os.environ.get("FLOWWARDEN_CRASH_RENEW_INTERVAL", "15s"),
    "STANDBY_POLL_INTERVAL": os.environ.get("FLOWWARDEN_CRASH_POLL_INTERVAL", "20s"),
    "STATUS_INTERVAL": "500ms",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"flowwarden_django": {"handlers": ["stderr"], "level": "INFO"}},
}
