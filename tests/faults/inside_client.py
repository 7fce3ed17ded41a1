"""A TCP client for the harness's own tests, run inside a namespace:
``python -m tests.faults.inside_client HOST PORT``. For each line ``ping`` on stdin it
sends ``ping`` on one connection (opened once) and prints what came back, ``timeout``
(nothing within 1 s) or the error's class name (a reset, say)."""

from __future__ import annotations

import socket
import sys


def main(host: str, port: int) -> None:
    sock = socket.create_connection((host, port), timeout=5)
    sock.settimeout(1.0)
    print("connected", flush=True)
    for line in sys.stdin:
        if line.strip() != "ping":
            break
        try:
            sock.sendall(b"ping\n")
            got = b""
            while not got.endswith(b"\n"):
                chunk = sock.recv(100)
                if not chunk:
                    raise ConnectionAbortedError("closed")
                got += chunk
            print(got.decode().strip(), flush=True)
        except TimeoutError:
            print("timeout", flush=True)
        except OSError as exc:
            print(type(exc).__name__, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
