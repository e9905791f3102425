"""A network of its own for a local sandbox that may reach out (network ``public``): never the runner's.

A bubblewrap sandbox that shared the runner's network namespace would reach everything the runner's machine serves
on its loopback: vLLM replicas, the proxy, the tracker, a Ray head. A public sandbox gets instead:

- a network namespace of its own (``ip netns``, named ``rc-<id>``) with its own loopback and one end of a veth pair,
  ``10.231.x.y/30`` (a /30 out of ``10.231.0.0/16`` per sandbox), its default route through the other end;
- on the host, rules tagged ``runctl-<sandbox id>``: nothing from the sandbox reaches the host itself (``INPUT``
  drop, whatever address it tries), nor any private, shared or link-local range (``FORWARD`` drop: other machines
  of the cluster, a cloud's metadata service); everything else is forwarded and masqueraded (``nat POSTROUTING``),
  and only replies come back;
- the record of all this in the sandbox's ``meta.json`` before any of it exists, so a destroy or the reaper removes
  it even after a crash half-way.

It needs root on the host (``ip``, ``iptables``, ``nsenter``) and turns on IPv4 forwarding if it is off (Docker's
daemon does the same). Without them a public sandbox is refused with the reason (the validator says so first).
The sandbox's DNS is the host's ``/etc/resolv.conf``: a resolver on the host's loopback (127.0.0.53) is not
reachable from the sandbox's namespace, as nothing on the host is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.sandbox.backends.base import SandboxError

POOL = ipaddress.ip_network("10.231.0.0/16")
SLOTS = POOL.num_addresses // 4
#: Where a sandbox may not go: private, carrier-grade shared and link-local ranges (the metadata service).
BLOCKED = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")
TOOLS = ("ip", "iptables", "nsenter")
LOCK = Path("/run/runctl-sandbox-net.lock")


@dataclass(frozen=True)
class SandboxNet:
    """The names and addresses of one sandbox's network."""

    sandbox_id: str
    slot: int

    @property
    def netns(self) -> str:
        return f"rc-{self._short}"

    @property
    def host_if(self) -> str:
        return f"rch{self._short}"  # interface names have at most 15 characters

    @property
    def inner_if(self) -> str:
        return f"rcs{self._short}"

    @property
    def tag(self) -> str:
        return f"runctl-{self.sandbox_id}"

    @property
    def _short(self) -> str:
        return hashlib.sha256(self.sandbox_id.encode()).hexdigest()[:10]

    def _address(self, host: int) -> str:
        return str(POOL.network_address + self.slot * 4 + host)

    @property
    def cidr(self) -> str:
        return f"{self._address(0)}/30"

    @property
    def gateway(self) -> str:
        return self._address(1)

    @property
    def address(self) -> str:
        return self._address(2)

    def record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SandboxNet:
        return cls(str(record["sandbox_id"]), int(record["slot"]))

    def enter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this network namespace (bubblewrap then keeps it: ``--share-net``)."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--", *argv]


def public_net_problem() -> str | None:
    """Why this host cannot give a local sandbox a network of its own (with the fix), or None when it can."""
    if os.geteuid() != 0:
        return (
            "a public local sandbox gets a network namespace of its own, which needs root (runctl runs as uid "
            f"{os.geteuid()}). Fix: run the sandbox service as root, set BACKEND=docker, or use no-network."
        )
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return (
            f"a public local sandbox needs {', '.join(missing)} here. Fix: install iproute2, iptables and "
            "util-linux (`scripts/system-packages.sh demo`), or set BACKEND=docker."
        )
    return None


