"""The proxy's face: the one module of the proxy that code outside ``services/proxy`` imports.

A run's runner (``ENGINE=local`` and verl's host) serves its trials through an in-process :class:`ProxyServer`;
verl's engine finds the replicas verl started as Ray actors; ``runctl proxy serve`` runs the standalone proxy. The
scaffolds point their agents' side requests (titles, summaries) at :data:`SIDE_MODEL`.
"""

from services.proxy.names import DEFAULT_ALIASES, SIDE_MODEL
from services.proxy.replicas import parse_upstream, ray_replica_addresses, ray_weight_versions
from services.proxy.server import ProxyServer
from services.proxy.standalone import serve, use_fast_loop
from services.proxy.trajectory import captured_usage

__all__ = [
    "DEFAULT_ALIASES",
    "ProxyServer",
    "SIDE_MODEL",
    "captured_usage",
    "parse_upstream",
    "ray_replica_addresses",
    "ray_weight_versions",
    "serve",
    "use_fast_loop",
]
