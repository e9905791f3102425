"""The proxy's Prometheus metrics (``GET /metrics``): model calls, tokens, failovers, sessions, replicas."""

from __future__ import annotations

from collections.abc import Callable

from runctl.metrics import Counter, Gauge, Histogram, Registry
from services.proxy.replicas import ASLEEP, UP, ReplicaPool


class ProxyMetrics:
    def __init__(self, pool: ReplicaPool, sessions_open: Callable[[], int]) -> None:
        r = self.registry = Registry()
        self.requests = r.add(
            Counter("runctl_proxy_requests_total", "Model calls by surface and status.", ("surface", "code"))
        )
        self.latency = r.add(
            Histogram("runctl_proxy_request_seconds", "Model call time, proxy in to proxy out.", ("surface",))
        )
        self.tokens = r.add(Counter("runctl_proxy_tokens_total", "Tokens through the proxy.", ("kind",)))
        self.failovers = r.add(
            Counter("runctl_proxy_failovers_total", "Requests sent to another replica after one failed.")
        )
        self.sessions = r.add(Counter("runctl_proxy_sessions_total", "Sessions opened."))
        self.resent = r.add(
            Counter(
                "runctl_proxy_aborted_total",
                "Answers a replica cut short (finish reason abort), by outcome.",
                ("outcome",),
            )
        )
        r.add(Gauge("runctl_proxy_sessions_open", "Sessions open now.", (), lambda: {(): sessions_open()}))
        r.add(
            Gauge(
                "runctl_proxy_replica_in_flight",
                "Requests in flight per replica.",
                ("replica",),
                lambda: {(n,): x.in_flight for n, x in pool.replicas.items()},
            )
        )
        r.add(
            Gauge(
                "runctl_proxy_replica_up",
                "1 when a replica takes requests (up or asleep), else 0.",
                ("replica",),
                lambda: {(n,): float(x.state in (UP, ASLEEP)) for n, x in pool.replicas.items()},
            )
        )
        r.add(
            Gauge(
                "runctl_proxy_replica_requests",
                "Requests sent per replica.",
                ("replica",),
                lambda: {(n,): x.requests for n, x in pool.replicas.items()},
            )
        )
