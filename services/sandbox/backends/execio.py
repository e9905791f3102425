"""Shell snippets every backend runs inside a sandbox, and the output buffer they share.

Killing a timed-out command must reach every process it started, inside the sandbox, not only the client's
end of the connection (a known way for other tools to leave commands running for hours). Each command runs
under a wrapper that reports its PID first; on timeout a second command kills that PID's whole tree and its
process group, using only POSIX ``sh`` and ``/proc`` so that it works in minimal images.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field

from services.sandbox.backends.base import ExecResult

PID_MARK = b"@runctl-pid "

#: Runs ``$1`` with ``sh -c`` after writing its PID to stderr (the backend strips that line). First it makes itself
#: (and so everything the command starts) the OOM killer's first choice: when a command outgrows the sandbox's memory
#: limit, the kernel kills the command's processes, never the sandbox's init or idle loop (which would end the
#: container, and with it the trial's verifier). Raising one's own ``oom_score_adj`` needs no privilege.
WRAPPER = '{ echo 1000 > /proc/self/oom_score_adj; } 2>/dev/null; echo "@runctl-pid $$" >&2; exec sh -c "$1"'

#: Stops, then kills, the tree under PID ``$1`` (children found through /proc/*/stat, stopped as they are found so
#: that nothing forks during the walk), and its process group when it leads one. A process's name may hold
#: spaces or parentheses, so fields are read after the last ")": state, ppid, pgrp.
KILL_TREE = r"""
walk() {
  local p=$1 f s rest kids=""
  kill -STOP "$p" 2>/dev/null
  found="$found $p"
  for f in /proc/[0-9]*/stat; do
    { read -r s < "$f"; } 2>/dev/null || continue
    rest=${s##*) }
    set -- $rest
    [ "$2" = "$p" ] && { f=${f#/proc/}; kids="$kids ${f%/stat}"; }
  done
  for f in $kids; do walk "$f"; done
}
found=""
root=$1
{ read -r s < "/proc/$root/stat"; } 2>/dev/null || exit 0
rest=${s##*) }
set -- $rest
[ "$3" = "$root" ] && kill -9 -- "-$root" 2>/dev/null
walk "$root"
kill -9 $found 2>/dev/null
exit 0
"""


def run_script(path: str) -> str:
    """Run a script with bash where the image has it (Harbor's scripts are bash), else with sh."""
    return f"if command -v bash >/dev/null; then bash {path}; else sh {path}; fi"


def wrapped(command: str) -> list[str]:
    """argv that runs ``command`` under the PID-reporting wrapper."""
    return ["sh", "-c", WRAPPER, "runctl-exec", command]


def kill_tree_argv(pid: int) -> list[str]:
    return ["sh", "-c", KILL_TREE, "runctl-kill", str(pid)]


def quoted(path: str) -> str:
    return shlex.quote(path)


@dataclass
class Capture:
    """Collects one stream up to ``limit`` bytes; records whether more arrived."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.data += chunk


def exec_result(code: int, out: Capture, err: Capture, stderr: bytes, timed_out: bool, started: float) -> ExecResult:
    """The result of a command; a timed-out one exits 124, as ``timeout`` reports it."""
    return ExecResult(
        exit_code=124 if timed_out else code,
        stdout=bytes(out.data).decode(errors="replace"),
        stderr=stderr.decode(errors="replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        truncated=out.truncated or err.truncated,
    )


def split_pid(stderr: bytes) -> tuple[int | None, bytes]:
    """The PID the wrapper reported, and stderr without that line."""
    if not stderr.startswith(PID_MARK):
        return None, stderr
    line, _, rest = stderr.partition(b"\n")
    try:
        return int(line[len(PID_MARK) :]), rest
    except ValueError:
        return None, stderr
