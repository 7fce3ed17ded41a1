"""Private PostgreSQL, Redis and RabbitMQ servers that a chaos test stops and restarts at will.

The shared servers on the standard ports (PostgreSQL 5432, Redis 6379, RabbitMQ
5672) serve the other tests, so a test that kills its database or broker runs
against a server of its own, in a temporary directory, on a free port of 127.0.0.1:

* :class:`PrivatePostgres` makes a PostgreSQL cluster with ``initdb`` in a temporary
  directory and serves it on a free port of 127.0.0.1 (trust auth, user
  ``postgres``). As root it runs ``initdb`` and ``postgres`` as the ``postgres`` OS
  user (both refuse to run as root); as anyone else it runs them directly.
  ``fsync=off`` and ``full_page_writes=off`` make it fast and lose nothing when the
  *server* dies (only an OS crash could); ``synchronous_commit`` stays on unless
  asked, because with it off an ``immediate`` or ``kill`` stop loses commits the
  server already acknowledged, and a chaos test would count those as events the
  code under test lost.
* :class:`PrivateRedis` runs ``redis-server`` in the foreground on a free port
  without persistence (``--save "" --appendonly no``: a restart loses the data, as
  in the incident of issue 17), or with ``appendonly=True`` (an AOF: a restart
  keeps it).
* :class:`PrivateRabbitMQ` runs a RabbitMQ node with its own node name, ports
  (AMQP, distribution, epmd), config, plugins, data and log; ~6 s to start.

All have ``start()``, ``stop(mode)``, ``restart(down_seconds)``, ``is_up()``,
``close()`` (stop, then remove the directory; also the context manager's exit), a
:meth:`~PrivateServer.down` context manager (stopped inside the block) and
:meth:`~PrivateServer.restart_in_background`, which restarts the server from a
thread while the test's load runs. Every stop-then-start is recorded in
``outages`` as ``(went_down, came_back)`` ``time.monotonic()`` stamps: *went_down*
just before the stop signal, *came_back* when the server first answered again. So
"seconds from the server's return to events flowing" is
``first_event_after - server.outages[-1][1]``.

Using the private PostgreSQL from Django
----------------------------------------
``override_settings(DATABASES=...)`` does not work (Django's connection handler
reads ``DATABASES`` once, and Django warns against overriding it). What works is
adding an alias to the handler's settings (normally the very ``settings.DATABASES``
dict, which the project's checks of aliases read), then letting ``connections[alias]``
create the connection on first use, in each thread::

    from tests.chaos.servers import (
        PrivatePostgres, add_database_alias, migrate, remove_database_alias,
    )
    from tests.testapp.models import Effect

    with PrivatePostgres() as pg:  # or the private_postgres fixture
        pg.create_database("chaos")
        add_database_alias("chaos", pg.django_settings("chaos"))
        try:
            migrate("chaos")  # the project's migrations on the private server
            Effect.objects.using("chaos").create(order_id=1)
            pg.restart_in_background(after=0.5, down=2.0)  # while the load runs
            ...  # the load, through .using("chaos") or a store configured with it
            pg.join_background()
        finally:
            remove_database_alias("chaos")

The fixtures of ``tests/chaos/conftest.py`` do this (``private_postgres_alias``), and
unblock pytest-django's database guard for the alias (a test needs no
``django_db`` mark for it; pytest-django's ``databases=[...]`` could not name an
alias added after the test databases were set up).

A Django connection does not notice a restart: the first query after it raises
``OperationalError`` (or ``InterfaceError``), and so does every query on that
connection until it is closed. ``close_old_connections()`` (what Django runs at the
start and end of each request, and what a long-running worker should run after a
database error) closes it, and the next query connects anew. ``CONN_MAX_AGE`` is 0
in :meth:`PrivatePostgres.django_settings`. Each thread has its own connection: a
load thread should run ``connections.close_all()`` before it ends, since
:func:`remove_database_alias` can only close the calling thread's.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Self

from tests.support.services import free_port, scratch_dir

HOST = "127.0.0.1"


class ServerUnavailable(RuntimeError):
    """The server's binaries (or its Python driver) are not installed here."""


class ServerStartError(RuntimeError):
    """The server did not start, or did not answer within the start timeout."""


def _base_tmp() -> Path:
    """Where server directories go (``tests.support.services.scratch_dir``)."""
    return Path(scratch_dir())


