"""MongoDB clients within the bound on silent partitions (issue 51): the clients of
``MONGO_CLIENTS`` (sync and async) and those the Mongo backends make from a URL get
socket, connect and server-selection timeouts and a heartbeat derived from
``DEAD_CONNECTION_TIMEOUT``, unless the URL or the options set them; the socket
timeout leaves a change stream's ``getMore`` its ``maxAwaitTimeMS``."""

from __future__ import annotations

import pytest
from django.test import override_settings

from flowwarden_django.common.network import mongo_options, with_mongo_timeouts
from flowwarden_django.streams.backends.mongo import MongoCheckpointStore
from flowwarden_django.streams.clients import MongoClientHandler, client_settings

pytest.importorskip("pymongo")

URL = "mongodb://127.0.0.1:1/?directConnection=true"


def test_the_options_follow_the_bound():
    assert mongo_options(30) == {
        "socketTimeoutMS": 27000,
        "connectTimeoutMS": 10000,
        "serverSelectionTimeoutMS": 10000,
        "heartbeatFrequencyMS": 10000,
    }
    short = mongo_options(3)
    assert short["socketTimeoutMS"] == 2700
    assert short["heartbeatFrequencyMS"] == short["connectTimeoutMS"] == 1000
    assert short["serverSelectionTimeoutMS"] == 1000
    assert mongo_options(90)["heartbeatFrequencyMS"] == 10000  # pymongo's default at most


def test_the_socket_timeout_outlasts_a_getmore_s_await():
    assert mongo_options(30, max_await_ms=1000)["socketTimeoutMS"] == 27000
    assert mongo_options(3, max_await_ms=2500)["socketTimeoutMS"] == 3500


def test_what_the_url_or_the_options_set_wins_case_insensitively():
    given = with_mongo_timeouts(
        "mongodb://h:1/?sockettimeoutms=5000&replicaSet=rs0",
        {"ServerSelectionTimeoutMS": 7000},
        bound=30,
    )
    assert given == {
        "connectTimeoutMS": 10000,
        "heartbeatFrequencyMS": 10000,
        "ServerSelectionTimeoutMS": 7000,
    }
    # A client-side operation timeout owns the socket timeout.
    assert "socketTimeoutMS" not in with_mongo_timeouts(URL, {"timeoutMS": 5000}, bound=30)


def test_mongo_clients_get_them_from_the_settings():
    flowwarden = {
        "DEAD_CONNECTION_TIMEOUT": "12s",
        "STREAM_MAX_AWAIT_MS": 200,
        "MONGO_CLIENTS": {"default": {"URL": URL, "OPTIONS": {"connectTimeoutMS": 3000}}},
    }
    with override_settings(FLOWWARDEN=flowwarden):
        url, options = client_settings("default")
        assert url == URL
        assert options == {
            "socketTimeoutMS": 10800,
            "serverSelectionTimeoutMS": 4000,
            "heartbeatFrequencyMS": 4000,
            "connectTimeoutMS": 3000,
        }
        handler = MongoClientHandler()
        try:
            client_options = handler["default"].options
            assert client_options.pool_options.socket_timeout == 10.8
            assert client_options.server_selection_timeout == 4
            assert client_options.heartbeat_frequency == 4
        finally:
            handler.reset()


def test_a_backend_made_from_a_url_gets_them_too():
    with override_settings(FLOWWARDEN={"DEAD_CONNECTION_TIMEOUT": "6s"}):
        store = MongoCheckpointStore(url=URL, client_options={"appname": "x"})
        assert store.timeout_options() == {
            "socketTimeoutMS": 5400,
            "connectTimeoutMS": 2000,
            "serverSelectionTimeoutMS": 2000,
            "heartbeatFrequencyMS": 2000,
            "appname": "x",
        }
