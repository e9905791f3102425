"""A small HTTP/1.1 server and keep-alive client on asyncio protocols, for the proxy's hot path.

The proxy's budget is well under a millisecond per request on a shared core, which general-purpose frameworks
spend on routing, middleware and header objects. This module does only what the proxy needs: requests with a
body of known length or chunked, keep-alive, pipelined requests answered in order, responses with a length or
streamed in chunks with backpressure, and an upstream connection pool that tells "the upstream never answered"
(safe to send elsewhere) from "the upstream failed mid-answer". Parsing is httptools (llhttp).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus

import httptools

from runctl.errors import log_failure
from services.proxy.errors import UpstreamError, UpstreamTimeout

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class ClientGone(Exception):
    """The client closed its connection before the response was complete."""


class Request:
    """One parsed request. Header names are lower-case bytes."""

    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive")

    def __init__(
        self, method: str, path: str, query: bytes, headers: dict[bytes, bytes], body: bytes, keep_alive: bool
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")


class Responder:
    """Writes the response to one request: either :meth:`send` once, or :meth:`start_stream`, chunks, :meth:`end`."""

    __slots__ = ("_conn", "keep_alive", "started", "status")

    def __init__(self, conn: _ServerConnection, keep_alive: bool) -> None:
        self._conn = conn
        self.keep_alive = keep_alive
        self.started = False
        self.status = 0

    @property
    def client_gone(self) -> bool:
        return self._conn.lost

    def cancel_when_gone(self) -> None:
        """Cancel the task handling this request if the client disconnects before the response is complete (so an
        upstream call in progress is abandoned, and the upstream stops generating)."""
        self._conn.on_lost = asyncio.current_task()

    def _head(self, status: int, content_type: bytes, extra: bytes, length: int | None) -> bytes:
        self.started = True
        self.status = status
        framing = b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
        close = b"" if self.keep_alive else b"connection: close\r\n"
        reason = _REASONS.get(status, b"")
        return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%s%s\r\n" % (
            status,
            reason,
            content_type,
            framing,
            close,
            extra,
        )

    def send(self, status: int, body: bytes, content_type: bytes = b"application/json", extra: bytes = b"") -> None:
        """The whole response at once. ``extra`` is raw header lines, each ending in CRLF."""
        if self._conn.lost:
            return
        self._conn.transport.write(self._head(status, content_type, extra, len(body)) + body)  # type: ignore[union-attr]

    def start_stream(self, status: int, content_type: bytes = b"text/event-stream", extra: bytes = b"") -> None:
        if self._conn.lost:
            raise ClientGone
        extra = b"cache-control: no-cache\r\n" + extra
        self._conn.transport.write(self._head(status, content_type, extra, None))  # type: ignore[union-attr]

    async def write(self, data: bytes) -> None:
        """One chunk of a streamed response; waits while the client reads slower than we write."""
        conn = self._conn
        if conn.lost:
            raise ClientGone
        if data:
            conn.transport.write(b"%x\r\n%s\r\n" % (len(data), data))  # type: ignore[union-attr]
        if not conn.writable.is_set():
            await conn.writable.wait()
            if conn.lost:
                raise ClientGone

    def end(self) -> None:
        if not self._conn.lost:
            self._conn.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]


Handler = Callable[[Request, Responder], Awaitable[None]]


class _ServerConnection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.on_lost: asyncio.Task[object] | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.pending: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._size = 0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.writable.set()
        self.server.connections.discard(self)
        if self.on_lost is not None:
            self.on_lost.cancel()
            self.on_lost = None

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, b"protocol upgrades are not supported")
        except httptools.HttpParserError:
            self._reject(400, b"malformed HTTP request")
        except _TooLarge:
            self._reject(413, b"request body too large")

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        # curl and others wait (a second, for curl) for this before sending a large body
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_BODY_BYTES:
            raise _TooLarge
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = httptools.parse_url(self._url)
        request = Request(
            self.parser.get_method().decode(),
            url.path.decode("latin-1"),
            url.query or b"",
            self._headers,
            b"".join(self._body),
            self.parser.should_keep_alive(),
        )
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._serve(request))
        else:
            self.pending.append(request)
            if len(self.pending) > 8 and self.transport is not None:
                self.transport.pause_reading()

    async def _serve(self, request: Request | None) -> None:
        while request is not None:
            responder = Responder(self, request.keep_alive and not self.server.closing)
            try:
                await self.server.handler(request, responder)
            except ClientGone:
                pass
            except Exception as e:
                log_failure(log, f"{request.method} {request.path} failed", e)
                if not responder.started:
                    responder.send(500, b'{"error": {"message": "internal proxy error", "type": "proxy_error"}}')
                else:
                    responder.keep_alive = False
            self.on_lost = None
            if self.lost:
                break
            if not responder.keep_alive:
                self.transport.close()  # type: ignore[union-attr]
                break
            request = self.pending.popleft() if self.pending else None
            if self.transport is not None and len(self.pending) <= 8:
                self.transport.resume_reading()
        self.task = None

    def _reject(self, status: int, message: bytes) -> None:
        if self.transport is None or self.lost:
            return
        body = b'{"error": {"message": "%s", "type": "invalid_request_error"}}' % message
        Responder(self, keep_alive=False).send(status, body)
        self.transport.close()


class _TooLarge(Exception):
    pass


class HttpServer:
    """Serves ``handler`` on ``host:port`` (port 0: an ephemeral one, readable from :attr:`port` after start)."""

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0, unix_path: str | None = None) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.unix_path = unix_path
        self.connections: set[_ServerConnection] = set()
        self.closing = False
        self._server: asyncio.base_events.Server | None = None
        self._unix_server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), self.host, self.port, reuse_address=True, backlog=2048
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.unix_path:
            self._unix_server = await loop.create_unix_server(
                lambda: _ServerConnection(self), self.unix_path, backlog=2048
            )

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in progress finish for up to ``grace_s``, then close every connection."""
        self.closing = True
        for server in (self._server, self._unix_server):
            if server is not None:
                server.close()
        busy = [c.task for c in self.connections if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace_s)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for server in (self._server, self._unix_server):
            if server is not None:
                await server.wait_closed()