def _traversable_by_all(path: Path) -> bool:
    """Whether every directory from / to *path* lets other users through (o+x)."""
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment for a server: ours without libpq's PG* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(extra)
    return env


_LIVE: set[PrivateServer] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _close_leftovers() -> None:
    """Stop servers a test forgot to close, so no process outlives the test run.

    Only in the process that made them: a forked child exiting must not stop them.
    """
    with _LIVE_LOCK:
        leftovers = [server for server in _LIVE if server.owner_pid == os.getpid()]
    for server in leftovers:
        with contextlib.suppress(Exception):
            server.close()


class PrivateServer:
    """What the private servers share: the process, the directory, outages, restarts."""

    kind: ClassVar[str] = "server"
    default_stop_mode: ClassVar[str] = ""
    stop_modes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *, start_timeout: float = 30.0, stop_timeout: float = 30.0) -> None:
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix=f"fw-chaos-{self.kind}-", dir=_base_tmp()))
        self.log_path = self.directory / f"{self.kind}.log"
        #: ``(went_down, came_back)`` ``time.monotonic()`` stamps of each stop-then-start.
        self.outages: list[tuple[float, float]] = []
        #: Exceptions raised in :meth:`restart_in_background` threads.
        self.background_errors: list[BaseException] = []
        #: The ids of every server process started (each is its process group's id too).
        self.pids: list[int] = []
        self._down_since: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.RLock()
        self._closed = False
        self.owner_pid = os.getpid()
        with _LIVE_LOCK:
            _LIVE.add(self)

    # -- what a server kind provides -------------------------------------------------

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _popen_kwargs(self) -> dict[str, Any]:
        return {}

    def _answers(self, timeout: float) -> bool:
        """Whether the server answers a trivial request now."""
        raise NotImplementedError

    def _signal_for(self, mode: str) -> signal.Signals:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs."""
        return self._process.pid if self.is_running() else None

    def is_running(self) -> bool:
        """Whether the server process exists (it may not answer yet)."""
        return self._process is not None and self._process.poll() is None

    def is_up(self) -> bool:
        """Whether the server runs and answers."""
        return self.is_running() and self._answers(timeout=1.0)

    def start(self) -> None:
        """Start the server and wait (at most ``start_timeout`` s) until it answers."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self.is_running():
                return
            self._prepare()
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    self._command(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.directory,
                    start_new_session=True,
                    **self._popen_kwargs(),
                )
            self.pids.append(self._process.pid)
            deadline = time.monotonic() + self.start_timeout
            while not self._answers(timeout=1.0):
                if self._process.poll() is not None:
                    raise ServerStartError(
                        f"{self.kind} exited with {self._process.returncode} on start:\n"
                        + self.log_tail()
                    )
                if time.monotonic() > deadline:
                    self._kill_group()
                    raise ServerStartError(
                        f"{self.kind} did not answer within {self.start_timeout} s:\n"
                        + self.log_tail()
                    )
                time.sleep(0.02)
            if self._down_since is not None:
                self.outages.append((self._down_since, time.monotonic()))
                self._down_since = None

    def _prepare(self) -> None:
        """Make whatever the first start needs (a cluster, a directory)."""

    def stop(self, mode: str | None = None) -> None:
        """Stop the server; *mode* picks the signal (see the subclass). No-op when down."""
        mode = mode or self.default_stop_mode
        if mode not in self.stop_modes:
            raise ValueError(f"{self.kind} stop mode {mode!r} is not one of {self.stop_modes}")
        with self._lock:
            if not self.is_running():
                return
            assert self._process is not None
            if self._down_since is None:
                self._down_since = time.monotonic()
            if mode == "kill":
                self._kill_group()
                return
            self._process.send_signal(self._signal_for(mode))
            try:
                self._process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()

    def _kill_group(self) -> None:
        """SIGKILL the server and every process it forked (its process group)."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def restart(self, down_seconds: float = 0.0, mode: str | None = None) -> None:
        """Stop (with *mode*), stay down *down_seconds*, start again."""
        with self._lock:
            self.stop(mode)
            time.sleep(down_seconds)
            self.start()

    def restart_in_background(
        self, after: float = 0.0, down: float = 0.0, mode: str | None = None
    ) -> threading.Thread:
        """Restart from a thread: wait *after* s, stop, stay down *down* s, start.

        The thread is returned started; :meth:`join_background` waits for it and
        raises what it raised.
        """

        def run() -> None:
            try:
                time.sleep(after)
                self.restart(down, mode)
            except BaseException as exc:
                self.background_errors.append(exc)

        thread = threading.Thread(target=run, name=f"{self.kind}-restart", daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def join_background(self, timeout: float = 60.0) -> None:
        """Wait for the background restarts; raise the first error one of them hit."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise TimeoutError(f"{thread.name} still runs after {timeout} s")
            self._threads.remove(thread)
        if self.background_errors:
            raise self.background_errors[0]

    @contextlib.contextmanager
    def down(self, mode: str | None = None) -> Iterator[None]:
        """Stopped inside the block, started again when it ends (recording the outage)."""
        self.stop(mode)
        try:
            yield
        finally:
            self.start()

    @property
    def last_outage(self) -> tuple[float, float] | None:
        """The latest ``(went_down, came_back)``, or ``None`` before any restart."""
        return self.outages[-1] if self.outages else None

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        """Stop the server (hard if need be) and remove its directory. Idempotent."""
        with contextlib.suppress(TimeoutError):
            self.join_background(timeout=self.stop_timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.is_running():
                    try:
                        self.stop()
                    finally:
                        self._kill_group()
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)
                with _LIVE_LOCK:
                    _LIVE.discard(self)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self.is_running() else "stopped")
        return f"<{type(self).__name__} {HOST}:{self.port} {state} {self.directory}>"


