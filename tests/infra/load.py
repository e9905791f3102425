"""Run a command while busy processes keep the machine's cores loaded: the suite's load test.

    python -m tests.infra.load [--busy N] [--nice K] -- COMMAND [ARG ...]

Starts ``N`` processes (default: one per core) that spin without pause at niceness ``K`` (default 0: they compete
with the command as equals), runs the command, stops them (by PID) when it ends however it ends, and exits with
the command's exit code. A test that passes alone but fails here waits on something load delays (a fixed timeout
shorter than the work, a probe starved by a busy event loop): fix it at the cause.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

SPIN = "while True: pass"


def start_busy(count: int, nice: int = 0) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that spin at niceness ``nice`` until killed (each in a session of its own)."""
    program = f"import os\nos.nice({nice})\n{SPIN}\n"
    return [subprocess.Popen([sys.executable, "-c", program], start_new_session=True) for _ in range(count)]


def stop_busy(busy: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in busy:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes (default: one per core)")
    parser.add_argument("--nice", type=int, default=0, help="their niceness (default 0: as the command's)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run under load, after --")
    busy = start_busy(args.busy, args.nice)
    print(f"load: {len(busy)} busy processes (PIDs {', '.join(str(p.pid) for p in busy)})", flush=True)
    try:
        return subprocess.call(command)
    finally:
        stop_busy(busy)


if __name__ == "__main__":
    sys.exit(main())
