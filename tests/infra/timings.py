"""What each test costs and what it starts: a pytest plugin of the suite's own (registered by tests/conftest.py).

In the process that reports (pytest's, or xdist's controller) it keeps every test's duration, setup + call +
teardown, as the worker measured it, and a background thread looks at the machine's processes once a second:
pytest sets ``PYTEST_CURRENT_TEST`` in the environment of the test it is running, every process a test starts
inherits it (a Ray worker three forks down and a daemonised stack too), so each server the suite starts is charged
to the test, or the fixture set up for it, that started it (and only this run's: the run's shared folder,
``PYTEST_RUNCTL_SHARED``, is in their environment too). Reading another process's environment needs the same
user or root; where it is refused the test's servers are simply not listed.

At the end it prints the slowest tests with their starts and the sum, and writes every test's record to
``test-artifacts/timings.json`` (``RUNCTL_TEST_TIMINGS`` names another file) for ``docs/testing.md``'s table
(``python -m tests.infra.timings FILE`` prints it).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.infra import shared

#: What a process is, from its command line: the first pattern that matches names it.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The server itself, not the group watcher whose command line ends with the server's (a replica of a run).
    ("vllm", re.compile(r"^\S+ -m vllm\.entrypoints\.openai\.api_server")),
    ("ray-head", re.compile(r"(^|/)gcs_server( |$)")),
    ("ray-node", re.compile(r"(^|/)raylet( |$)")),
    ("dockerd", re.compile(r"(^|/)dockerd( |$)")),
    ("postgres", re.compile(r"/postgresql/\d+/bin/postgres( |$)")),
    ("chromium", re.compile(r"(^|/)chromium( |$)")),
    ("stack", re.compile(r"-m runctl\.supervisor|runctl\.cli\.main up|/runctl up( |$)")),
    ("nats-server", re.compile(r"(^|/)nats-server( |$)")),
    ("service", re.compile(r"-m services\.(validator|launcher|tracker|sandbox|proxy)( |$)")),
    ("sandbox", re.compile(r"(^|/)bwrap( |$)")),
    ("trainer", re.compile(r"services\.launcher\.carry\.job_main|runctl run |runctl demo")),
)
GROUP_SUFFIX = re.compile(r"@[^\[\]/:@]+$")
SAMPLE_S = 1.0
SLOWEST = 25
DEFAULT_FILE = Path(__file__).resolve().parents[2] / "test-artifacts" / "timings.json"


def plain_nodeid(nodeid: str) -> str:
    """The test's id without the ``@group`` xdist's loadgroup appends."""
    return GROUP_SUFFIX.sub("", nodeid)


def kind_of(cmdline: str) -> str | None:
    for kind, pattern in KINDS:
        if pattern.search(cmdline):
            return kind
    return None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def current_test_of(pid: str, run: bytes) -> str | None:
    """The test (node id) of this run a process was started under, from its inherited PYTEST_CURRENT_TEST; None for
    a process of another run (its PYTEST_RUNCTL_SHARED is not ``run``) or of none."""
    env = dict(e.split(b"=", 1) for e in _read(f"/proc/{pid}/environ").split(b"\0") if b"=" in e)
    if env.get(shared.ENV.encode()) != run or b"PYTEST_CURRENT_TEST" not in env:
        return None
    return env[b"PYTEST_CURRENT_TEST"].decode(errors="replace").rsplit(" (", 1)[0]


@dataclass
class Record:
    duration_s: float = 0.0
    outcome: str = "passed"
    worker: str = ""
    ended_s: float = 0.0
    """Seconds from the run's start to the test's last report (what ran at the end, and on which worker)."""
    started: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def starts(self) -> dict[str, int]:
        return {kind: len(pids) for kind, pids in sorted(self.started.items())}


class Timings:
    """The plugin object: durations from the reports, starts from the process sampler."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.records: dict[str, Record] = defaultdict(Record)
        self.seen: set[int] = set()
        self.began = time.monotonic()
        self.cpu_began = cpu_times()
        self.run = os.environ.get(shared.ENV, "").encode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, name="test-timings", daemon=True)
        self._thread.start()

    def _sample_forever(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in self.seen:
                continue
            cmdline = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
            kind = kind_of(cmdline)
            if kind is None:
                continue
            test = current_test_of(pid, self.run)
            self.seen.add(int(pid))
            if test is not None:
                self.records[test].started[kind].add(int(pid))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = self.records[plain_nodeid(report.nodeid)]
        record.duration_s += report.duration
        record.ended_s = time.monotonic() - self.began
        node = getattr(report, "node", None)  # xdist's controller names the worker that ran it
        if node is not None:
            record.worker = str(node.gateway.id)
        if report.failed or (report.skipped and record.outcome == "passed"):
            record.outcome = "error" if report.failed and report.when != "call" else report.outcome

    @pytest.hookimpl
    def pytest_sessionfinish(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()
        if not self.records:
            return  # nothing ran (--collect-only, a subset that selected nothing): the last run's file stays
        self.out.parent.mkdir(parents=True, exist_ok=True)
        rows = {
            nodeid: {"duration_s": round(r.duration_s, 2), "outcome": r.outcome, "worker": r.worker,
                     "ended_s": round(r.ended_s, 1), "starts": r.starts()}
            for nodeid, r in self.records.items()
        }  # fmt: skip
        wall_s = round(time.monotonic() - self.began, 1)
        self.out.write_text(json.dumps({"wall_s": wall_s, "tests": rows}, indent=1, sort_keys=True))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        ran = {k: r for k, r in self.records.items() if r.duration_s > 0}
        if not ran:
            return
        slowest = sorted(ran.items(), key=lambda kv: -kv[1].duration_s)[:SLOWEST]
        terminalreporter.section(f"slowest {len(slowest)} tests (setup + call + teardown)")
        for nodeid, record in slowest:
            starts = ", ".join(f"{k}×{n}" if n > 1 else k for k, n in record.starts().items())
            terminalreporter.write_line(f"{record.duration_s:8.1f}s  {nodeid}" + (f"  [{starts}]" if starts else ""))
        total = sum(r.duration_s for r in ran.values())
        wall = time.monotonic() - self.began
        busy = cpu_busy(self.cpu_began, cpu_times())
        terminalreporter.write_line(
            f"total: {len(ran)} tests, {total / 60:.1f} min of test time in {wall / 60:.1f} min of wall time"
            + (f", the machine's cores {busy:.0%} busy" if busy is not None else "")
            + f" (timings of every test: {self.out})"
        )
        began = os.environ.get("RUNCTL_CI_BEGAN", "")
        if began.isdigit():
            terminalreporter.write_line(f".ci/run so far: {(time.time() - int(began)) / 60:.1f} min, setup included")


def cpu_times() -> tuple[int, int] | None:
    """The machine's CPU time so far, idle (idle + iowait) and in all, in clock ticks (``/proc/stat``)."""
    first = _read("/proc/stat").split(b"\n", 1)[0].split()
    if len(first) < 9:
        return None
    ticks = [int(field) for field in first[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[3] + ticks[4], sum(ticks)


def cpu_busy(began: tuple[int, int] | None, now: tuple[int, int] | None) -> float | None:
    """How busy the cores were between two :func:`cpu_times` readings (every process's, the suite's and others')."""
    if began is None or now is None or now[1] <= began[1]:
        return None
    return 1 - (now[0] - began[0]) / (now[1] - began[1])


def register(config: pytest.Config) -> None:
    """Register the plugin in the process that receives every report (an xdist controller, not its workers)."""
    if not Path("/proc").is_dir():
        return
    out = Path(os.environ.get("RUNCTL_TEST_TIMINGS") or DEFAULT_FILE)
    config.pluginmanager.register(Timings(out), "runctl-timings")


def table(path: Path) -> str:
    """The measured suite as docs/testing.md shows it: per test file, its tests, time and what they start."""
    data = json.loads(path.read_text())
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    starts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for nodeid, row in data["tests"].items():
        name = nodeid.split("::")[0]
        seconds[name] += float(row["duration_s"])
        counts[name] += 1
        for kind, n in row["starts"].items():
            starts[name][kind] += int(n)
    lines = ["| file | tests | time (s) | starts |", "|---|---:|---:|---|"]
    for name in sorted(seconds, key=lambda n: -seconds[n]):
        listed = ", ".join(f"{k} {n}" for k, n in sorted(starts[name].items()))
        lines.append(f"| `{name}` | {counts[name]} | {seconds[name]:.0f} | {listed} |")
    lines.append(f"| **all** | {sum(counts.values())} | {sum(seconds.values()):.0f} | wall {data['wall_s']:.0f} s |")
    return "\n".join(lines)


def write_durations(path: Path) -> int:
    """Write the measured durations where tests/infra/schedule.py reads them; how many tests it now holds. Tests
    that did not pass in this run (or did not run: a subset) keep their earlier figure; tests under a second are left
    out (the scheduler's guess for an unmarked test is close enough)."""
    from tests.infra.schedule import DURATIONS, measured

    tests = json.loads(path.read_text())["tests"]
    passed = {nodeid: row["duration_s"] for nodeid, row in tests.items() if row["outcome"] == "passed"}
    durations = {nodeid: s for nodeid, s in measured().items() if nodeid not in passed}
    durations |= {nodeid: round(s, 1) for nodeid, s in passed.items() if s >= 1.0}
    DURATIONS.write_text(json.dumps(durations, indent=0, sort_keys=True) + "\n")
    return len(durations)


def main(argv: list[str]) -> int:
    """``python -m tests.infra.timings [FILE]`` prints the table; ``--durations [FILE]`` updates the schedule's."""
    if argv[:1] == ["--durations"]:
        print(f"{write_durations(Path(argv[1] if len(argv) > 1 else DEFAULT_FILE))} durations written")
    else:
        print(table(Path(argv[0] if argv else DEFAULT_FILE)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
