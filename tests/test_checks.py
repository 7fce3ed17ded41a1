"""A misconfigured FLOWWARDEN setting fails `manage.py check` naming the setting."""

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from flowwarden_django.streams.backends import _extras

ORM = "flowwarden_django.streams.backends.orm.OrmCheckpointStore"
REDIS = "flowwarden_django.streams.backends.redis.RedisCheckpointStore"
MONGO = "flowwarden_django.streams.backends.mongo.MongoCheckpointStore"


def errors_for(stores):
    with override_settings(FLOWWARDEN={"CHECKPOINT_STORES": stores}):
        return [m for m in run_checks() if m.id.startswith("flowwarden_django.")]


def only(messages):
    assert len(messages) == 1, messages
    return messages[0]


def test_default_configuration_is_clean():
    assert errors_for({"default": {"BACKEND": ORM}}) == []


@pytest.mark.parametrize(
    ("config", "code", "words"),
    [
        (
            {"BACKEND": "no.such.Store"},
            "E002",
            ['CHECKPOINT_STORES"]["default"]["BACKEND"]', "no.such.Store", "cannot be imported"],
        ),
        ({}, "E002", ['["BACKEND"] is missing']),
        ("orm", "E002", ["must be a dict"]),
        (
            {"BACKEND": "flowwarden_django.models.StreamCheckpoint"},
            "E003",
            ["not a CheckpointStore subclass"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"databse": "x"}},
            "E004",
            ['["OPTIONS"] does not fit OrmCheckpointStore', "databse", "accepts: using"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"using": "nope"}},
            "E006",
            ['["OPTIONS"]["using"] = \'nope\' is not a database alias'],
        ),
        (
            {"BACKEND": REDIS, "OPTIONS": {"cache": "nope"}},
            "E006",
            ["\"cache\"] = 'nope' is not a cache alias"],
        ),
        ({"BACKEND": REDIS, "OPTIONS": {"cache": "default"}}, "E008", ["not a django-redis one"]),
        (
            {"BACKEND": MONGO, "OPTIONS": {"url": "http://x"}},
            "E008",
            ["is not a MongoDB connection string"],
        ),
        ({"BACKEND": MONGO}, "E004", ['needs "url"']),
    ],
    ids=[
        "bad-path",
        "no-backend",
        "not-a-dict",
        "not-a-store",
        "bad-option",
        "bad-db-alias",
        "bad-cache-alias",
        "not-django-redis",
        "bad-mongo-url",
        "no-mongo-url",
    ],
)
def test_misconfigured_store(config, code, words):
    message = only(errors_for({"default": config}))
    assert message.id == f"flowwarden_django.{code}"
    assert 'FLOWWARDEN["CHECKPOINT_STORES"]' in message.msg
    for word in words:
        assert word in message.msg + message.hint
    assert message.hint


@pytest.mark.parametrize(
    ("backend", "package", "extra"), [(REDIS, "redis", "redis"), (MONGO, "pymongo", "mongo")]
)
def test_missing_extra_names_the_extra(monkeypatch, backend, package, extra):
    real = _extras.find_spec
    monkeypatch.setattr(_extras, "find_spec", lambda n: None if n == package else real(n))
    message = only(errors_for({"cache": {"BACKEND": backend, "OPTIONS": {"url": "mongodb://x"}}}))
    assert message.id == "flowwarden_django.E005"
    assert f"'{package}' package" in message.msg
    assert 'FLOWWARDEN["CHECKPOINT_STORES"]["cache"]' in message.msg
    assert message.hint == f'pip install "flowwarden-django[{extra}]"'


def test_not_a_dict_settings():
    with override_settings(FLOWWARDEN=["nope"]):
        assert only([m for m in run_checks() if m.id.startswith("flowwarden")]).id.endswith("E001")
    message = only(errors_for(["nope"]))
    assert message.id == "flowwarden_django.E001"


def test_manage_py_check_fails_with_the_setting_name():
    broken = {"CHECKPOINT_STORES": {"default": {"BACKEND": "x.Y"}}}
    with override_settings(FLOWWARDEN=broken), pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert 'FLOWWARDEN["CHECKPOINT_STORES"]["default"]["BACKEND"]' in str(raised.value)


def test_use_tz_is_required():
    with override_settings(USE_TZ=False):
        message = only([m for m in run_checks() if m.id.startswith("flowwarden")])
    assert message.id == "flowwarden_django.E009"
    assert "USE_TZ" in message.msg


def test_missing_pymongo_is_a_warning_naming_the_extra(monkeypatch):
    from flowwarden_django import checks as fw_checks

    monkeypatch.setattr(fw_checks, "find_spec", lambda name: None)
    message = only(errors_for({"default": {"BACKEND": ORM}}))
    assert message.id == "flowwarden_django.W001"
    assert "flowwarden-django[mongo]" in message.hint


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"LEADER_LEASE_TTL": "soon"}, "flowwarden_django.E010"),
        ({"STATUS_INTERVAL": 0}, "flowwarden_django.E010"),
        ({"WORKFLOW_RECOVER_AFTER": "soon"}, "flowwarden_django.E010"),
        ({"WORKFLOW_RUN_LEASE": -5}, "flowwarden_django.E010"),
        ({"LEADER_LEASE_TTL": "10s", "LEADER_RENEW_INTERVAL": "6s"}, "flowwarden_django.E011"),
    ],
)
def test_lease_and_status_intervals_are_checked(settings, changes, code):
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, **changes}
    messages = [m for m in run_checks() if m.id in (code,)]
    assert len(messages) == 1 and list(changes)[-1] in messages[0].msg
