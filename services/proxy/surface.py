"""What an API the proxy serves to agents (OpenAI's chat and completions, Anthropic's messages) must say; the rest
of a request's life is the same for all of them (``lifecycle.py``).

A :class:`Surface` parses a client's request into a :class:`Call`: the body to send upstream (always OpenAI's, with
token ids and logprobs asked for) and how to answer the client, whole (:meth:`Call.answer`) or streamed chunk by
chunk (:meth:`Call.relay`), each while the turn's tokens are captured for training; and it says how an error looks
to that API's clients.
"""

from __future__ import annotations

from typing import Any, Protocol

from services.proxy.names import ModelNames
from services.proxy.openai_surface import StreamCapture
from services.proxy.trajectory import Choice

Groups = list[tuple[list[int], list[Choice]]]
"""A response's turns: (prompt token ids, choices) per prompt."""


class Relay(Protocol):
    """One streamed answer: what the client is sent for each server-sent event of the upstream's stream."""

    capture: StreamCapture

    def done(self) -> bytes:
        """For the upstream's ``[DONE]``."""

    def unparsed(self, payload: bytes) -> bytes:
        """For an event whose data is not JSON."""

    def upstream_error(self, obj: dict[str, Any], payload: bytes) -> bytes:
        """For an error object the upstream sent mid-stream (not captured)."""

    def chunk(self, obj: dict[str, Any], payload: bytes) -> bytes:
        """For a chunk, after :attr:`capture` has read it (and hidden what the client did not ask for)."""

    def error(self, status: int, message: str, kind: str) -> bytes:
        """An error event that ends the stream."""

    def finish(self) -> bytes:
        """What ends a stream that ran to its end."""

    def groups(self) -> Groups:
        """The turns the stream carried, as recorded."""


class Call(Protocol):
    """One request, parsed."""

    upstream: dict[str, Any]
    """The OpenAI request sent to the replica."""

    def answer(self, obj: dict[str, Any]) -> tuple[bytes, Groups]:
        """The client's answer to the upstream's whole response, and the turns to record."""

    def relay(self) -> Relay:
        """A relay for the upstream's stream."""


class Surface(Protocol):
    name: str
    """The turn's surface in a trajectory and the metrics' label (``openai.chat``, ``anthropic.messages``)."""
    path: str
    """The upstream path it calls."""

    def call(self, body: dict[str, Any], models: ModelNames, learned: str | None) -> Call:
        """A request of this API; ``models.resolve(asked, learned)`` turns the model name it asks for into the
        served one.

        Raises:
            ProxyError: 400 for a request this API's translation cannot express; what resolving the name raises.
        """

    def error(self, status: int, message: str, kind: str) -> bytes:
        """The body of an error response, in this API's shape."""

    def upstream_failed(self, status: int, data: bytes) -> bytes:
        """The body sent on for a replica's error response (``status`` ≠ 200)."""
