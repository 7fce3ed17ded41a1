"""A misconfigured FLOWWARDEN["SNAPSHOT_STORES"] fails `manage.py check` naming the setting."""

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from flowwarden_django.workflows.backends import _orm_checks
from flowwarden_django.workflows.storage.encryption import generate_key

ORM = "flowwarden_django.workflows.backends.orm.OrmSnapshotStore"
MEMORY = "flowwarden_django.workflows.backends.memory.InMemorySnapshotStore"
SERIALIZER = "flowwarden_django.workflows.serializers.JsonStateSerializer"


def snapshot_messages(stores, deploy=False):
    """The check messages about ``SNAPSHOT_STORES`` for the configuration *stores*."""
    with override_settings(FLOWWARDEN={"SNAPSHOT_STORES": stores}):
        messages = run_checks(databases=[], include_deployment_checks=deploy)
    return [
        m for m in messages if m.id.startswith("flowwarden_django.") and "SNAPSHOT_STORES" in m.msg
    ]


def only(messages):
    assert len(messages) == 1, messages
    return messages[0]


@pytest.mark.parametrize(
    "config",
    [
        {"BACKEND": ORM},
        {"BACKEND": ORM, "OPTIONS": {"using": "other"}},
        {"BACKEND": ORM, "OPTIONS": {"serializer": SERIALIZER}},
        {"BACKEND": ORM, "OPTIONS": {"encryption_keys": [generate_key(), generate_key()]}},
        {"BACKEND": ORM, "OPTIONS": {"encryption_keys": generate_key()}},
        {"BACKEND": MEMORY},
        {"BACKEND": MEMORY, "OPTIONS": {"max_snapshots": 5, "serializer": SERIALIZER}},
    ],
    ids=["orm", "orm-using", "orm-serializer", "orm-keys", "orm-one-key", "memory", "memory-opts"],
)
def test_valid_configurations_are_clean(config):
    assert snapshot_messages({"default": config}) == []


def test_the_default_setting_is_clean():
    with override_settings(FLOWWARDEN={}):
        assert [m for m in run_checks(databases=[]) if "SNAPSHOT_STORES" in m.msg] == []


@pytest.mark.parametrize(
    ("config", "code", "words"),
    [
        (
            {"BACKEND": "no.such.Store"},
            "E002",
            ['SNAPSHOT_STORES"]["default"]["BACKEND"]', "no.such.Store", "cannot be imported"],
        ),
        ({}, "E002", ['["BACKEND"] is missing']),
        (
            {"BACKEND": "flowwarden_django.streams.backends.orm.OrmCheckpointStore"},
            "E003",
            ["not a SnapshotStore subclass"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"databse": "x"}},
            "E004",
            ['["OPTIONS"] does not fit OrmSnapshotStore', "databse"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"using": "nope"}},
            "E006",
            ['FLOWWARDEN["SNAPSHOT_STORES"]["default"]["OPTIONS"]["using"] = \'nope\'', "not a"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"serializer": "no.such.Serializer"}},
            "E008",
            ['["OPTIONS"]["serializer"] = \'no.such.Serializer\' cannot be imported'],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"serializer": "json.dumps"}},
            "E008",
            ["is not a StateSerializer"],
        ),
        (
            {"BACKEND": ORM, "OPTIONS": {"encryption_keys": []}},
            "E008",
            ['["OPTIONS"]["encryption_keys"] must be a key or a non-empty list'],
        ),
        (
            {"BACKEND": MEMORY, "OPTIONS": {"max_snapshots": 0}},
            "E008",
            ['["OPTIONS"]["max_snapshots"] = 0 is not a positive integer'],
        ),
        (
            {"BACKEND": MEMORY, "OPTIONS": {"serializer": "no.such.Serializer"}},
            "E008",
            ['["serializer"]', "cannot be imported"],
        ),
    ],
    ids=[
        "unimportable",
        "no-backend",
        "wrong-spi",
        "bad-option",
        "unknown-db",
        "bad-serializer",
        "not-a-serializer",
        "empty-keys",
        "memory-cap",
        "memory-serializer",
    ],
)
def test_errors_name_the_setting(config, code, words):
    message = only(snapshot_messages({"default": config}))
    assert message.id == f"flowwarden_django.{code}"
    for word in words:
        assert word in message.msg


def test_a_bad_key_is_reported_by_position_and_never_echoed():
    secret = "dG9vLXNob3J0"  # base64 of "too-short"
    message = only(
        snapshot_messages(
            {"default": {"BACKEND": ORM, "OPTIONS": {"encryption_keys": [generate_key(), secret]}}}
        )
    )
    assert message.id == "flowwarden_django.E008"
    assert '["encryption_keys"][1] is 9 bytes long' in message.msg
    assert secret not in message.msg and secret not in (message.hint or "")


def test_keys_without_cryptography_name_the_extra(monkeypatch):
    monkeypatch.setattr(_orm_checks, "find_spec", lambda name: None)
    message = only(
        snapshot_messages(
            {"default": {"BACKEND": ORM, "OPTIONS": {"encryption_keys": generate_key()}}}
        )
    )
    assert message.id == "flowwarden_django.E005"
    assert message.hint == 'pip install "flowwarden-django[crypto]"'


def test_snapshot_stores_must_be_a_dict():
    message = only(snapshot_messages(["not", "a", "dict"]))
    assert message.id == "flowwarden_django.E001"
    assert '"BACKEND": "flowwarden_django.workflows.backends.orm.OrmSnapshotStore"}' in message.hint


def test_plaintext_is_a_deploy_warning_only():
    plain = {"default": {"BACKEND": ORM}, "memory": {"BACKEND": MEMORY}}
    assert snapshot_messages(plain) == []
    warning = only(snapshot_messages(plain, deploy=True))
    assert warning.id == "flowwarden_django.W201"
    assert 'FLOWWARDEN["SNAPSHOT_STORES"]["default"] stores workflow state' in warning.msg
    sealed = {"default": {"BACKEND": ORM, "OPTIONS": {"encryption_keys": generate_key()}}}
    assert snapshot_messages(sealed, deploy=True) == []
