"""A network namespace of a test's own, joined to the host by a veth pair, whose link
the test cuts and heals: a silent partition (no RST, no FIN) for what runs inside.

::

    with NetworkNamespace.create() as ns:            # 10.231.X.{1,2}/30
        db = ns.forward(5432)                         # socat: ns.host_address:port -> loopback
        proc = subprocess.Popen(ns.command([python, "-m", ...]), env=...)  # inside
        ns.cut()                                      # host end down: packets vanish
        ns.heal()                                     # host end up again

* The namespace is joined to the host by a veth pair: the host end has
  ``host_address`` (``10.231.X.1``), the namespace end ``inside_address``
  (``.2``), in a /30 of ``10.231.0.0/16`` that no interface of the host uses. Each
  ``FLOWWARDEN_TEST_LANE`` has its own block of 256 /30s and a lock file serializes
  the choice, so pytest-xdist workers and CI lanes never collide.
* A process inside reaches a loopback server through :meth:`forward`: a ``socat``
  listening on ``host_address`` and connecting to ``127.0.0.1``. Cutting the link
  leaves both sockets of a connection open: the client inside sees silence, the
  state a dropped switch port or a NAT table that forgot the flow leaves behind.
* :meth:`cut` sets the host end down; :meth:`heal` sets it up. Both record
  ``time.monotonic()`` stamps (``cut_at``, ``healed_at``).
* :meth:`close` stops the forwarders and deletes the namespace (which deletes the
  veth pair). Names carry the creating process's id (``fwf-<lane>-<pid>-<n>``), so
  :func:`remove_stale` can delete what a SIGKILLed test process left behind.

Only root can do this, with ``ip`` (iproute2) and ``socat`` installed:
:func:`unavailable_reason` says why not.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from tests.support.services import free_port
from tests.support.story_procs import die_with_parent

#: Where the test subnets come from: a /16 private range unlikely to be routed here.
SUPERNET = ipaddress.ip_network("10.231.0.0/16")
#: /30s per lane: a lane's block is ``SUPERNET``'s /30s from ``lane * SUBNETS_PER_LANE``.
SUBNETS_PER_LANE = 256
#: Namespace names: ``fwf-<lane>-<pid>-<n>``.
PREFIX = "fwf"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-(\d+)$")
_LOCK_PATH = Path("/tmp/flowwarden-netns.lock")
_counter = itertools.count()


def unavailable_reason() -> str | None:
    """``None`` when a namespace can be made here, else why not (one line)."""
    if os.geteuid() != 0:
        return "network faults: making a network namespace needs root"
    for tool, package in (("ip", "iproute2"), ("socat", "socat")):
        if shutil.which(tool) is None:
            return f"network faults: {tool!r} is not installed (apt-get install {package})"
    return None


def lane() -> int:
    """This test run's lane (``FLOWWARDEN_TEST_LANE``, 0 when unset), within the /16."""
    value = int(os.environ.get("FLOWWARDEN_TEST_LANE", "0") or 0)
    return value % (SUPERNET.num_addresses // 4 // SUBNETS_PER_LANE)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def namespaces() -> list[str]:
    """The names of the host's network namespaces."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete this package's namespaces whose creating process is gone; their names."""
    removed = []
    for name in namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(2))):
            _ip("netns", "delete", name, check=False)
            removed.append(name)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _ip("-o", "-4", "addr", "show").stdout
    found = re.findall(r"inet (\d+\.\d+\.\d+\.\d+/\d+)", out)
    return [ipaddress.ip_interface(text).network for text in found]


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /30 of this lane's block that no host interface overlaps."""
    used = _used_networks()
    subnets = SUPERNET.subnets(new_prefix=30)
    start = lane() * SUBNETS_PER_LANE
    for subnet in itertools.islice(subnets, start, start + SUBNETS_PER_LANE):
        if not any(subnet.overlaps(network) for network in used):
            return subnet
    raise RuntimeError(f"no free /30 left in lane {lane()}'s block of {SUPERNET}")


