"""The private servers of the chaos tests: start, restart under load, outages, cleanup."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connections

from tests.chaos.conftest import require
from tests.chaos.servers import (
    PrivatePostgres,
    PrivateRabbitMQ,
    PrivateRedis,
    PrivateServer,
    postgres_unavailable_reason,
    rabbitmq_unavailable_reason,
    redis_unavailable_reason,
)
from tests.support.polling import wait_until
from tests.testapp.models import Effect

pytestmark = pytest.mark.chaos


def _group_gone(pgid: int) -> bool:
    """Whether no process is left in process group *pgid*."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


class RetryingWriter(threading.Thread):
    """Writes 1, 2, 3, ... until stopped, reconnecting after each error.

    ``acked`` holds the values whose write returned; a write that raised may or may
    not have landed (the connection broke before its answer), so it is retried
    under a new value.
    """

    def __init__(self, write, connect) -> None:
        super().__init__(daemon=True)
        self._write, self._connect = write, connect
        self.acked: list[int] = []
        self.errors = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        value, client = 0, None
        while not self.stopping.is_set():
            try:
                if client is None:
                    client = self._connect()
                value += 1
                self._write(client, value)
                self.acked.append(value)
            except Exception:
                self.errors += 1
                client = None
                time.sleep(0.02)
        if client is not None and hasattr(client, "close"):
            client.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


# -- PostgreSQL ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate", "kill"])
def test_postgres_keeps_acknowledged_rows_across_a_restart(
    private_postgres: PrivatePostgres, mode: str
) -> None:
    pg = private_postgres
    table = f"writes_{mode}"
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (n integer PRIMARY KEY)")

    writer = RetryingWriter(
        write=lambda conn, n: conn.execute(f"INSERT INTO {table} VALUES (%s)", (n,)),
        connect=lambda: pg.connect(connect_timeout=2),
    )
    writer.start()
    wait_until(lambda: writer.acked, "a first acknowledged write")
    before = len(writer.acked)
    pg.restart_in_background(after=0.1, down=0.5, mode=mode).join(30)
    restarted = len(writer.acked)
    wait_until(lambda: len(writer.acked) > restarted, "a write after the restart")
    writer.stop()
    pg.join_background()

    assert len(pg.outages) == 1
    went_down, came_back = pg.outages[0]
    assert came_back - went_down >= 0.5
    assert before > 0
    assert writer.errors > 0, "the writer never saw the server go"
    assert writer.acked[-1] > before, "no write after the restart"
    with pg.connect() as conn:
        stored = {n for (n,) in conn.execute(f"SELECT n FROM {table}")}
    assert set(writer.acked) <= stored


def test_postgres_down_block_refuses_connections(private_postgres: PrivatePostgres) -> None:
    import psycopg

    pg = private_postgres
    assert pg.is_up()
    with pg.down(mode="immediate"):
        assert not pg.is_up()
        with pytest.raises(psycopg.OperationalError):
            pg.connect(connect_timeout=1)
    assert pg.is_up()
    assert len(pg.outages) == 1


def test_postgres_settings(private_postgres: PrivatePostgres) -> None:
    with private_postgres.connect() as conn:
        shown = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("fsync", "full_page_writes", "synchronous_commit", "max_connections")
        }
        user = conn.execute("SELECT current_user").fetchone()[0]
    assert shown == {
        "fsync": "off",
        "full_page_writes": "off",
        "synchronous_commit": "on",
        "max_connections": "100",
    }
    assert user == "postgres"
    assert private_postgres.django_settings("x")["PORT"] == private_postgres.port


def test_django_alias_across_a_restart(
    private_postgres: PrivatePostgres, private_postgres_alias: str
) -> None:
    alias = private_postgres_alias
    # The project validates aliases against settings.DATABASES: the alias is there.
    assert settings.DATABASES[alias]["PORT"] == private_postgres.port
    Effect.objects.using(alias).create(order_id=17, stream="chaos")

    private_postgres.restart(down_seconds=0.2)

    # The connection Django holds died with the server: the next query fails...
    with pytest.raises((OperationalError, InterfaceError)):
        Effect.objects.using(alias).filter(stream="chaos").count()
    # ... and so does every query on it, until it is closed.
    with pytest.raises((OperationalError, InterfaceError)):
        Effect.objects.using(alias).filter(stream="chaos").count()
    close_old_connections()
    assert Effect.objects.using(alias).filter(stream="chaos", order_id=17).count() == 1
    assert connections[alias].settings_dict["HOST"] == "127.0.0.1"


