"""Settings of the test suite: SQLite always, PostgreSQL and MariaDB when reachable."""

import os
from importlib.util import find_spec

from tests.support.services import SERVICES, available, redis_url, scratch_dir

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "flowwarden_django",
    "tests.testapp",
]

# Scheduled starts (the "beat" extra).
if find_spec("celery") and find_spec("django_celery_beat"):
    INSTALLED_APPS += ["django_celery_beat"]

# The REST API (the "drf" extra); absent in tests/packaging/test_optional_extras.py's child.
if all(find_spec(m) for m in ("rest_framework", "drf_spectacular", "django_filters")):
    INSTALLED_APPS += ["rest_framework", "rest_framework.authtoken", "drf_spectacular"]
    INSTALLED_APPS += ["django_filters"]
    if find_spec("drf_spectacular_sidecar"):
        INSTALLED_APPS += ["drf_spectacular_sidecar"]
    REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
    SPECTACULAR_SETTINGS = {"TITLE": "flowwarden-django API"}

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

STATIC_URL = "/static/"

# SQLite on a file, not in memory: the race tests write from several threads,
# each with its own connection.
_SQLITE_DIR = scratch_dir()
# Two test runs at once on one server need different test databases.
_SUFFIX = os.environ.get("FLOWWARDEN_TEST_DB_SUFFIX", "")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_SQLITE_DIR, f"fw-tests-{os.getpid()}.sqlite3"),
        "TEST": {"NAME": os.path.join(_SQLITE_DIR, f"fw-tests-{os.getpid()}-test.sqlite3")},
        "OPTIONS": {"timeout": 30},
    },
    # A second database, for the routing tests.
    "other": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_SQLITE_DIR, f"fw-tests-{os.getpid()}-other.sqlite3"),
        "TEST": {"NAME": os.path.join(_SQLITE_DIR, f"fw-tests-{os.getpid()}-other-test.sqlite3")},
    },
}

if available("postgres"):
    _pg = SERVICES["postgres"]
    DATABASES["postgres"] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": _pg.host,
        "PORT": _pg.port,
        "USER": os.environ.get("FLOWWARDEN_TEST_POSTGRES_USER", "postgres"),
        "PASSWORD": os.environ.get("FLOWWARDEN_TEST_POSTGRES_PASSWORD", ""),
        "NAME": "fw_tests",
        # A commit does not wait for its WAL flush: the tests kill clients, never this
        # server, and thousands of commits stop waiting on the disk.
        "OPTIONS": {"options": "-c synchronous_commit=off"},
        # No dependency on "default", so a run that only needs this alias can set it up.
        "TEST": {"NAME": f"test_fw_tests{_SUFFIX}", "DEPENDENCIES": []},
    }

if available("mariadb"):
    _my = SERVICES["mariadb"]
    DATABASES["mariadb"] = {
        "ENGINE": "django.db.backends.mysql",
        "HOST": _my.host,
        "PORT": _my.port,
        "USER": os.environ.get("FLOWWARDEN_TEST_MARIADB_USER", "root"),
        "PASSWORD": os.environ.get("FLOWWARDEN_TEST_MARIADB_PASSWORD", ""),
        "NAME": "fw_tests",
        "TEST": {"NAME": f"test_fw_tests{_SUFFIX}", "CHARSET": "utf8mb4", "DEPENDENCIES": []},
        "OPTIONS": {"charset": "utf8mb4"},
    }

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if available("redis"):
    _redis = SERVICES["redis"]
    CACHES["redis"] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": redis_url(),
    }

FLOWWARDEN = {
    "CHECKPOINT_STORES": {
        "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
    },
    # Tests point streams at fake sources or at a ScriptedReplicaSet they start.
    "MONGO_CLIENTS": {"default": {"URL": "mongodb://127.0.0.1:1/?replicaSet=rs0"}},
}
