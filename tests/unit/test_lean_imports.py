"""nats-py's transport module without aiohttp (runctl/lean_imports.py), and the WebSocket URL it would have served."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from runctl.bus import Bus
from runctl.errors import BusUnreachableError
from tests.conftest import ROOT


def python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[-1]


def test_a_process_on_the_bus_does_not_import_aiohttp_and_may_still_import_it() -> None:
    # Every service, runner and bus command imported it for nats-py's WebSocket transport: 0.2-0.4 CPU-s a start.
    assert python("import sys, runctl.bus; print('aiohttp' in sys.modules)") == "False"
    assert python("import runctl.bus, nats.aio.transport as t; print(t.aiohttp is None)") == "True"
    # Whoever wants aiohttp gets it, after nats-py as before it, and nats-py gets it when it was there first.
    assert python("import runctl.bus, aiohttp.web; print(aiohttp.web.Application.__name__)") == "Application"
    assert python("import aiohttp, runctl.bus, nats.aio.transport as t; print(t.aiohttp is aiohttp)") == "True"


def test_a_websocket_bus_url_is_refused_saying_which_schemes_work() -> None:
    for url in ("ws://127.0.0.1:1", "wss://user:secret@bus.example:443"):
        with pytest.raises(BusUnreachableError, match=r"nats:// or tls://, not WebSocket") as refused:
            asyncio.run(Bus.connect(url))
        assert "secret" not in str(refused.value)