# -- PostgreSQL ------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """Where ``initdb`` and ``postgres`` are: ``$FLOWWARDEN_TEST_PG_BINDIR``, PATH, or
    the newest ``/usr/lib/postgresql/<version>/bin``."""
    env = os.environ.get("FLOWWARDEN_TEST_PG_BINDIR")
    if env:
        candidates = [Path(env)]
    else:
        on_path = shutil.which("initdb")
        candidates = [Path(on_path).resolve().parent] if on_path else []
        versions = Path("/usr/lib/postgresql").glob("*/bin")
        candidates += sorted(
            versions,
            key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
            reverse=True,
        )
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    return None


def postgres_unavailable_reason() -> str | None:
    """``None`` when a :class:`PrivatePostgres` can run here, else why not (one line)."""
    if postgres_bindir() is None:
        return (
            "private PostgreSQL: no initdb/postgres binaries (apt-get install postgresql, "
            "or set FLOWWARDEN_TEST_PG_BINDIR)"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "private PostgreSQL: running as root and there is no 'postgres' OS user"
    try:
        __import__("psycopg")
    except ImportError:
        return "private PostgreSQL: the Python driver 'psycopg' is not installed"
    return None


class PrivatePostgres(PrivateServer):
    """A throwaway PostgreSQL cluster on ``127.0.0.1:<free port>``, user ``postgres``, trust.

    Stop modes: ``"fast"`` (SIGINT: clients are disconnected, a clean shutdown),
    ``"immediate"`` (SIGQUIT: no shutdown checkpoint, crash recovery on the next
    start, like a crash of the server) and ``"kill"`` (SIGKILL to the postmaster and
    every backend, like the OOM killer or a lost container).
    """

    kind = "postgres"
    default_stop_mode = "fast"
    stop_modes = ("fast", "immediate", "kill")
    _SIGNALS: ClassVar[dict[str, signal.Signals]] = {
        "fast": signal.SIGINT,
        "immediate": signal.SIGQUIT,
    }

    def __init__(
        self,
        *,
        shared_buffers: str = "16MB",
        max_connections: int = 100,
        synchronous_commit: bool = True,
        extra_config: dict[str, str] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 30.0,
    ) -> None:
        reason = postgres_unavailable_reason()
        if reason:
            raise ServerUnavailable(reason)
        self.bindir = postgres_bindir()
        self.config = {
            "listen_addresses": f"'{HOST}'",
            "max_connections": str(max_connections),
            "shared_buffers": f"'{shared_buffers}'",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "on" if synchronous_commit else "off",
            "wal_level": "minimal",
            "max_wal_senders": "0",
            "max_wal_size": "'256MB'",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
            "timezone": "'UTC'",
            **(extra_config or {}),
        }
        super().__init__(start_timeout=start_timeout, stop_timeout=stop_timeout)
        if os.geteuid() == 0 and not _traversable_by_all(self.directory.parent):
            # The postgres user must reach its directory: fall back to /tmp.
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = Path(tempfile.mkdtemp(prefix="fw-chaos-postgres-", dir="/tmp"))
            self.log_path = self.directory / "postgres.log"
        self.data_dir = self.directory / "data"
        self.user = "postgres"

    # Run as the postgres OS user when root (initdb and postgres refuse root).
    def _popen_kwargs(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {"env": _clean_env(LC_ALL="C")}
        entry = pwd.getpwnam("postgres")
        return {
            "user": entry.pw_uid,
            "group": entry.pw_gid,
            "extra_groups": [],
            "env": _clean_env(LC_ALL="C", HOME=str(self.directory), USER="postgres"),
        }

    def _prepare(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        done = subprocess.run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=self.directory,
            timeout=120,
            **self._popen_kwargs(),
        )
        if done.returncode != 0:
            raise ServerStartError(
                f"initdb failed ({done.returncode}):\n{done.stdout.decode()}{done.stderr.decode()}"
            )
        config = dict(self.config, port=str(self.port))
        # A unix socket path longer than 107 bytes cannot be bound: then TCP only.
        if len(str(self.directory)) < 80:
            config["unix_socket_directories"] = f"'{self.directory}'"
        else:
            config["unix_socket_directories"] = "''"
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write("\n# tests/chaos/servers.py\n")
            conf.writelines(f"{key} = {value}\n" for key, value in config.items())

    def _command(self) -> list[str]:
        return [str(self.bindir / "postgres"), "-D", str(self.data_dir)]

    def _signal_for(self, mode: str) -> signal.Signals:
        return self._SIGNALS[mode]

    def _answers(self, timeout: float) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=max(1, round(timeout))) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    # -- clients ---------------------------------------------------------------------

    def dsn_for(self, dbname: str) -> str:
        """A libpq connection string to database *dbname*."""
        return f"host={HOST} port={self.port} user={self.user} dbname={dbname}"

    @property
    def dsn(self) -> str:
        """A libpq connection string to the ``postgres`` database."""
        return self.dsn_for("postgres")

    def connect(self, dbname: str = "postgres", **kwargs: Any) -> Any:
        """A new ``psycopg.Connection`` (autocommit unless told otherwise)."""
        import psycopg

        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("connect_timeout", 5)
        return psycopg.connect(self.dsn_for(dbname), **kwargs)

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (UTF-8, from template0)."""
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8'").format(
                    sql.Identifier(name)
                )
            )

    def drop_database(self, name: str) -> None:
        """``DROP DATABASE IF EXISTS name WITH (FORCE)`` (its sessions are ended)."""
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def django_settings(self, name: str, **overrides: Any) -> dict[str, Any]:
        """A ``DATABASES`` entry for database *name* on this server."""
        entry: dict[str, Any] = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": HOST,
            "PORT": self.port,
            "USER": self.user,
            "PASSWORD": "",
            "NAME": name,
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": False,
            "OPTIONS": {"connect_timeout": 5},
            # The database is already a throwaway one: a test run uses it as it is.
            "TEST": {"NAME": name, "MIGRATE": True, "DEPENDENCIES": []},
        }
        entry.update(overrides)
        return entry


