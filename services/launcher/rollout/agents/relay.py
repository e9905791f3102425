"""Relay TCP connections on a loopback address to a Unix socket (standard library only).

It runs inside a sandbox that has no network but loopback, next to an installed agent, so that the agent can reach
the proxy at ``http://127.0.0.1:PORT`` — and only the proxy, whose socket the runner binds into the sandbox:
``python relay.py 127.0.0.1:PORT /runctl/proxy/proxy.sock READY_FILE``. It writes ``READY_FILE`` once listening.
"""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(argv: list[str]) -> int:
    address, path, ready = argv[1], argv[2], argv[3]
    host, port = address.rsplit(":", 1)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(128)
    Path(ready).write_text("ready\n")
    while True:
        client, _ = listener.accept()
        threading.Thread(target=serve, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
