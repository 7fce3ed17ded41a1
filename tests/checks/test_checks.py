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
        return [m for m in run_checks(databases=[]) if m.id.startswith("flowwarden_django.")]


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
        assert only(
            [m for m in run_checks(databases=[]) if m.id.startswith("flowwarden")]
        ).id.endswith("E001")
    message = only(errors_for(["nope"]))
    assert message.id == "flowwarden_django.E001"


def test_manage_py_check_fails_with_the_setting_name():
    broken = {"CHECKPOINT_STORES": {"default": {"BACKEND": "x.Y"}}}
    with override_settings(FLOWWARDEN=broken), pytest.raises(SystemCheckError) as raised:
        call_command("check", databases=[])
    assert 'FLOWWARDEN["CHECKPOINT_STORES"]["default"]["BACKEND"]' in str(raised.value)


def test_use_tz_is_required():
    with override_settings(USE_TZ=False):
        message = only([m for m in run_checks(databases=[]) if m.id.startswith("flowwarden")])
    assert message.id == "flowwarden_django.E009"
    assert "USE_TZ" in message.msg


def test_missing_pymongo_is_a_warning_naming_the_extra(monkeypatch):
    from flowwarden_django.checks import streams as stream_checks

    monkeypatch.setattr(stream_checks, "find_spec", lambda name: None)
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
    messages = [m for m in run_checks(databases=[]) if m.id in (code,)]
    assert len(messages) == 1 and list(changes)[-1] in messages[0].msg


#: A bad value for every documented FLOWWARDEN key (``conf.DEFAULTS``).
BAD_VALUES = {
    "CHECKPOINT_STORES": 5,
    "MONGO_CLIENTS": ["mongodb://x"],
    "STREAM_MAX_AWAIT_MS": "200 millis",
    "STREAM_RUNNER": "trio",
    "DLQ_STORES": [],
    "LOCK_SERVICES": "redis",
    "LEADER_LEASE_TTL": "soon",
    "LEADER_RENEW_INTERVAL": 0,
    "STANDBY_POLL_INTERVAL": "20 seconds",
    "STATUS_INTERVAL": float("inf"),
    "INSTANCE_ID": 5,
    "CELERY_RUN_STREAMS": "yes",
    "SNAPSHOT_STORES": None,
    "WORKFLOW_EXECUTION": "nope",
    "TEMPORAL": {"TARGET": "no port"},
    "WORKFLOW_RUN_LEASE": "10 minutes",
    "WORKFLOW_RECOVER_AFTER": -1,
    "WORKFLOW_SWEEP_INTERVAL": "0s",
    "WORKFLOW_QUEUES": ["carrier-api"],
    "WORKFLOW_QUEUE_STALE_AFTER": "a while",
    "CELERY_RUN_WORKFLOW_SWEEP": "yes",
    "WORKFLOW_FALLBACK_TO_INPROCESS": "no",
    "API_AUTHENTICATION": "rest_framework.authentication.BasicAuthentication",
    "API_PASSWORD_THROTTLE": {"ip": "lots"},
    "HEALTH_DETAILS": 5,
    "METRICS_TOKEN": 5,
    "APPROVAL_EMAILS": {"BASE_URL": "ftp://nope"},
    "DEAD_CONNECTION_TIMEOUT": "1s",
    "STREAM_EVENT_TIMEOUT": "0s",
    "CELERY_VISIBILITY_TIMEOUT": "1s",
}


def test_every_documented_key_has_a_bad_value_here():
    from flowwarden_django.conf import DEFAULTS

    assert set(BAD_VALUES) == set(DEFAULTS)


@pytest.mark.parametrize(("key", "value"), sorted(BAD_VALUES.items()), ids=sorted(BAD_VALUES))
def test_a_bad_value_of_every_key_is_an_error_naming_the_key(settings, key, value):
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, key: value}
    errors = [m for m in run_checks(databases=[]) if m.is_serious()]
    assert any(key in m.msg for m in errors), [m.msg for m in errors]
    assert all(m.hint for m in errors if key in m.msg)


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("CHEKPOINT_STORES", "CHECKPOINT_STORES"),
        ("CHECKPOINT_STORE", "CHECKPOINT_STORES"),
        ("STREAM_MAX_AWAIT_MSEC", "STREAM_MAX_AWAIT_MS"),
        ("WORKFLOW_RUN_LEASES", "WORKFLOW_RUN_LEASE"),
        ("health_details", "HEALTH_DETAILS"),
    ],
)
def test_a_near_miss_of_a_known_key_is_an_error(settings, key, suggestion):
    """A typo would let the default apply in silence: it fails the check."""
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, key: {}}
    (error,) = [m for m in run_checks(databases=[]) if m.id == "flowwarden_django.E013"]
    assert repr(key) in error.msg and error.is_serious()
    assert f"the default of {suggestion!r} applies" in error.msg
    assert error.hint == f'Did you mean "{suggestion}"? Rename the key.'


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("SNAPSHOTS", "SNAPSHOT_STORES"), ("MY_OWN_THING", None)],
)
def test_another_unknown_key_is_a_warning(settings, key, suggestion):
    settings.FLOWWARDEN = {**settings.FLOWWARDEN, key: {}}
    (warning,) = [m for m in run_checks(databases=[]) if m.id == "flowwarden_django.W002"]
    assert repr(key) in warning.msg and not warning.is_serious()
    if suggestion:
        assert warning.hint == f'Did you mean "{suggestion}"?'
    else:
        assert "The settings are: API_AUTHENTICATION" in warning.hint


def test_stream_max_await_accepts_milliseconds_and_durations(settings):
    from flowwarden_django.streams.clients import max_await_ms

    assert (max_await_ms(200), max_await_ms("200ms"), max_await_ms("1s")) == (200, 200, 1000)
    for good in (200, "200ms", "1.5s"):
        settings.FLOWWARDEN = {**settings.FLOWWARDEN, "STREAM_MAX_AWAIT_MS": good}
        assert not [m for m in run_checks(databases=[]) if "STREAM_MAX_AWAIT_MS" in m.msg]


def test_the_mariadb_lane_says_what_to_install():
    from tests.support.services import missing_driver_reason

    reason = missing_driver_reason("mariadb", "MySQLdb")
    assert "apt-get install libmariadb-dev pkg-config" in reason and "make test" in reason