# ---------------------------------------------------------------------------------------------------------- client


class UpstreamResponse:
    """A response whose status and headers have arrived; read the body whole or as it comes."""

    __slots__ = ("status", "headers", "_conn")

    def __init__(self, conn: _ClientConnection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers = conn.headers

    async def read(self) -> bytes:
        return await self._conn.read_all()

    def chunks(self) -> AsyncIterator[bytes]:
        return self._conn.iter_chunks()

    def close(self) -> None:
        """Abandon the rest of the body (the connection is closed, not reused)."""
        self._conn.abort()


class _ClientConnection(asyncio.Protocol):
    def __init__(self, pool: UpstreamClient) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.busy = False
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self._got_bytes = False
        self._headers_done: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._more = asyncio.Event()
        self._complete = False
        self._error: UpstreamError | None = None
        self._keep_alive = True
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.busy and not self._complete:
            self._fail(
                UpstreamError(f"upstream closed the connection{': ' + str(exc) if exc else ''}", self._got_bytes)
            )

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"malformed response from upstream: {e}", True))
            self.abort()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.status = self.parser.get_status_code()
        self._keep_alive = self.parser.should_keep_alive()
        if self._headers_done is not None and not self._headers_done.done():
            self._headers_done.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._more.set()

    def on_message_complete(self) -> None:
        self._complete = True
        self._more.set()

    def _fail(self, error: UpstreamError) -> None:
        self._error = error
        if self._headers_done is not None and not self._headers_done.done():
            self._headers_done.set_exception(error)
        self._more.set()

    def abort(self) -> None:
        self._keep_alive = False
        if self.transport is not None:
            self.transport.close()

    def _timed_out(self, timeout_s: float) -> None:
        # On the loop, like the parser callbacks: either the headers came first (and this timer was cancelled) or
        # the request fails here and its connection is closed. No response can be dropped with its socket open.
        self._timer = None
        self._fail(UpstreamTimeout(f"no answer within {timeout_s:g}s"))
        self.abort()

    async def send(self, head: bytes, body: bytes, timeout_s: float | None = None) -> UpstreamResponse:
        self.busy = True
        self.status = 0
        self.headers = {}
        self._got_bytes = False
        self._chunks.clear()
        self._more.clear()
        self._complete = False
        self._error = None
        loop = asyncio.get_running_loop()
        self._headers_done = loop.create_future()
        if timeout_s is not None:
            self._timer = loop.call_later(timeout_s, self._timed_out, timeout_s)
        self.transport.write(head + body)  # type: ignore[union-attr]
        try:
            await self._headers_done
        except BaseException:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            raise
        return UpstreamResponse(self)

    async def read_all(self) -> bytes:
        while not self._complete:
            if self._error is not None:
                raise self._error
            self._more.clear()
            try:
                await self._more.wait()
            except asyncio.CancelledError:
                self.abort()
                raise
        body = b"".join(self._chunks)
        self._finish()
        return body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        try:
            while True:
                while self._chunks:
                    yield self._chunks.popleft()
                if self._complete:
                    break
                if self._error is not None:
                    raise self._error
                self._more.clear()
                await self._more.wait()
        finally:
            if self._complete:
                self._finish()
            else:
                self.abort()
                self.busy = False

    def _finish(self) -> None:
        self.busy = False
        if self._keep_alive and not self.lost:
            self.pool.release(self)
        else:
            self.abort()


