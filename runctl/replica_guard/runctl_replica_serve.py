"""vLLM's OpenAI server for a replica on a machine without GPUs, its engine core forked rather than spawned.

``python -m runctl_replica_serve ARGS`` is ``python -m vllm.entrypoints.openai.api_server ARGS`` with one change.
vLLM's server runs its engine core in a child process; on CPU, vLLM's platform code sets
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` whatever the environment says, so that child starts a fresh Python that imports
torch and vLLM all over again: about 15 of a replica's 40 CPU seconds before it answers, and as many seconds of its
wall time (``bench/replica_start.py``). Forked, the child starts with the server's modules already loaded. The API
server has loaded no weights and run no model when it forks, and the engine core binds its OpenMP threads itself, as
a spawned one does; vLLM's default on GPUs is fork too, as long as CUDA is not yet initialised.

``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in the replica's environment keeps vLLM's spawn (the way back, should a
machine's OpenMP runtime not survive the fork). Where vLLM's CPU platform no longer has the method this wraps, the
server starts as vLLM starts it, and says so on its log.

Standard library only at import: it runs as the replica's main module, found on ``PYTHONPATH`` beside the key guard.
"""

from __future__ import annotations

import os
import runpy
import sys

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
SERVER = "vllm.entrypoints.openai.api_server"


def fork_engine_core() -> bool:
    """Make vLLM's CPU platform leave the engine core's start method at fork; whether it could."""
    if os.environ.get(METHOD_ENV) == "spawn":
        return False
    from vllm.platforms import cpu

    platform = getattr(cpu, "CpuPlatform", None)
    configure = getattr(platform, "check_and_update_config", None)
    if platform is None or configure is None:
        print(f"runctl_replica_serve: vLLM's CPU platform has no check_and_update_config; {METHOD_ENV} as vLLM sets it")
        return False
    wrapped = configure.__func__

    def check_and_update_config(cls: type, vllm_config: object) -> None:
        wrapped(cls, vllm_config)
        os.environ[METHOD_ENV] = "fork"

    platform.check_and_update_config = classmethod(check_and_update_config)
    return True


def main() -> None:
    fork_engine_core()
    sys.argv[0] = SERVER
    runpy.run_module(SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
