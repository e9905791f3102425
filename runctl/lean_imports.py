"""nats-py without aiohttp, which it imports only for a transport runctl never uses.

nats-py's ``nats.aio.transport`` imports aiohttp, if installed, for its WebSocket transport (``ws://``, ``wss://``):
0.17-0.19 s of every process that talks to the bus (each service, runner and bus command of the CLI; about a fifth
of such a command's imports). runctl speaks to NATS over ``nats://`` and ``tls://`` alone (``runctl.bus`` refuses a
WebSocket URL, saying so). :func:`install` (run by ``runctl/__init__.py``) makes that one module see no aiohttp while
it runs; aiohttp itself is untouched, and imports as usual for whatever else wants it, before or after.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

#: The module whose import of aiohttp is skipped.
TRANSPORT = "nats.aio.transport"
SKIPPED = "aiohttp"


class WithoutAiohttp(importlib.abc.MetaPathFinder):
    """Finds ``nats.aio.transport`` as the other finders do, and runs it with ``aiohttp`` absent (unless aiohttp is
    imported already: then nothing is saved, and nothing changes)."""

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if fullname != TRANSPORT:
            return None
        sys.meta_path.remove(self)  # once: the finders after this one find it
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            if SKIPPED in sys.modules:
                run(module)
                return
            sys.modules[SKIPPED] = None  # type: ignore[assignment]  # `import aiohttp` raises ImportError
            try:
                run(module)
            finally:
                if sys.modules.get(SKIPPED, ...) is None:
                    del sys.modules[SKIPPED]

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader
        return spec


def install() -> None:
    """Skip aiohttp in nats-py's transport module, unless it is imported already."""
    if TRANSPORT in sys.modules or any(isinstance(f, WithoutAiohttp) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, WithoutAiohttp())
