"""The runner's end of the relay for sandboxes that bind nothing of the runner's machine (pods): the relay runs in
the sandbox with its stdin and stdout as an exec stream (``relay.py … -``), and each connection an agent opens to
it arrives here as frames; this end dials the proxy's Unix socket for it and carries both ways.

It dials that one socket and nothing else, whatever the frames say; a stream that stops speaking the protocol (an
agent that took over the relay's output, say) ends the tunnel, and with it only that trial's connections.
"""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path
from types import TracebackType

from services.launcher.rollout.agents.relay import Mux, ProtocolError, dial
from services.sandbox.library import ExecStream

log = logging.getLogger(__name__)
#: How long one read of the stream waits, so that a closed tunnel's thread notices within it.
READ_S = 0.5


class Tunnel:
    def __init__(self, stream: ExecStream, socket_path: Path) -> None:
        self.stream = stream
        self.socket_path = socket_path
        self.mux = Mux(stream.write, self._dial)
        self.error: str | None = None
        """Why the tunnel ended before it was closed (None: it did not)."""
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._carry, name="relay-tunnel", daemon=True)

    def __enter__(self) -> Tunnel:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _dial(self) -> socket.socket | None:
        return dial(str(self.socket_path))

    def _carry(self) -> None:
        try:
            while not self._closing.is_set():
                data = self.stream.read(READ_S)
                if data is None:
                    if not self._closing.is_set():
                        self.error = "the relay's exec stream ended"
                    break
                if data:
                    self.mux.feed(data)
        except (ProtocolError, OSError) as e:
            self.error = f"the relay's stream broke off: {e}"
        finally:
            if self.error:
                log.warning("relay tunnel to %s: %s", self.socket_path, self.error)
            self.mux.close()

    def close(self) -> None:
        """End the stream (the relay in the sandbox ends with it) and every connection it carried."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout=READ_S * 4)  # it notices within one read: then the stream is this thread's
        self.stream.close()
        self.mux.close()