@dataclass
class Forwarder:
    """A ``socat`` from ``listen`` on the host end to ``target`` on loopback."""

    listen: tuple[str, int]
    target: tuple[str, int]
    process: subprocess.Popen[bytes]

    @property
    def host(self) -> str:
        return self.listen[0]

    @property
    def port(self) -> int:
        return self.listen[1]

    def stop(self) -> None:
        """Stop socat and the child it forked for each connection (its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(5)


def start_forwarder(bind_address: str, port: int, host: str = "127.0.0.1") -> Forwarder:
    """A socat listening on a free port of *bind_address*, connecting to *host*:*port*;
    returned once it listens."""
    listen_port = free_port()
    # socat forks a child per connection, in its process group (stop() kills it).
    # If this process is SIGKILLed, socat dies with it, and the children's
    # keepalives end them once the namespace is gone: after 2.5 min, longer than
    # any partition of a test, so the host end stays as silent as a server.
    keepalive = "keepalive,keepidle=120,keepintvl=10,keepcnt=3"
    process = subprocess.Popen(
        [
            "socat",
            f"TCP-LISTEN:{listen_port},bind={bind_address},reuseaddr,fork,{keepalive}",
            f"TCP:{host}:{port}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
        start_new_session=True,
    )
    forwarder = Forwarder((bind_address, listen_port), (host, port), process)
    deadline = time.monotonic() + 10
    while not _listens(forwarder):
        if process.poll() is not None or time.monotonic() > deadline:
            forwarder.stop()
            raise RuntimeError(f"socat did not listen on {bind_address}:{listen_port}")
        time.sleep(0.02)
    return forwarder


def _listens(forwarder: Forwarder) -> bool:
    try:
        with socket.create_connection(forwarder.listen, timeout=1):
            return True
    except OSError:
        return False


class HostLink:
    """What a veth pair between a namespace and the host does, for the namespace's own
    link (:class:`NetworkNamespace`) and each extra one (``tests.faults.links.Link``):
    its addresses, forwarders on its host end, and cutting and healing it. The class
    using it has ``host_if``, ``subnet``, ``forwarders``, ``cuts`` and ``heals``."""

    host_if: str
    subnet: ipaddress.IPv4Network
    forwarders: list[Forwarder]
    cuts: list[float]
    heals: list[float]

    @property
    def host_address(self) -> str:
        """The host end's address: what a process inside connects to."""
        return str(self.subnet.network_address + 1)

    @property
    def inside_address(self) -> str:
        """The namespace end's address."""
        return str(self.subnet.network_address + 2)

    def forward(self, port: int, host: str = "127.0.0.1") -> Forwarder:
        """A socat from a free port of :attr:`host_address` to *host*:*port*."""
        forwarder = start_forwarder(self.host_address, port, host)
        self.forwarders.append(forwarder)
        return forwarder

    def cut(self) -> float:
        """Set the host end down: from now on, nothing crosses. The ``monotonic()`` stamp."""
        _ip("link", "set", self.host_if, "down")
        self.cuts.append(time.monotonic())
        return self.cuts[-1]

    def heal(self) -> float:
        """Set the host end up again. The ``monotonic()`` stamp."""
        _ip("link", "set", self.host_if, "up")
        self.heals.append(time.monotonic())
        return self.heals[-1]

    @contextlib.contextmanager
    def partitioned(self) -> Iterator[None]:
        """Cut inside the block, healed when it ends."""
        self.cut()
        try:
            yield
        finally:
            self.heal()


@dataclass
class NetworkNamespace(HostLink):
    """A namespace with a veth pair to the host; see the module's docstring."""

    name: str
    host_if: str
    inside_if: str
    subnet: ipaddress.IPv4Network
    forwarders: list[Forwarder] = field(default_factory=list)
    #: ``time.monotonic()`` of each :meth:`cut` and :meth:`heal`.
    cuts: list[float] = field(default_factory=list)
    heals: list[float] = field(default_factory=list)
    closed: bool = False
    #: The links :meth:`add_link` made (``tests.faults.links.Link``).
    links: list[Any] = field(default_factory=list)

    @classmethod
    def create(cls) -> NetworkNamespace:
        """Make the namespace, the veth pair and their addresses; the link is up."""
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        n = next(_counter)
        pid = os.getpid()
        name = f"{PREFIX}-{lane()}-{pid}-{n}"
        stem = f"f{lane()}-{pid:x}-{n}"  # + "h"/"n": at most 15 characters (IFNAMSIZ)
        if len(stem) > 14:
            raise RuntimeError(f"interface name {stem!r}h is too long")
        _LOCK_PATH.touch(exist_ok=True)
        with open(_LOCK_PATH) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet()
            ns = cls(name, f"{stem}h", f"{stem}n", subnet)
            try:
                ns._build()
            except BaseException:
                ns.close()
                raise
        return ns

    def _build(self) -> None:
        host, inside = self.host_address, self.inside_address
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.inside_if)
        _ip("link", "set", self.inside_if, "netns", self.name)
        _ip("addr", "add", f"{host}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self.exec_ip("addr", "add", f"{inside}/30", "dev", self.inside_if)
        self.exec_ip("link", "set", self.inside_if, "up")
        self.exec_ip("link", "set", "lo", "up")
        # The host end's MAC, fixed inside: without it, ARP fails ~3 s into a cut and a
        # new connection gets "no route to host" at once, a signal a real partition
        # (beyond the first router) does not give. The entry survives the cut (the
        # namespace end only loses its carrier), so every packet just vanishes.
        self.exec_ip(
            "neigh",
            "replace",
            host,
            "lladdr",
            self._mac(self.host_if),
            "dev",
            self.inside_if,
            "nud",
            "permanent",
        )

    @staticmethod
    def _mac(interface: str) -> str:
        out = _ip("-o", "link", "show", "dev", interface).stdout
        match = re.search(r"link/ether ([0-9a-f:]{17})", out)
        if not match:
            raise RuntimeError(f"no MAC address on {interface}: {out}")
        return match.group(1)

    def exec_ip(self, *args: str) -> None:
        """``ip netns exec NAME ip ARGS``."""
        _ip("netns", "exec", self.name, "ip", *args)

    def command(self, argv: Sequence[str]) -> list[str]:
        """*argv* run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def add_link(self) -> Any:
        """One more veth pair to the host, with its own ``forward``/``cut``/``heal``
        (``tests.faults.links.Link``): cut off from one server, reach the others."""
        from tests.faults.links import Link

        link = Link.create(self)
        self.links.append(link)
        return link

    def close(self) -> None:
        """Stop the forwarders, delete the namespace and the veth pair. Idempotent."""
        if self.closed:
            return
        self.closed = True
        for link in self.links:
            with contextlib.suppress(Exception):
                link.close()
        for forwarder in self.forwarders:
            with contextlib.suppress(Exception):
                forwarder.stop()
        _ip("netns", "delete", self.name, check=False)
        # Deleting the namespace deletes the pair; a half-built one may remain here.
        _ip("link", "delete", self.host_if, check=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
