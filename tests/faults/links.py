"""More links between a test's namespace and the host, one per server, so that a
process inside can be cut off from one server while it still reaches the others.

::

    with NetworkNamespace.create() as ns:
        to_mongo = ns.add_link()                   # its own veth pair and /30
        mongo = to_mongo.forward(27018)            # socat on to_mongo.host_address
        db = ns.forward(5432)                      # the namespace's first link
        to_mongo.cut()                             # MongoDB only: PostgreSQL still answers
        to_mongo.heal()

A :class:`Link` is a veth pair like the namespace's first one: its host end has
``host_address`` (``.1`` of a free /30 of the lane's block), its namespace end
``inside_address`` (``.2``), and the namespace end knows the host end's MAC for good,
so a cut is silent (no "no route to host"). Deleting the namespace deletes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tests.faults import netns
from tests.faults.netns import Forwarder

if TYPE_CHECKING:
    from tests.faults.netns import NetworkNamespace


@dataclass
class Link(netns.HostLink):
    """One more veth pair between a namespace and the host, cut and healed on its own."""

    namespace: str
    host_if: str
    inside_if: str
    subnet: ipaddress.IPv4Network
    forwarders: list[Forwarder] = field(default_factory=list)
    #: ``time.monotonic()`` of each :meth:`cut` and :meth:`heal`.
    cuts: list[float] = field(default_factory=list)
    heals: list[float] = field(default_factory=list)
    closed: bool = False

    @classmethod
    def create(cls, ns: NetworkNamespace) -> Link:
        """A new pair between *ns* and the host, in a free /30; the link is up."""
        n = next(netns._counter)
        pid = int(ns.name.split("-")[2])  # the namespace's creator: remove_stale's key
        stem = f"f{netns.lane()}-{pid:x}-{n}"
        if len(stem) > 14:
            raise RuntimeError(f"interface name {stem!r}h is too long")
        netns._LOCK_PATH.touch(exist_ok=True)
        with open(netns._LOCK_PATH) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            link = cls(ns.name, f"{stem}h", f"{stem}n", netns._free_subnet())
            try:
                link._build()
            except BaseException:
                link.close()
                raise
        return link

    def _build(self) -> None:
        host, inside = self.host_address, self.inside_address
        netns._ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.inside_if)
        netns._ip("link", "set", self.inside_if, "netns", self.namespace)
        netns._ip("addr", "add", f"{host}/30", "dev", self.host_if)
        netns._ip("link", "set", self.host_if, "up")
        self._exec_ip("addr", "add", f"{inside}/30", "dev", self.inside_if)
        self._exec_ip("link", "set", self.inside_if, "up")
        # As on the first link: a fixed neighbour entry keeps a cut silent.
        mac = netns.NetworkNamespace._mac(self.host_if)
        self._exec_ip(
            "neigh", "replace", host, "lladdr", mac, "dev", self.inside_if, "nud", "permanent"
        )

    def _exec_ip(self, *args: str) -> None:
        netns._ip("netns", "exec", self.namespace, "ip", *args)

    def close(self) -> None:
        """Stop the forwarders and delete the pair (the namespace's deletion does too)."""
        if self.closed:
            return
        self.closed = True
        for forwarder in self.forwarders:
            with contextlib.suppress(Exception):
                forwarder.stop()
        netns._ip("link", "delete", self.host_if, check=False)
