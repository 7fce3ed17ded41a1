"""The fault harness itself: a process in the test's namespace reaches a loopback
server through the host end; a cut is silent (no reset, no close, just nothing) and
a heal lets the same connection carry on; nothing is left behind."""

from __future__ import annotations

import queue
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.faults import netns
from tests.faults.netns import NetworkNamespace
from tests.support.polling import wait_until
from tests.support.story_procs import ROOT, die_with_parent

pytestmark = [pytest.mark.faults, pytest.mark.subprocess]


class _Pong(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for _line in self.rfile:
            self.wfile.write(b"pong\n")


@pytest.fixture
def pong_server() -> Iterator[int]:
    """A loopback server answering ``pong`` to each line; its port."""
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Pong)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


class Client:
    """``tests.faults.inside_client`` running inside the namespace."""

    def __init__(self, ns: NetworkNamespace, host: str, port: int) -> None:
        self.proc = subprocess.Popen(
            ns.command([sys.executable, "-u", "-m", "tests.faults.inside_client", host, str(port)]),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def ask(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write("ping\n")
        self.proc.stdin.flush()
        return self.lines.get(timeout=30)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def test_a_cut_is_silent_and_a_heal_lets_the_connection_carry_on(namespace, pong_server):
    forwarder = namespace.forward(pong_server)
    assert forwarder.host.startswith("10.231.")
    client = Client(namespace, forwarder.host, forwarder.port)
    try:
        assert client.lines.get(timeout=30) == "connected"
        assert client.ask() == "pong"
        namespace.cut()
        # No reset, no close: the request goes unanswered, again and again.
        assert [client.ask() for _ in range(3)] == ["timeout"] * 3
        # Nor does a new connection learn anything: no refusal, no "no route to host".
        assert _connect_inside(namespace, forwarder.host, forwarder.port) == "TimeoutError"
        namespace.heal()
        wait_until(lambda: client.ask() == "pong", "the same connection to answer again")
    finally:
        client.close()


_CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
except OSError as exc:
    print(type(exc).__name__)
else:
    print("connected")
"""


def _connect_inside(ns: NetworkNamespace, host: str, port: int, timeout: float = 5.0) -> str:
    """What a new connection from inside to *host*:*port* gets: ``connected`` or the
    error's class name."""
    done = subprocess.run(
        ns.command([sys.executable, "-c", _CONNECT, host, str(port), str(timeout)]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip() or done.stderr


def test_the_namespace_cannot_reach_the_host_s_loopback(namespace, pong_server):
    """Only what the test forwards is reachable: 127.0.0.1 inside is the namespace's own."""
    assert _connect_inside(namespace, "127.0.0.1", pong_server) == "ConnectionRefusedError"


def test_close_removes_the_namespace_and_the_link_and_stale_ones_go_at_start(namespace):
    other = NetworkNamespace.create()
    assert other.subnet != namespace.subnet
    assert other.name in netns.namespaces()
    other.close()
    assert other.name not in netns.namespaces()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert other.host_if not in links
    # A namespace whose creating process is gone (SIGKILLed) goes at the next start.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netns.PREFIX}-{netns.lane()}-{dead.pid}-0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in netns.remove_stale()
    assert stale not in netns.namespaces()
    assert namespace.name in netns.namespaces()  # a live process's namespace stays


def test_without_root_or_tools_the_reason_says_what_is_missing(monkeypatch):
    """What the ``namespace`` fixture skips with (or fails with, when
    ``FLOWWARDEN_REQUIRE_SERVICES=1``)."""
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert netns.unavailable_reason() == "network faults: making a network namespace needs root"
    monkeypatch.setattr(netns.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "socat" else tool)
    assert "'socat' is not installed (apt-get install socat)" in netns.unavailable_reason()


def test_a_second_link_is_cut_on_its_own(namespace, pong_server):
    """``add_link()``: cut off from one server (over its link) while reaching another
    (over the namespace's first link); the link goes with the namespace."""
    link = namespace.add_link()
    assert link.subnet != namespace.subnet
    through_link = link.forward(pong_server)
    through_first = namespace.forward(pong_server)
    assert through_link.host != through_first.host
    near = Client(namespace, through_first.host, through_first.port)
    far = Client(namespace, through_link.host, through_link.port)
    try:
        assert near.lines.get(timeout=30) == far.lines.get(timeout=30) == "connected"
        assert near.ask() == far.ask() == "pong"
        link.cut()
        assert far.ask() == "timeout"
        assert near.ask() == "pong"  # the first link still carries
        assert _connect_inside(namespace, link.host_address, through_link.port) == "TimeoutError"
        link.heal()
        wait_until(lambda: far.ask() == "pong", "the link's connection to answer again")
        namespace.cut()
        assert near.ask() == "timeout"
        assert far.ask() == "pong"  # and the other way round
        namespace.heal()
    finally:
        near.close()
        far.close()
    namespace.close()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert link.host_if not in links