# -- Redis -----------------------------------------------------------------------------


def redis_server_binary() -> str | None:
    """``$FLOWWARDEN_TEST_REDIS_SERVER`` or ``redis-server`` on PATH."""
    env = os.environ.get("FLOWWARDEN_TEST_REDIS_SERVER")
    if env:
        return env if os.path.isfile(env) else None
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.isfile("/usr/bin/redis-server") else None
    )


def redis_unavailable_reason() -> str | None:
    """``None`` when a :class:`PrivateRedis` can run here, else why not (one line)."""
    if redis_server_binary() is None:
        return (
            "private Redis: no redis-server binary (apt-get install redis-server, "
            "or set FLOWWARDEN_TEST_REDIS_SERVER)"
        )
    try:
        __import__("redis")
    except ImportError:
        return "private Redis: the Python driver 'redis' is not installed"
    return None


class PrivateRedis(PrivateServer):
    """``redis-server`` in the foreground on ``127.0.0.1:<free port>``, in its own directory.

    Without persistence by default (a restart empties it); ``appendonly=True``
    keeps an AOF (``appendfsync`` as given), so a restart keeps the data. Stop
    modes: ``"term"`` (SIGTERM, a clean shutdown) and ``"kill"`` (SIGKILL).
    """

    kind = "redis"
    default_stop_mode = "term"
    stop_modes = ("term", "kill")

    def __init__(
        self,
        *,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        extra_args: list[str] | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 30.0,
    ) -> None:
        reason = redis_unavailable_reason()
        if reason:
            raise ServerUnavailable(reason)
        self.binary = redis_server_binary()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args or [])
        super().__init__(start_timeout=start_timeout, stop_timeout=stop_timeout)

    def _command(self) -> list[str]:
        assert self.binary is not None
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self.directory),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            "--logfile",
            "",
            *self.extra_args,
        ]

    def _signal_for(self, mode: str) -> signal.Signals:
        return signal.SIGTERM

    def _answers(self, timeout: float) -> bool:
        # A raw PING: while Redis loads its AOF it answers -LOADING, not +PONG.
        try:
            with socket.create_connection((HOST, self.port), timeout=timeout) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return self.url_for(0)

    def url_for(self, db: int) -> str:
        """The URL of database *db* on this server."""
        return f"redis://{HOST}:{self.port}/{db}"

    def client(self, db: int = 0, **kwargs: Any) -> Any:
        """A new ``redis.Redis`` on this server (2 s socket timeouts unless told)."""
        import redis

        kwargs.setdefault("socket_timeout", 2)
        kwargs.setdefault("socket_connect_timeout", 2)
        return redis.Redis.from_url(self.url_for(db), **kwargs)


