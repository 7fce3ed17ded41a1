"""Settings of the sample project: SQLite, no servers needed."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "sampleproject-insecure-demo-key")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "sampleproject.urls"
#: Served through ASGI too (the shop's async views): ``sampleproject/asgi.py``.
ASGI_APPLICATION = "sampleproject.asgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "flowwarden_django",
    "sampleproject.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SAMPLEPROJECT_DB", str(BASE_DIR / "db.sqlite3")),
        # The stream's thread, its checkpoint flusher and the workflow steps write
        # concurrently: transactions take the write lock when they begin and wait
        # for it (instead of failing with "database is locked" when they upgrade).
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}

STATIC_URL = "/static/"

REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
SPECTACULAR_SETTINGS = {"TITLE": "flowwarden-django sample API", "VERSION": "1"}

# Without FLOWWARDEN_MONGO_URL, `manage.py demo` feeds the streams from a scripted
# replica set it starts itself (flowwarden_django.testkit.scripted_mongo).
MONGO_URL = os.environ.get("FLOWWARDEN_MONGO_URL", "")

FLOWWARDEN = {
    "CHECKPOINT_STORES": {
        "default": {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
    },
    "MONGO_CLIENTS": {
        "default": {
            "URL": MONGO_URL or "mongodb://127.0.0.1:27017/?replicaSet=rs0",
            "OPTIONS": {"serverSelectionTimeoutMS": 5000},
        },
    },
    "STREAM_MAX_AWAIT_MS": 200,
}
