"""What every runctl service shares at run time: connect, make the streams, answer health probes, consume
durably, and shut down gracefully on SIGTERM (stop fetching, finish the batch in hand, drain the connection).

A service's ``__main__`` builds a :class:`ServiceRuntime`, adds its consumers and background tasks, and calls
:meth:`ServiceRuntime.serve`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, overload

from nats.aio.msg import Msg

from runctl.bus.client import BatchHandler, Bus, Consumer, ConsumerSpec, TeamConsumers, masked_url
from runctl.errors import RunctlError, log_failure
from runctl.metrics import Gauge, Registry
from runctl.subjects import health_subject

if TYPE_CHECKING:
    from runctl.settings import ServiceSettings

log = logging.getLogger(__name__)

SOURCE_PREFIX = "/runctl/"
# Each consumer's stats as Prometheus series: (metric, ConsumerStats field, type, help).
CONSUMER_METRICS = (
    ("runctl_events_consumed_total", "handled", "counter", "Events handled and acknowledged."),
    ("runctl_handler_errors_total", "errors", "counter", "Handler failures (each retried or dead-lettered)."),
    ("runctl_redeliveries_total", "redelivered", "counter", "Events handled on a second or later delivery."),
    ("runctl_dead_lettered_total", "dead_lettered", "counter", "Events given up on and dead-lettered."),
    ("runctl_consumer_lag", "lag", "gauge", "Events in the stream not yet delivered to the consumer."),
    (
        "runctl_consumer_recreated_total",
        "recreated",
        "counter",
        "Times the durable consumer vanished and was made again.",
    ),
)


def setup_logging(name: str) -> None:
    """One log format for every service: time, service, level, message."""
    logging.basicConfig(
        level=os.environ.get("RUNCTL_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
    )


class ServiceRuntime:
    """The life of one service process.

    Args:
        name: the service's role noun (``validator``); also its health subject and event source.
        nats_url: bus URL; None for the default resolution (``RUNCTL_NATS_URL``, the stack, localhost).
    """

    def __init__(self, name: str, nats_url: str | None = None) -> None:
        self.name = name
        self.source = SOURCE_PREFIX + name
        self.nats_url = nats_url
        self.started_at = time.time()
        self.stopping = asyncio.Event()
        self.consumers: list[Consumer | TeamConsumers] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._health_extra: list[Callable[[], dict[str, Any]]] = []
        self._on_stop: list[Callable[[], Awaitable[None]]] = []
        self.bus: Bus | None = None
        self.ready = False
        self.metrics = self._make_metrics()
        """Prometheus exposition of this service; a service adds its own metrics to it."""
        self.metrics_url = ""
        self._metrics_server: asyncio.Server | None = None

    async def start(self) -> Bus:
        """Connect (reconnecting forever afterwards), make the streams, serve ``/metrics`` and answer health
        probes."""
        self.bus = await Bus.connect(self.nats_url, name=f"runctl-{self.name}", reconnect=True, as_team=False)
        await self.bus.ensure_streams()
        await self.bus.nc.subscribe(health_subject(self.name), cb=self._health)
        log.info("connected to %s", masked_url(self.bus.url))
        host = os.environ.get("RUNCTL_METRICS_HOST", "127.0.0.1")
        self._metrics_server = await asyncio.start_server(
            self._serve_metrics, host, int(os.environ.get("RUNCTL_METRICS_PORT", "0"))
        )
        port = self._metrics_server.sockets[0].getsockname()[1]
        self.metrics_url = f"http://{host}:{port}/metrics"
        log.info("metrics at %s", self.metrics_url)
        return self.bus

    def _consumer_values(self, field: str) -> dict[tuple[str, ...], float]:
        return {(self.name, c.spec.durable): float(getattr(c.stats, field)) for c in self.consumers}

    def _make_metrics(self) -> Registry:
        registry = Registry()
        for name, field, kind, help_ in CONSUMER_METRICS:
            registry.add(
                Gauge(name, help_, ("service", "consumer"), functools.partial(self._consumer_values, field), kind)
            )
        registry.add(
            Gauge(
                "runctl_service_uptime_seconds",
                "Seconds since the service started.",
                ("service",),
                lambda: {(self.name,): round(time.time() - self.started_at, 3)},
            )
        )
        return registry

    async def _serve_metrics(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A minimal HTTP/1.0 answer: ``GET /metrics`` gives the exposition, anything else 404."""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            if path.split(b"?")[0] == b"/metrics":
                body, status = self.metrics.render(), b"200 OK"
            else:
                body, status = b"not found: the metrics are at /metrics\n", b"404 Not Found"
            writer.write(
                b"HTTP/1.0 " + status + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def health_info(self, provider: Callable[[], dict[str, Any]]) -> None:
        """Add service-specific fields to the health reply."""
        self._health_extra.append(provider)

    def on_stop(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` after consumers stop and before the connection drains."""
        self._on_stop.append(callback)

    async def consume(self, spec: ConsumerSpec, handler: BatchHandler) -> Consumer | TeamConsumers:
        """Start a durable consumer running ``handler`` until the service stops (on a family, one per team's
        stream: :class:`runctl.bus.client.TeamConsumers`)."""
        assert self.bus is not None, "start() first"
        consumer = await self.bus.consumer(spec)
        self.consumers.append(consumer)
        self.spawn(consumer.run(handler))
        return consumer

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a background task for the life of the service; its crash stops the service (and the supervisor
        restarts it) rather than leaving it half-alive."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self.stopping.is_set():
            return
        error = task.exception()
        if error is not None:
            log_failure(log, "background task failed", error)
            self.stopping.set()

    async def _health(self, msg: Msg) -> None:
        info: dict[str, Any] = {}
        for provider in self._health_extra:
            info.update(provider())
        info |= {
            "service": self.name,
            "pid": os.getpid(),
            "ready": self.ready,
            "uptime_s": round(time.time() - self.started_at, 3),
            "metrics_url": self.metrics_url,
            "consumers": {
                c.spec.durable: {
                    "handled": c.stats.handled,
                    "errors": c.stats.errors,
                    "redelivered": c.stats.redelivered,
                    "dead_lettered": c.stats.dead_lettered,
                    "recreated": c.stats.recreated,
                    "lag": c.stats.lag,
                    "last_error": c.stats.last_error,
                }
                for c in self.consumers
            },
        }
        await msg.respond(json.dumps(info).encode())

    def request_stop(self) -> None:
        self.stopping.set()

    async def serve(self) -> None:
        """Wait for SIGTERM/SIGINT (or a crashed task), then shut down gracefully."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        await self.stopping.wait()
        log.info("stopping: finishing in-flight work and draining")
        for consumer in self.consumers:
            consumer.stop()
        for callback in self._on_stop:
            await callback()
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=10)
            for task in still:
                task.cancel()
        for consumer in self.consumers:
            await consumer.close()
        if self._metrics_server is not None:
            self._metrics_server.close()
        if self.bus is not None:
            await self.bus.drain()
        log.info("stopped")


S = TypeVar("S", bound="ServiceSettings")


@overload
def run_service(main: Callable[[ServiceRuntime], Awaitable[None]], name: str) -> None: ...


@overload
def run_service(main: Callable[[ServiceRuntime, S], Awaitable[None]], name: str, settings: type[S]) -> None: ...


def run_service(main: Callable[..., Awaitable[None]], name: str, settings: type[ServiceSettings] | None = None) -> None:
    """Entry point helper for ``python -m services.<name>``: logging, the service's settings, the runtime, asyncio.

    ``settings`` (the service's settings model) is read from the environment before anything starts, and handed to
    ``main`` with the runtime: a value it cannot take stops the service at once with one line naming it.
    """
    setup_logging(name)

    async def go() -> None:
        configured = settings.from_env() if settings is not None else None
        runtime = ServiceRuntime(name)
        await runtime.start()
        await (main(runtime) if configured is None else main(runtime, configured))
        runtime.ready = True  # consumers exist: health now says the service is doing its job
        await runtime.serve()

    try:
        asyncio.run(go())
    except RunctlError as e:  # a setting it cannot take, a bus it cannot reach: one line that names the fix
        logging.getLogger(name).error("%s cannot start: %s: %s", name, type(e).__name__, e.message)
        raise SystemExit(1) from None