# -- Redis -----------------------------------------------------------------------------


def test_redis_restart_under_a_retrying_client(private_redis: PrivateRedis) -> None:
    r = private_redis
    writer = RetryingWriter(
        write=lambda client, n: client.set("last", n),
        connect=lambda: r.client(socket_timeout=1, retry_on_timeout=False),
    )
    writer.start()
    wait_until(lambda: writer.acked, "a first acknowledged write")
    r.restart_in_background(after=0.1, down=0.3).join(30)
    restarted = len(writer.acked)
    # The restarted server lost "last" (no persistence): it holds a value again once
    # the writer wrote after the restart.
    wait_until(lambda: len(writer.acked) > restarted, "a write after the restart")
    writer.stop()
    r.join_background()

    went_down, came_back = r.outages[0]
    assert came_back - went_down >= 0.3
    assert writer.errors > 0
    client = r.client()
    assert int(client.get("last")) == writer.acked[-1]
    client.close()


@pytest.mark.parametrize(
    ("appendonly", "mode", "kept"),
    [(False, "term", False), (False, "kill", False), (True, "term", True), (True, "kill", True)],
)
def test_redis_data_across_a_restart(appendonly: bool, mode: str, kept: bool) -> None:
    require(redis_unavailable_reason())
    # appendfsync=always: the AOF is written before the reply, whatever a fsync is doing.
    with PrivateRedis(appendonly=appendonly, appendfsync="always") as r:
        client = r.client()
        client.set("key", "value")
        r.restart(mode=mode)
        assert r.is_up()
        assert (client.get("key") == b"value") is kept
        client.close()


# -- RabbitMQ --------------------------------------------------------------------------


def test_rabbitmq_keeps_durable_messages_across_a_restart() -> None:
    import amqp

    require(rabbitmq_unavailable_reason())
    shared_before = _answers_tcp(5672)
    with PrivateRabbitMQ() as rmq:
        assert rmq.port != 5672
        # Only a confirmed message is safe from a crash: basic_publish waits for its ack.
        conn = rmq.connect(confirm_publish=True)
        channel = conn.channel()
        channel.queue_declare("durable", durable=True, auto_delete=False)
        channel.queue_declare("transient", durable=False, auto_delete=False)
        channel.basic_publish(amqp.Message("kept", delivery_mode=2), routing_key="durable")
        channel.basic_publish(amqp.Message("lost"), routing_key="transient")
        conn.close()

        # A graceful restart: a queue declared a moment before a SIGKILL may not have
        # reached the node's metadata store on disk yet (it did not, once, in CI).
        rmq.restart(mode="term")

        assert len(rmq.outages) == 1
        conn = rmq.connect()
        channel = conn.channel()
        assert channel.basic_get("durable", no_ack=True).body == "kept"
        with pytest.raises(amqp.exceptions.NotFound):
            channel.queue_declare("transient", passive=True)
        conn.close()
        assert rmq.epmd_is_up()
    # Nothing left: no node, no private epmd, no directory; the shared node untouched.
    assert all(_group_gone(pid) for pid in rmq.pids)
    assert not rmq.epmd_is_up()
    assert not rmq.directory.exists()
    assert _answers_tcp(5672) == shared_before


def _answers_tcp(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


# -- cleanup ---------------------------------------------------------------------------


def test_close_leaves_no_process_and_no_directory() -> None:
    require(postgres_unavailable_reason())
    require(redis_unavailable_reason())
    servers: list[PrivateServer] = [PrivatePostgres(), PrivateRedis(appendonly=True)]
    for server in servers:
        server.start()
        with pytest.raises(ValueError, match="stop mode"):
            server.stop("gently")
        assert server.directory.is_dir()
    servers[0].restart_in_background(down=0.2)  # close() waits for it
    for server in servers:
        server.close()
        server.close()  # idempotent
        assert not server.directory.exists()
        assert server.pids
        assert all(_group_gone(pid) for pid in server.pids)
        assert not server.is_running()
        with pytest.raises(RuntimeError, match="closed"):
            server.start()
