"""A misconfigured FLOWWARDEN["LOCK_SERVICES"] alias fails `manage.py check`, naming it."""

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from flowwarden_django.streams.backends import _extras

ORM = "flowwarden_django.streams.backends.orm.OrmLockService"
REDIS = "flowwarden_django.streams.backends.redis.RedisLockService"
MONGO = "flowwarden_django.streams.backends.mongo.MongoLockService"
MEMORY = "flowwarden_django.streams.backends.memory.InMemoryLockService"


def errors_for(services):
    with override_settings(FLOWWARDEN={"LOCK_SERVICES": services}):
        return [m for m in run_checks(databases=[]) if m.id.startswith("flowwarden_django.")]


def only(messages):
    assert len(messages) == 1, messages
    return messages[0]


@pytest.mark.parametrize(
    "config",
    [
        {"BACKEND": ORM},
        {"BACKEND": ORM, "OPTIONS": {"using": "other"}},
        {"BACKEND": MEMORY},
        {"BACKEND": REDIS, "OPTIONS": {"url": "redis://127.0.0.1:6379/0"}},
        {"BACKEND": MONGO, "OPTIONS": {"url": "mongodb://127.0.0.1:27017/fw"}},
    ],
    ids=["orm", "orm-using", "memory", "redis-url", "mongo-url"],
)
def test_valid_configurations_are_clean(config):
    assert errors_for({"default": config}) == []


@pytest.mark.parametrize(
    ("config", "code", "words"),
    [
        (
            {"BACKEND": ORM, "OPTIONS": {"using": "nope"}},
            "E006",
            ['["leases"]["OPTIONS"]["using"] = \'nope\' is not a database alias', "default"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"databse": "x"}},
            "E004",
            ['["OPTIONS"] does not fit OrmLockService', "accepts: using"],
        ),
        (
            {"BACKEND": REDIS, "OPTIONS": {"cache": "nope"}},
            "E006",
            ['["leases"]["OPTIONS"]["cache"] = \'nope\' is not a cache alias'],
        ),
        (
            {"BACKEND": REDIS, "OPTIONS": {"cache": "default"}},
            "E008",
            ["not a django-redis one"],
        ),
        (
            {"BACKEND": MONGO, "OPTIONS": {"url": "http://x"}},
            "E008",
            ['["leases"]["OPTIONS"]["url"]', "is not a MongoDB connection string"],
        ),
        ({"BACKEND": MONGO}, "E004", ['["leases"]["OPTIONS"] needs "url"']),
        (
            {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
            "E003",
            ["not a LockService subclass"],
        ),
    ],
    ids=[
        "bad-db-alias",
        "bad-option",
        "bad-cache-alias",
        "not-django-redis",
        "bad-mongo-url",
        "no-mongo-url",
        "not-a-lock-service",
    ],
)
def test_misconfigured_lock_service(config, code, words):
    message = only(errors_for({"leases": config}))
    assert message.id == f"flowwarden_django.{code}"
    assert 'FLOWWARDEN["LOCK_SERVICES"]["leases"]' in message.msg
    assert "CHECKPOINT_STORES" not in message.msg
    for word in words:
        assert word in message.msg + message.hint
    assert message.hint


@pytest.mark.parametrize(
    ("backend", "package", "extra"), [(REDIS, "redis", "redis"), (MONGO, "pymongo", "mongo")]
)
def test_missing_extra_names_the_lock_service(monkeypatch, backend, package, extra):
    real = _extras.find_spec
    monkeypatch.setattr(_extras, "find_spec", lambda n: None if n == package else real(n))
    message = only(errors_for({"leases": {"BACKEND": backend, "OPTIONS": {"url": "mongodb://x"}}}))
    assert message.id == "flowwarden_django.E005"
    assert f'FLOWWARDEN["LOCK_SERVICES"]["leases"] uses {backend.rsplit(".", 1)[1]}' in message.msg
    assert f"'{package}' package" in message.msg
    assert message.hint == f'pip install "flowwarden-django[{extra}]"'
