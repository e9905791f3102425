"""The vLLM replicas behind the proxy: a pool from a static list or discovered from Ray, least-in-flight routing
that keeps each session on one replica, and health probes that take a dead replica out and bring it back.

Health: every interval each replica gets ``GET /health`` and, unless it says it is asleep (``GET /is_sleeping``,
as replicas are while a colocated trainer holds the GPUs), a one-token completion. A refused connection takes it
out at once, as does a request that cannot reach it; probes that time out take it out after ``fail_after`` in a
row; one good probe brings it back. A probe that times out while the replica answers requests, or whose completion
waits behind requests in flight after ``/health`` answered, is no failure: the replica is busy (a loaded host
starves the probe, not the work), not gone; the request timeout ends a replica that hangs on its work.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from runctl.errors import log_failure
from services.proxy.errors import NoReplica, UpstreamError, UpstreamTimeout
from services.proxy.http11 import UpstreamClient

log = logging.getLogger(__name__)

UP, DOWN, ASLEEP, UNKNOWN = "up", "down", "asleep", "unknown"
RAY_ACTOR_PATTERN = re.compile(r"^vllm_server_")


def parse_upstream(url: str) -> tuple[str, int]:
    """``http://host:port`` (a trailing ``/v1`` is allowed) → (host, port).

    Raises:
        ValueError: not an http URL with a host and a port.
    """
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(
            f"upstream {url!r} is not http://HOST:PORT. Fix: give each vLLM replica as http://HOST:PORT "
            "(https upstreams are not supported: replicas sit on the cluster network)."
        )
    if parts.path.rstrip("/") not in ("", "/v1"):
        raise ValueError(f"upstream {url!r} has a path; give only http://HOST:PORT (the proxy adds /v1/...).")
    return parts.hostname, parts.port


@dataclass
class Replica:
    name: str
    host: str
    port: int
    client: UpstreamClient = field(init=False)
    state: str = UNKNOWN
    in_flight: int = 0
    failures: int = 0
    last_error: str = ""
    checked_at: float = 0.0
    served_model: str | None = None
    requests: int = 0
    answered_at: float = float("-inf")  # time.monotonic() of its last answer to a request
    key: str | None = field(default=None, repr=False)  # the bearer key it requires (a run's replica key)

    def answered(self) -> None:
        self.answered_at = time.monotonic()

    def __post_init__(self) -> None:
        self.client = UpstreamClient(self.host, self.port, key=self.key)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "state": self.state,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "served_model": self.served_model,
            "last_error": self.last_error,
            "checked_at": self.checked_at,
        }


class ReplicaPool:
    """Routing and health for a changing set of replicas."""

    def __init__(
        self,
        interval_s: float = 5.0,
        probe_timeout_s: float = 30.0,
        fail_after: int = 2,
        probe_completion: bool = True,
        key: str | None = None,
    ) -> None:
        self.replicas: dict[str, Replica] = {}
        self.key = key  # sent to every replica as a bearer token
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self.fail_after = fail_after
        self.probe_completion = probe_completion
        self._rotate = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.on_change: Callable[[Replica], None] | None = None

    # membership
    def add(self, url: str, name: str | None = None) -> Replica:
        host, port = parse_upstream(url)
        name = name or f"{host}:{port}"
        existing = self.replicas.get(name)
        if existing is not None and (existing.host, existing.port) == (host, port):
            return existing
        replica = Replica(name, host, port, key=self.key)
        self.replicas[name] = replica
        self._wake.set()
        return replica

    def remove(self, name: str) -> None:
        replica = self.replicas.pop(name, None)
        if replica is not None:
            replica.client.close()

    # routing
    def pick(self, sticky: str | None, exclude: set[str] | frozenset[str] = frozenset()) -> Replica:
        """The session's replica when it is up, else the up replica with the fewest requests in flight.

        Raises:
            NoReplica: none is up (asleep ones count as up: a request wakes nothing, but is not lost).
        """
        if sticky is not None:
            replica = self.replicas.get(sticky)
            if replica is not None and replica.state in (UP, ASLEEP) and sticky not in exclude:
                return replica
        candidates = [r for r in self.replicas.values() if r.state in (UP, ASLEEP) and r.name not in exclude]
        if not candidates:
            candidates = [r for r in self.replicas.values() if r.state == UNKNOWN and r.name not in exclude]
        if not candidates:
            raise NoReplica(self._why_none())
        self._rotate += 1
        start = self._rotate % len(candidates)
        ordered = candidates[start:] + candidates[:start]
        return min(ordered, key=lambda r: r.in_flight)

    def _why_none(self) -> str:
        if not self.replicas:
            return "no vLLM replica is configured or discovered yet"
        states = ", ".join(
            f"{r.name} {r.state}{f' ({r.last_error})' if r.last_error else ''}" for r in self.replicas.values()
        )
        return f"no vLLM replica is healthy: {states}"

    def mark_down(self, replica: Replica, reason: str) -> None:
        if replica.state != DOWN:
            log.warning("replica %s is out: %s", replica.name, reason)
        replica.state = DOWN
        replica.last_error = reason
        replica.failures = max(replica.failures, self.fail_after)
        if self.on_change:
            self.on_change(replica)

    def _mark_up(self, replica: Replica, state: str = UP) -> None:
        if replica.state != state and replica.state == DOWN:
            log.info("replica %s is back (%s)", replica.name, state)
        replica.state = state
        replica.failures = 0
        replica.last_error = ""
        if self.on_change:
            self.on_change(replica)

    # health
    async def probe(self, replica: Replica) -> None:
        """One health probe of one replica; updates its state."""
        replica.checked_at = time.time()
        started = time.monotonic()
        asked = "/health"
        try:
            resp = await replica.client.request("GET", "/health", timeout_s=self.probe_timeout_s)
            await resp.read()
            if resp.status != 200:
                raise UpstreamError(f"/health answered {resp.status}", True)
            if replica.served_model is None:
                replica.served_model = await self._served_model(replica)
            if await self._asleep(replica):
                self._mark_up(replica, ASLEEP)
                return
            if self.probe_completion and replica.served_model:
                asked = "a one-token completion"
                body = orjson.dumps({"model": replica.served_model, "prompt": "ok", "max_tokens": 1})
                resp = await replica.client.request("POST", "/v1/completions", body, timeout_s=self.probe_timeout_s)
                await resp.read()
                if resp.status != 200:
                    raise UpstreamError(f"a one-token completion answered {resp.status}", True)
            self._mark_up(replica)
        except UpstreamTimeout:
            waited = f"{asked} did not answer within {self.probe_timeout_s:g}s"
            if replica.answered_at >= started:
                replica.last_error = f"busy: {waited}, while it answered requests"
                return
            if asked != "/health" and replica.in_flight:
                # The server is up and its engine has work queued before the probe; the request timeout is what
                # ends a replica that hangs on it.
                replica.last_error = f"busy: {waited}, behind {replica.in_flight} request(s) in flight"
                return
            replica.failures += 1
            replica.last_error = waited
            if replica.failures >= self.fail_after:
                self.mark_down(replica, replica.last_error)
        except UpstreamError as e:
            self.mark_down(replica, str(e))

    async def _asleep(self, replica: Replica) -> bool:
        resp = await replica.client.request("GET", "/is_sleeping", timeout_s=self.probe_timeout_s)
        body = await resp.read()
        if resp.status != 200:
            return False
        try:
            return bool(orjson.loads(body).get("is_sleeping"))
        except (orjson.JSONDecodeError, AttributeError):
            return False

    async def _served_model(self, replica: Replica) -> str | None:
        resp = await replica.client.request("GET", "/v1/models", timeout_s=self.probe_timeout_s)
        body = await resp.read()
        try:
            data = orjson.loads(body).get("data") or []
            return str(data[0]["id"]) if data else None
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
            return None

    async def probe_all(self) -> None:
        if self.replicas:
            await asyncio.gather(*(self.probe(r) for r in list(self.replicas.values())))

    async def wait_ready(self, timeout_s: float, every: bool = False) -> bool:
        """Probe until at least one replica is up (``every``: all of them), for up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.probe_all()
            ready = [r.state in (UP, ASLEEP) for r in self.replicas.values()]
            if ready and (all(ready) if every else any(ready)):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.probe_all()
            except Exception as e:
                log_failure(log, "replica health probes failed", e)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            except TimeoutError:
                pass

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for replica in self.replicas.values():
            replica.client.close()


