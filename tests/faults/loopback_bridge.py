"""A loopback port of the host, reachable at the same port on the namespace's own
loopback through a path the link does not carry: a Unix socket (a file, which crosses
network namespaces). Cutting the link leaves it up, so a process inside can be cut
off from one server (reached through :meth:`NetworkNamespace.forward`) while it keeps
reaching the others, at the very addresses a process on the host uses (a scripted
MongoDB replica set names its members ``127.0.0.1:<port>``)::

    with bridge_loopback(ns, mongo_port, tmp_path), bridge_loopback(ns, pg_port, tmp_path):
        ...  # inside, 127.0.0.1:mongo_port and 127.0.0.1:pg_port reach the host's servers

Two ``socat``: on the host, ``UNIX-LISTEN:<dir>/lo-<port>.sock`` to ``127.0.0.1:port``;
inside, ``TCP-LISTEN:port`` on ``127.0.0.1`` to that socket. Both are stopped (with the
children they forked) when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.faults.netns import NetworkNamespace
from tests.support.story_procs import die_with_parent


def _socat(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def _wait_for(check: Callable[[], bool], what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"socat did not start: {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def bridge_loopback(ns: NetworkNamespace, port: int, directory: Path) -> Iterator[None]:
    """Inside *ns*, ``127.0.0.1:port`` reaches the host's ``127.0.0.1:port`` (see the
    module's docstring), whatever becomes of the link."""
    path = directory / f"lo-{port}.sock"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    host = _socat(["socat", f"UNIX-LISTEN:{path},fork", f"TCP:127.0.0.1:{port}"])
    inside = None
    try:
        _wait_for(path.exists, str(path), host)
        inside = _socat(
            ns.command(
                [
                    "socat",
                    f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
                    f"UNIX-CONNECT:{path}",
                ]
            )
        )
        _wait_for(lambda: _listens_inside(ns, port), f"127.0.0.1:{port} in {ns.name}", inside)
        yield
    finally:
        for process in (inside, host):
            if process is not None:
                _stop(process)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _listens_inside(ns: NetworkNamespace, port: int) -> bool:
    probe = "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)"
    done = subprocess.run(
        ns.command([sys.executable, "-c", probe, str(port)]), capture_output=True, timeout=30
    )
    return done.returncode == 0
