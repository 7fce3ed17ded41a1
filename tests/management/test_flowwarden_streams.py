"""``manage.py flowwarden_streams run`` when MongoDB does not answer: a message that
names the server and the fix, no traceback, and ``--burst`` gives up."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from flowwarden_django.management.commands.flowwarden_streams import unreachable_message
from flowwarden_django.streams.clients import client_hosts, probe
from flowwarden_django.streams.registry import register_stream, stream_registry

# tests/settings.py points client "default" at mongodb://127.0.0.1:1/?replicaSet=rs0.


@pytest.fixture
def declared():
    register_stream("cmd-unreachable", "orders", on_insert=lambda doc: None)
    yield
    stream_registry.unregister("cmd-unreachable")


def test_the_probe_says_where_and_why() -> None:
    assert client_hosts("default") == "127.0.0.1:1"
    reason = probe("default", timeout=0.5)
    assert reason is not None and reason.startswith("ServerSelectionTimeoutError: ")
    assert len(reason) < 250 and "Topology" not in reason
    assert probe("nope") == "no MongoDB client 'nope' in FLOWWARDEN['MONGO_CLIENTS']"


@pytest.mark.django_db
@pytest.mark.subprocess
def test_burst_against_an_unreachable_mongodb_gives_up_with_the_fix(
    declared, capsys, monkeypatch
) -> None:
    from flowwarden_django.management.commands import flowwarden_streams as command

    probes = []

    def recording_probe(alias, *, timeout):
        probes.append(timeout)
        return probe(alias, timeout=timeout)

    monkeypatch.setattr(command, "probe", recording_probe)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command(
            "flowwarden_streams",
            "run",
            "--burst",
            "--timeout",
            "2",
            "--stream",
            "cmd-unreachable",
            stdout=out,
            stderr=err,
        )
    # One probe bounded by --timeout, then the command gives up (no retry loop).
    assert probes == [2.0]
    message = str(caught.value)
    assert message.startswith("MongoDB at 127.0.0.1:1 (client 'default') is unreachable: ")
    assert "FLOWWARDEN_MONGO_URL" in message and "manage.py demo" in message
    assert "Traceback" not in out.getvalue() + err.getvalue() + capsys.readouterr().err


def test_the_message_never_shows_credentials(settings) -> None:
    settings.FLOWWARDEN = {
        **settings.FLOWWARDEN,
        "MONGO_CLIENTS": {"default": {"URL": "mongodb://app:s3cret@db.example:27017/"}},
    }
    text = unreachable_message("default", "ServerSelectionTimeoutError: refused")
    assert "db.example:27017" in text and "s3cret" not in text and "app:" not in text


def test_timeout_is_a_positive_duration() -> None:
    for bad in ("0", "-3", "soon"):
        with pytest.raises(CommandError, match="--timeout"):
            call_command("flowwarden_streams", "run", "--burst", "--timeout", bad)