def ray_replica_addresses(
    address: str | None, pattern: re.Pattern[str] = RAY_ACTOR_PATTERN, namespace: str | None = None
) -> dict[str, str]:
    """Named Ray actors ``vllm_server_*`` that serve HTTP → ``{actor name: http://ip:port}``: those of ``namespace``
    (a run's own), or of every namespace when it is None (a proxy an operator points at a cluster).

    Blocking (Ray's client API); call it from a thread. Connects to the cluster at ``address`` once per process.
    Actors that do not answer ``get_server_address`` (a replica's non-leading nodes) are left out.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False, logging_level=logging.WARNING)
    found: dict[str, str] = {}
    for entry in _named_actors(pattern, namespace):
        name, where_ns = entry["name"], entry.get("namespace")
        try:
            actor = ray.get_actor(name, namespace=where_ns)
            where: Any = ray.get(actor.get_server_address.remote(), timeout=10)
        except Exception as e:  # an actor that is not (or no longer) an HTTP server
            log.debug("Ray actor %s gives no server address: %s", name, e)
            continue
        if isinstance(where, list | tuple):
            host, port = where[0], int(where[1])
            address_text = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
        else:
            address_text = str(where)
        found[f"{where_ns}/{name}" if where_ns else name] = "http://" + address_text.removeprefix("http://")
    return found


def _named_actors(pattern: re.Pattern[str], namespace: str | None) -> list[dict[str, Any]]:
    """The named actors whose name ``pattern`` matches, of ``namespace`` (None: of every namespace)."""
    import ray

    return [
        entry
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if pattern.search(entry["name"]) and (namespace is None or entry.get("namespace") == namespace)
    ]


def ray_weight_versions(pattern: re.Pattern[str] = RAY_ACTOR_PATTERN, namespace: str | None = None) -> list[int]:
    """The weight version each ``vllm_server_*`` actor serves: verl's ``global_steps``, which verl's trainer sets
    on its servers with each weight update (0 for servers not yet updated, on the initial weights).

    Blocking, in a process already connected to the cluster (a worker of verl's). Read with Ray's
    ``__ray_call__``, which runs a function on the actor itself: verl's servers keep the version but name no
    getter for it.
    """
    import ray

    versions: list[int] = []
    for entry in _named_actors(pattern, namespace):
        try:
            actor = ray.get_actor(entry["name"], namespace=entry.get("namespace"))
            version: Any = ray.get(
                actor.__ray_call__.remote(lambda server: getattr(server, "global_steps", None)), timeout=10
            )
        except Exception as e:  # gone, or not a server of verl's
            log.debug("Ray actor %s gives no weight version: %s", entry["name"], e)
            continue
        versions.append(int(version or 0))
    return versions


class RayDiscovery:
    """Keeps a pool's membership equal to the ``vllm_server_*`` actors of a Ray cluster, every ``interval_s``."""

    def __init__(
        self, pool: ReplicaPool, address: str | None, interval_s: float = 5.0, namespace: str | None = None
    ) -> None:
        self.pool = pool
        self.address = address
        self.namespace = namespace  # None: every namespace's
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._names: set[str] = set()
        self.last_error = ""

    async def refresh(self) -> None:
        try:
            found = await asyncio.to_thread(ray_replica_addresses, self.address, namespace=self.namespace)
        except Exception as e:
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("Ray discovery failed: %s", self.last_error)
            return
        self.last_error = ""
        for name, url in found.items():
            self.pool.add(url, name=name)
        for name in self._names - found.keys():
            self.pool.remove(name)
        self._names = set(found)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
