"""A misconfigured FLOWWARDEN["DLQ_STORES"] fails `manage.py check` naming the setting."""

import pytest
from django.core.checks import run_checks
from django.db import connections
from django.test import override_settings

from flowwarden_django.streams.backends import _extras

ORM = "flowwarden_django.streams.backends.orm.OrmDlqStore"
MEMORY = "flowwarden_django.streams.backends.memory.InMemoryDlqStore"
REDIS = "flowwarden_django.streams.backends.redis.RedisDlqStore"
MONGO = "flowwarden_django.streams.backends.mongo.MongoDlqStore"


def dlq_errors(stores):
    """The check messages about ``DLQ_STORES`` for the configuration *stores*."""
    with override_settings(FLOWWARDEN={"DLQ_STORES": stores}):
        return [
            m
            for m in run_checks(databases=[])
            if m.id.startswith("flowwarden_django.") and "DLQ" in m.msg
        ]


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
    assert dlq_errors({"default": config}) == []


def test_the_default_setting_is_clean():
    with override_settings(FLOWWARDEN={}):
        assert [m for m in run_checks(databases=[]) if "DLQ_STORES" in m.msg] == []


@pytest.mark.parametrize(
    ("config", "code", "words"),
    [
        (
            {"BACKEND": "no.such.Store"},
            "E002",
            ['DLQ_STORES"]["default"]["BACKEND"]', "no.such.Store", "cannot be imported"],
        ),
        ({}, "E002", ['["BACKEND"] is missing']),
        (
            {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
            "E003",
            ["not a DlqStore subclass"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"databse": "x"}},
            "E004",
            ['["OPTIONS"] does not fit OrmDlqStore', "databse", "accepts: using"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"using": "nope"}},
            "E006",
            [
                'FLOWWARDEN["DLQ_STORES"]["default"]["OPTIONS"]["using"] = \'nope\'',
                "not a database",
            ],
        ),
        (
            {"BACKEND": REDIS, "OPTIONS": {"cache": "nope"}},
            "E006",
            ['DLQ_STORES"]["default"]["OPTIONS"]["cache"] = \'nope\' is not a cache alias'],
        ),
        (
            {"BACKEND": REDIS, "OPTIONS": {"cache": "default"}},
            "E008",
            ['DLQ_STORES"]["default"]["OPTIONS"]["cache"]', "not a django-redis one"],
        ),
        (
            {"BACKEND": MONGO, "OPTIONS": {"url": "http://x"}},
            "E008",
            ['DLQ_STORES"]["default"]["OPTIONS"]["url"]', "is not a MongoDB connection string"],
        ),
        ({"BACKEND": MONGO}, "E004", ['DLQ_STORES"]["default"]["OPTIONS"] needs "url"']),
    ],
    ids=[
        "bad-path",
        "no-backend",
        "not-a-dlq-store",
        "bad-option",
        "bad-db-alias",
        "bad-cache-alias",
        "not-django-redis",
        "bad-mongo-url",
        "no-mongo-url",
    ],
)
def test_misconfigured_dlq_store(config, code, words):
    message = only(dlq_errors({"default": config}))
    assert message.id == f"flowwarden_django.{code}"
    assert 'FLOWWARDEN["DLQ_STORES"]' in message.msg
    for word in words:
        assert word in message.msg + message.hint
    assert message.hint


def test_unsupported_database_is_named(monkeypatch):
    """A database without INSERT … ON CONFLICT (Oracle, say) cannot hold the ORM store."""
    monkeypatch.setattr(connections["other"].features, "supports_update_conflicts", False)
    message = only(dlq_errors({"ops": {"BACKEND": ORM, "OPTIONS": {"using": "other"}}}))
    assert message.id == "flowwarden_django.E007"
    assert 'FLOWWARDEN["DLQ_STORES"]["ops"]["OPTIONS"]["using"]' in message.msg


@pytest.mark.parametrize(
    ("backend", "package", "extra", "options"),
    [
        (REDIS, "redis", "redis", {"url": "redis://x"}),
        (REDIS, "django_redis", "redis", {}),
        (MONGO, "pymongo", "mongo", {"url": "mongodb://x"}),
    ],
    ids=["redis", "django-redis", "pymongo"],
)
def test_missing_extra_names_the_extra(monkeypatch, backend, package, extra, options):
    real = _extras.find_spec
    monkeypatch.setattr(_extras, "find_spec", lambda n: None if n == package else real(n))
    message = only(dlq_errors({"parked": {"BACKEND": backend, "OPTIONS": options}}))
    assert message.id == "flowwarden_django.E005"
    assert f"'{package}' package" in message.msg
    assert 'FLOWWARDEN["DLQ_STORES"]["parked"]' in message.msg
    assert message.hint == f'pip install "flowwarden-django[{extra}]"'


def test_not_a_dict_of_aliases():
    message = only(dlq_errors(["nope"]))
    assert message.id == "flowwarden_django.E001"
    assert 'FLOWWARDEN["DLQ_STORES"] must be a dict of aliases' in message.msg