class UpstreamClient:
    """Keep-alive connections to one upstream ``host:port``."""

    def __init__(
        self, host: str, port: int, connect_timeout_s: float = 5.0, max_idle: int = 256, key: str | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: list[_ClientConnection] = []
        # The host line, then the bearer key the upstream requires (a run's replica key): every request sends both.
        if key is not None and (not key.isprintable() or " " in key):
            raise ValueError("an upstream key is one printable word (no spaces or line breaks)")
        auth = b"\r\nauthorization: Bearer %s" % key.encode() if key else b""
        self._host_and_key = f"{host}:{port}".encode() + auth

    async def _connect(self) -> _ClientConnection:
        loop = asyncio.get_running_loop()
        attempt = asyncio.ensure_future(loop.create_connection(lambda: _ClientConnection(self), self.host, self.port))
        try:
            done, _ = await asyncio.wait({attempt}, timeout=self.connect_timeout_s)
        except asyncio.CancelledError:
            _abandon(attempt)
            raise
        if not done:
            _abandon(attempt)
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: timed out", False)
        try:
            _, conn = attempt.result()
        except OSError as e:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {e}", False) from e
        return conn

    def release(self, conn: _ClientConnection) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.abort()

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        content_type: bytes = b"application/json",
        timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send a request; returns once the status and headers are in (within ``timeout_s``, when given).

        Raises:
            UpstreamTimeout: no headers in time (the connection is closed).
            UpstreamError: the transport failed; ``answered`` says whether any response byte had arrived.
        """
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            method.encode(),
            path.encode(),
            self._host_and_key,
            content_type,
            len(body),
        )
        while self._idle:
            conn = self._idle.pop()
            if conn.lost:
                continue
            try:
                return await conn.send(head, body, timeout_s)
            except UpstreamError as e:
                if e.answered:
                    raise
                conn.abort()  # a kept-alive connection the upstream had closed: try a fresh one
            except asyncio.CancelledError:
                conn.abort()  # the upstream sees the disconnect and stops generating
                raise
        conn = await self._connect()
        try:
            return await conn.send(head, body, timeout_s)
        except (UpstreamError, asyncio.CancelledError):
            conn.abort()
            raise

    def close(self) -> None:
        for conn in self._idle:
            conn.abort()
        self._idle.clear()


def _abandon(attempt: asyncio.Future[tuple[asyncio.Transport, _ClientConnection]]) -> None:
    """Cancel a connection attempt; if it completes anyway, close what it opened."""

    def close(done: asyncio.Future[tuple[asyncio.Transport, _ClientConnection]]) -> None:
        if not done.cancelled() and done.exception() is None:
            done.result()[0].close()

    attempt.add_done_callback(close)
    attempt.cancel()