@contextlib.contextmanager
def allocation() -> Iterator[None]:
    """Held (machine-wide) while a slot is chosen and its network made: no other sandbox of this machine, whoever's
    backend makes it, can take the same slot meanwhile."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def taken() -> set[int]:
    """The slots whose gateway address is on one of this machine's interfaces (read from the kernel, not a record)."""
    listed = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout.split()
    slots = set()
    for word in listed:
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_interface(word)
            if address.ip in POOL:
                slots.add((int(address.ip) - int(POOL.network_address)) // 4)
    return slots


def choose(sandbox_id: str) -> SandboxNet:
    """A free slot for the sandbox (call inside :func:`allocation`)."""
    used = taken()
    first = int(hashlib.sha256(sandbox_id.encode()).hexdigest(), 16) % SLOTS
    for step in range(SLOTS):
        slot = (first + step) % SLOTS
        if slot not in used:
            return SandboxNet(sandbox_id, slot)
    raise SandboxError(f"all {SLOTS} sandbox networks of {POOL} are in use on this machine; destroy some first")


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise SandboxError(f"cannot make the sandbox's network: `{' '.join(argv)}` said {done.stderr.strip()}")
    return done


def _rules(net: SandboxNet) -> list[tuple[str, list[str]]]:
    """(table, rule) in the order they are inserted at the top of their chains (so the last one comes first)."""
    tag = ["-m", "comment", "--comment", net.tag]
    rules: list[tuple[str, list[str]]] = [
        ("filter", ["INPUT", "-i", net.host_if, *tag, "-j", "DROP"]),
        ("filter", ["FORWARD", "-i", net.host_if, *tag, "-j", "ACCEPT"]),
        (
            "filter",
            ["FORWARD", "-o", net.host_if, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", *tag, "-j", "ACCEPT"],
        ),
    ]
    rules += [("filter", ["FORWARD", "-i", net.host_if, "-d", blocked, *tag, "-j", "DROP"]) for blocked in BLOCKED]
    rules.append(("nat", ["POSTROUTING", "-s", net.cidr, "!", "-o", net.host_if, *tag, "-j", "MASQUERADE"]))
    return rules


def make(net: SandboxNet) -> None:
    """Make the sandbox's namespace, veth pair, addresses, route and host rules (removed again on failure)."""
    try:
        forward = Path("/proc/sys/net/ipv4/ip_forward")
        if forward.read_text().strip() != "1":
            forward.write_text("1")
        _run(["ip", "netns", "add", net.netns])
        _run(["ip", "link", "add", net.host_if, "type", "veth", "peer", "name", net.inner_if])
        _run(["ip", "link", "set", net.inner_if, "netns", net.netns])
        _run(["ip", "addr", "add", f"{net.gateway}/30", "dev", net.host_if])
        _run(["ip", "link", "set", net.host_if, "up"])
        inside = ["ip", "-n", net.netns]
        _run([*inside, "addr", "add", f"{net.address}/30", "dev", net.inner_if])
        _run([*inside, "link", "set", net.inner_if, "up"])
        _run([*inside, "link", "set", "lo", "up"])
        _run([*inside, "route", "add", "default", "via", net.gateway])
        for table, rule in _rules(net):
            _run(["iptables", "-w", "-t", table, "-I", *rule])
    except BaseException:
        remove(net)
        raise


def remove(net: SandboxNet) -> None:
    """Remove whatever of the sandbox's network exists (its rules found by their tag); safe to repeat."""
    for table in ("filter", "nat"):
        listed = _run(["iptables", "-w", "-t", table, "-S"], check=False).stdout.splitlines()
        for line in listed:
            rule = [token.strip('"') for token in line.split()]
            if rule and rule[0] == "-A" and net.tag in rule:
                _run(["iptables", "-w", "-t", table, "-D", *rule[1:]], check=False)
    _run(["ip", "link", "del", net.host_if], check=False)  # takes its peer with it
    _run(["ip", "netns", "del", net.netns], check=False)


def present(net: SandboxNet) -> bool:
    """Whether any part of the sandbox's network is still there (for tests and the reaper's report)."""
    if Path(f"/run/netns/{net.netns}").exists():
        return True
    if _run(["ip", "link", "show", net.host_if], check=False).returncode == 0:
        return True
    return any(net.tag in _run(["iptables", "-w", "-t", t, "-S"], check=False).stdout for t in ("filter", "nat"))
