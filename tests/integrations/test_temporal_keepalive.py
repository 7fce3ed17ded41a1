"""The Temporal client's gRPC keepalive (issue 51): every client the package opens
pings the server within ``FLOWWARDEN["DEAD_CONNECTION_TIMEOUT"]``, never more often
than Temporal's server accepts. No server needed: ``Client.connect`` is replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("temporalio")

from django.test import override_settings
from temporalio.client import Client, KeepAliveConfig

from flowwarden_django.common.network import GRPC_MIN_PING_INTERVAL, GrpcKeepalive, grpc_keepalive
from flowwarden_django.integrations.temporal import connection as temporal_connection
from flowwarden_django.integrations.temporal import worker as temporal_worker
from flowwarden_django.integrations.temporal.config import TemporalConfig


@pytest.mark.parametrize(
    ("bound", "interval_ms", "timeout_ms"),
    [(30, 15_000, 15_000), (60, 30_000, 30_000), (24, 12_000, 12_000), (12, 10_000, 2_000)],
)
def test_the_ping_interval_and_its_timeout_add_up_to_the_bound(bound, interval_ms, timeout_ms):
    assert GrpcKeepalive.within(bound) == GrpcKeepalive(interval_ms, timeout_ms)


def test_a_short_bound_keeps_the_least_interval_the_server_accepts():
    timings = GrpcKeepalive.within(3)
    assert timings.interval_ms == GRPC_MIN_PING_INTERVAL * 1000
    assert timings.timeout_ms == 1_000


def test_the_timings_follow_the_setting():
    with override_settings(FLOWWARDEN={"DEAD_CONNECTION_TIMEOUT": "1m"}):
        assert grpc_keepalive() == GrpcKeepalive(30_000, 30_000)
        assert temporal_connection.keep_alive_config() == KeepAliveConfig(30_000, 30_000)
    assert temporal_connection.keep_alive_config() == KeepAliveConfig(15_000, 15_000)


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The keyword arguments of every ``Client.connect`` (which returns a stand-in)."""
    calls: list[dict[str, Any]] = []

    async def connect(target: str, **options: Any) -> object:
        calls.append({"target": target, **options})
        return object()

    monkeypatch.setattr(Client, "connect", connect)
    return calls


def test_the_connection_of_django_code_opens_its_client_with_keepalives(connects):
    config = TemporalConfig(target="temporal.example:7233", namespace="ns")
    conn = temporal_connection.TemporalConnection(config)
    try:
        conn.call(lambda client: asyncio.sleep(0, client), 10)
    finally:
        conn.close()
    (call,) = connects
    assert call["target"] == "temporal.example:7233"
    assert call["namespace"] == "ns"
    assert call["keep_alive_config"] == KeepAliveConfig(15_000, 15_000)


def test_the_worker_opens_its_client_with_keepalives(connects):
    config = TemporalConfig(target="temporal.example:7233")
    with override_settings(FLOWWARDEN={"DEAD_CONNECTION_TIMEOUT": "40s"}):
        client = asyncio.run(temporal_worker.connect(config))
    assert client is not None
    (call,) = connects
    assert call["keep_alive_config"] == KeepAliveConfig(20_000, 20_000)