# -- RabbitMQ --------------------------------------------------------------------------


def rabbitmq_server_script() -> str | None:
    """``$FLOWWARDEN_TEST_RABBITMQ_SERVER`` or ``/usr/lib/rabbitmq/bin/rabbitmq-server``.

    Not ``/usr/sbin/rabbitmq-server``: that wrapper switches to the ``rabbitmq`` user
    and the shared node's directories.
    """
    env = os.environ.get("FLOWWARDEN_TEST_RABBITMQ_SERVER")
    path = env or "/usr/lib/rabbitmq/bin/rabbitmq-server"
    return path if os.path.isfile(path) else None


def epmd_binary() -> str | None:
    """Erlang's port mapper daemon, which a RabbitMQ node starts if none answers."""
    found = shutil.which("epmd") or next(
        iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None
    )
    return str(found) if found else None


def rabbitmq_unavailable_reason() -> str | None:
    """``None`` when a :class:`PrivateRabbitMQ` can run here, else why not (one line)."""
    if rabbitmq_server_script() is None or epmd_binary() is None:
        return (
            "private RabbitMQ: no /usr/lib/rabbitmq/bin/rabbitmq-server or epmd "
            "(apt-get install rabbitmq-server, or set FLOWWARDEN_TEST_RABBITMQ_SERVER)"
        )
    try:
        __import__("amqp")
    except ImportError:
        return "private RabbitMQ: the Python driver 'amqp' (py-amqp) cannot be imported"
    return None


