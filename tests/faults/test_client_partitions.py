"""How long a PostgreSQL or Redis client of the package takes to notice a silent
partition, and to work again after healing (issue 51, the figures of the docs'
"Network faults" table).

A client (``tests.faults.probe_client``) inside the test's namespace sends a trivial
request every 0.2 s through a forwarder to the lane's server. The link is cut; the
request in flight goes unanswered until the client's own bound ends it (PostgreSQL:
``tcp_user_timeout``; Redis: the socket timeout), both from
``DEAD_CONNECTION_TIMEOUT``. The link then heals and the client, connecting again,
is answered.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.faults.figures import report
from tests.faults.netns import NetworkNamespace
from tests.faults.processes import JsonLinesProcess
from tests.support.polling import wait_until
from tests.support.services import SERVICES

pytestmark = [pytest.mark.faults, pytest.mark.subprocess]

#: How long a test waits for the client to notice: the bound, and room for a loaded
#: machine (the figure is printed; the bound is what the docs promise).
SLACK = 30.0


@pytest.mark.parametrize(
    "bound", [pytest.param(6, id="6s"), pytest.param(30, id="30s", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize(
    "kind", [pytest.param(kind, marks=pytest.mark.lane(kind)) for kind in ("postgres", "redis")]
)
def test_a_client_notices_a_silent_partition_within_the_bound(
    namespace: NetworkNamespace, tmp_path, kind, bound
):
    server = SERVICES[kind]
    forwarder = namespace.forward(server.port, server.host)
    args = ["tests.faults.probe_client", kind, forwarder.host, str(forwarder.port), "postgres"]
    client = JsonLinesProcess(
        args,
        {"FW_FAULT_FLOWWARDEN": json.dumps({"DEAD_CONNECTION_TIMEOUT": f"{bound}s"})},
        tmp_path / "client",
        wrap=namespace.command,
    )
    try:
        wait_until(lambda: client.event("ok"), f"the {kind} client's first answer", timeout=60)
        cut_wall = time.time()
        namespace.cut()
        error = wait_until(lambda: client.event("error"), "the partition noticed", bound + SLACK)
        healed_wall = time.time()
        namespace.heal()
        wait_until(
            lambda: [e for e in client.events() if e["event"] == "ok" and e["t"] > healed_wall],
            "an answer after healing",
            timeout=60,
        )
        again = next(e for e in client.events() if e["event"] == "ok" and e["t"] > healed_wall)
    except BaseException:
        print(client.describe())
        raise
    finally:
        code = client.stop(signal.SIGTERM, timeout=10)
    report(
        f"[faults] {kind} client, DEAD_CONNECTION_TIMEOUT {bound} s: a silent partition "
        f"noticed {error['t'] - cut_wall:.1f} s after the cut ({error['error']}: "
        f"{error['message'][:60]!r}); answered again {again['t'] - healed_wall:.1f} s after "
        "healing"
    )
    assert code is not None, "the client did not exit on SIGTERM"
