"""Errors of the proxy: each ``ProxyError`` is the HTTP error a client of a session gets.

RunctlError (runctl.errors)
├── ProxyStartError        the proxy cannot listen where it was told to
└── ProxyError             a request the proxy could not serve; ``status`` and ``kind`` make its HTTP error
    ├── TranslationError   400: an Anthropic request the OpenAI API cannot express
    ├── NoReplica          503: no replica can take a request now
    └── UpstreamError      502: a replica failed at the transport level (``answered``: whether a byte came back)
        └── UpstreamTimeout  504: no response headers in time (the replica may still be working: not retried)
"""

from __future__ import annotations

from runctl.errors import RunctlError

NOT_FOUND = b'{"error": {"message": "Not Found", "type": "not_found_error", "code": 404}}'
"""What any unknown path gets, an unknown or closed session's among them (a closed session looks like none)."""


class ProxyStartError(RunctlError):
    """The proxy cannot listen on its address or socket."""


class ProxyError(RunctlError):
    """A request the proxy refuses or cannot serve, as the HTTP error its client gets."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class TranslationError(ProxyError):
    """An Anthropic request the proxy cannot express in the OpenAI API."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


class NoReplica(ProxyError):
    """No replica can take a request now."""

    def __init__(self, message: str) -> None:
        super().__init__(503, message, "service_unavailable")


class UpstreamError(ProxyError):
    """A request to an upstream failed at the transport level.

    Attributes:
        answered: False when no byte of a response arrived, so the request can be sent to another replica.
    """

    def __init__(self, message: str, answered: bool, status: int = 502) -> None:
        super().__init__(status, message, "upstream_error")
        self.answered = answered


class UpstreamTimeout(UpstreamError):
    """No response headers within the time allowed (the upstream may still be working on it: not retried)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, answered=True, status=504)