class PrivateRabbitMQ(PrivateServer):
    """A RabbitMQ node of its own: own node name, AMQP, distribution and epmd ports,
    own config, plugins (none), data (mnesia) and log; the shared node is untouched.

    It starts in ~6 s the first time and ~5 s on a restart (on 2 cores). Durable
    queues and persistent messages survive a restart (the data directory is kept);
    after a ``"kill"``, only the messages whose publish was confirmed (publisher
    confirms: ``connect(confirm_publish=True)``) are sure to be there, as with a real
    crash.
    Stop modes: ``"term"`` (SIGTERM, a clean shutdown, ~1 s) and ``"kill"`` (SIGKILL
    to the Erlang VM and its helpers). Its epmd (on a private port, so the node's
    name is registered nowhere the shared node looks) is stopped by :meth:`close`.
    User ``guest``/``guest``, vhost ``/``.
    """

    kind = "rabbitmq"
    default_stop_mode = "term"
    stop_modes = ("term", "kill")

    def __init__(self, *, start_timeout: float = 60.0, stop_timeout: float = 30.0) -> None:
        reason = rabbitmq_unavailable_reason()
        if reason:
            raise ServerUnavailable(reason)
        self.script = rabbitmq_server_script()
        self.epmd = epmd_binary()
        super().__init__(start_timeout=start_timeout, stop_timeout=stop_timeout)
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.nodename = f"fwchaos{self.port}@localhost"

    def _prepare(self) -> None:
        conf = self.directory / "rabbitmq.conf"
        if conf.exists():
            return
        conf.write_text(
            f"listeners.tcp.local = {HOST}:{self.port}\n"
            "loopback_users.guest = true\n"
            "log.console = true\n"
            "log.console.level = warning\n"
            "log.file = false\n"
        )
        (self.directory / "enabled_plugins").write_text("[].\n")
        (self.directory / "rabbitmq-env.conf").write_text("")

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RABBITMQ_", "ERL_")) and k != "NOTIFY_SOCKET"
        }
        d = self.directory
        env.update(
            HOME=str(d),  # the Erlang cookie goes to $HOME/.erlang.cookie
            LANG="C.UTF-8",
            LC_ALL="C.UTF-8",
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS=HOST,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_PID_FILE=str(d / "rabbitmq.pid"),
            RABBITMQ_LOGS="-",
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS=HOST,
        )
        return env

    def _popen_kwargs(self) -> dict[str, Any]:
        return {"env": self._env()}

    def _command(self) -> list[str]:
        assert self.script is not None
        return [self.script]

    def _signal_for(self, mode: str) -> signal.Signals:
        return signal.SIGTERM

    def _answers(self, timeout: float) -> bool:
        # The AMQP listener opens last in the boot; a Connection.Start frame
        # (frame type 1) answers the protocol header.
        try:
            with socket.create_connection((HOST, self.port), timeout=timeout) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                return sock.recv(8)[:1] == b"\x01"
        except OSError:
            return False

    def close(self) -> None:
        try:
            super().close()
        finally:
            # The node started its own epmd (daemonized, so not in the server's group).
            # epmd refuses -kill while a node is registered: retry until ours left it.
            deadline = time.monotonic() + 10
            while self.epmd and self.epmd_is_up() and time.monotonic() < deadline:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(
                        [self.epmd, "-port", str(self.epmd_port), "-kill"],
                        env=self._env(),
                        capture_output=True,
                        timeout=10,
                    )
                time.sleep(0.1)

    def epmd_is_up(self) -> bool:
        """Whether this node's private epmd answers."""
        try:
            with socket.create_connection((HOST, self.epmd_port), timeout=1):
                return True
        except OSError:
            return False

    @property
    def url(self) -> str:
        """``amqp://guest:guest@127.0.0.1:<port>//`` (kombu/Celery broker URL)."""
        return f"amqp://guest:guest@{HOST}:{self.port}//"

    def connect(self, **kwargs: Any) -> Any:
        """A new connected ``amqp.Connection`` (py-amqp, what kombu uses)."""
        import amqp

        kwargs.setdefault("connect_timeout", 5)
        conn = amqp.Connection(f"{HOST}:{self.port}", userid="guest", password="guest", **kwargs)
        conn.connect()
        return conn


# -- Django ----------------------------------------------------------------------------


def add_database_alias(alias: str, settings_dict: dict[str, Any]) -> dict[str, Any]:
    """Make *alias* a database of the running Django, as if it were in ``DATABASES``.

    The entry gets Django's defaults (as ``ConnectionHandler.configure_settings``
    gives them), goes into ``connections.settings`` and ``settings.DATABASES`` (one
    dict unless something replaced one of them), and ``connections[alias]`` creates
    the connection on first use, in each thread. Returns the entry.
    """
    from django.conf import settings
    from django.db import DEFAULT_DB_ALIAS, connections

    if alias in connections.settings:
        raise ValueError(f"database alias {alias!r} already exists")
    entry = copy.deepcopy(settings_dict)
    connections.configure_settings(
        {DEFAULT_DB_ALIAS: dict(connections.settings[DEFAULT_DB_ALIAS]), alias: entry}
    )
    connections.settings[alias] = entry
    if settings.DATABASES is not connections.settings:
        settings.DATABASES[alias] = entry
    return entry


def remove_database_alias(alias: str) -> None:
    """Close this thread's connection of *alias* and forget the alias.

    Other threads' connections of it are theirs to close (``connections.close_all()``
    before a thread ends).
    """
    from django.conf import settings
    from django.db import DatabaseError, connections

    for conn in connections.all(initialized_only=True):
        if conn.alias == alias:
            with contextlib.suppress(DatabaseError):
                conn.close()
            del connections[alias]
    connections.settings.pop(alias, None)
    settings.DATABASES.pop(alias, None)


def migrate(alias: str, app_label: str | None = None, *, verbosity: int = 0) -> None:
    """Run ``manage.py migrate [app_label] --database alias`` (non-interactive)."""
    from django.core.management import call_command

    args = [app_label] if app_label else []
    call_command("migrate", *args, database=alias, interactive=False, verbosity=verbosity)
