"""What each test costs and what it starts: a pytest plugin of the suite's own (registered by tests/conftest.py).

In the process that reports (pytest's, or xdist's controller) it keeps every test's duration, setup + call +
teardown, as the worker measured it, and a background thread looks at the machine's processes once a second:
pytest sets ``PYTEST_CURRENT_TEST`` in the environment of the test it is running, every process a test starts
inherits it (a Ray worker three forks down and a daemonised stack too), so each server the suite starts is charged
to the test, or the fixture set up for it, that started it (and only this run's: the run's shared folder,
``PYTEST_RUNCTL_SHARED``, is in their environment too). Reading another process's environment needs the same
user or root; where it is refused the test's servers are simply not listed.

It charges CPU the same way: each process's own CPU time (user + system, as last sampled) goes to the test that
started it, by kind (a process of no kind takes its parent's: vLLM's engine core is ``vllm``), and each worker adds
the CPU time its own process spent in each test (:class:`WorkerCPU`). The suite is bound by its CPU work on a
machine of CI's kind, so this, not a test's wall time, says what a change saves. What it cannot see: a process
that lives less than a second (a sandboxed command, say), and a session-scoped server's CPU after the test that
started it (the worker's ``served_model`` is charged to its first test).

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.infra import shared

#: What a process is, from its command line: the first pattern that matches names it.
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # The server itself, not the group watcher whose command line ends with the server's (a replica of a run).
    ("vllm", re.compile(r"^\S+ -m (vllm\.entrypoints\.openai\.api_server|runctl_replica_serve)( |$)")),
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
    ("ray-worker", re.compile(r"^ray::")),
)
#: The kind of a process of no kind whose parent is of none either.
OTHER = "other"
TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
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


def stat_of(pid: str) -> tuple[int, int, int] | None:
    """A process's parent, start time (clock ticks since boot: with the pid, a process's identity) and CPU time so
    far (user + system, clock ticks), from ``/proc/PID/stat``; None once it is gone."""
    fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()
    if len(fields) < 20:
        return None
    return int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12])


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
    worker_cpu_s: float = 0.0
    """CPU time of the worker's own process in the test's setup, call and teardown."""
    cpu_ticks: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """CPU time of the processes the test started, by kind, in clock ticks (summed at the end)."""

    def starts(self) -> dict[str, int]:
        return {kind: len(pids) for kind, pids in sorted(self.started.items())}

    def cpu_by_kind(self) -> dict[str, float]:
        return {kind: round(t * TICK_S, 1) for kind, t in sorted(self.cpu_ticks.items()) if t}

    def cpu_s(self) -> float:
        return self.worker_cpu_s + sum(self.cpu_ticks.values()) * TICK_S


@dataclass
class Process:
    """A process of this run, as last sampled."""

    test: str
    kind: str
    cpu_ticks: int = 0


class Timings:
    """The plugin object: durations from the reports, starts from the process sampler."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.records: dict[str, Record] = defaultdict(Record)
        self.processes: dict[tuple[int, int], Process] = {}
        """This run's processes by pid and start time."""
        self.others: set[tuple[int, int]] = set()
        """Processes of no test of this run (looked at once)."""
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
        stats = {int(pid): stat for pid in os.listdir("/proc") if pid.isdigit() and (stat := stat_of(pid))}
        for pid, (parent, began, ticks) in sorted(stats.items(), key=lambda kv: kv[1][1]):  # parents first
            key = (pid, began)
            if key in self.others:
                continue
            process = self.processes.get(key)
            if process is None or process.kind == OTHER:  # a fork not yet exec'd has its parent's command line
                cmdline = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
                kind = kind_of(cmdline)
                if process is None:
                    test = current_test_of(str(pid), self.run)
                    if test is None:
                        self.others.add(key)
                        continue
                    up = stats.get(parent)
                    above = self.processes.get((parent, up[1])) if up else None
                    process = self.processes[key] = Process(test, kind or (above.kind if above else OTHER))
                elif kind is not None:
                    process.kind = kind
                if kind is not None:
                    self.records[process.test].started[kind].add(pid)
            process.cpu_ticks = ticks

    def charge(self) -> None:
        """Each test's processes' CPU time, by kind, as last sampled."""
        for record in self.records.values():
            record.cpu_ticks.clear()
        for process in self.processes.values():
            self.records[process.test].cpu_ticks[process.kind] += process.cpu_ticks

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = self.records[plain_nodeid(report.nodeid)]
        record.duration_s += report.duration
        record.ended_s = time.monotonic() - self.began
        record.worker_cpu_s += sum(float(str(v)) for k, v in report.user_properties if k == WorkerCPU.KEY)
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
        self.charge()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        rows = {
            nodeid: {"duration_s": round(r.duration_s, 2), "outcome": r.outcome, "worker": r.worker,
                     "ended_s": round(r.ended_s, 1), "starts": r.starts(), "cpu_s": round(r.cpu_s(), 1),
                     "worker_cpu_s": round(r.worker_cpu_s, 1), "cpu_by_kind": r.cpu_by_kind()}
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
            terminalreporter.write_line(
                f"{record.duration_s:8.1f}s {record.cpu_s():7.0f} CPU-s  {nodeid}" + (f"  [{starts}]" if starts else "")
            )
        self.charge()
        by_kind: dict[str, float] = defaultdict(float)
        for record in ran.values():
            by_kind["pytest workers"] += record.worker_cpu_s
            for kind, seconds in record.cpu_by_kind().items():
                by_kind[kind] += seconds
        terminalreporter.write_line(
            f"CPU charged to tests: {sum(by_kind.values()) / 60:.1f} min ("
            + ", ".join(f"{k} {s / 60:.1f}" for k, s in sorted(by_kind.items(), key=lambda kv: -kv[1]))
            + ")"
        )
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


class WorkerCPU:
    """In the process that runs the tests (a worker, or pytest's own): the CPU time it spent in each phase of each
    test, sent with the phase's report."""

    KEY = "runctl_cpu_s"

    def __init__(self) -> None:
        self.mark = time.process_time()

    @pytest.hookimpl
    def pytest_runtest_logstart(self) -> None:
        self.mark = time.process_time()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self) -> Iterator[None]:
        outcome = yield
        report = outcome.get_result()  # type: ignore[attr-defined]
        now = time.process_time()
        # A list of its own: the report's is the item's, which each phase's report would repeat.
        report.user_properties = [*report.user_properties, (self.KEY, round(now - self.mark, 3))]
        self.mark = now


def register_worker(config: pytest.Config) -> None:
    """Register :class:`WorkerCPU` in a process that runs tests."""
    config.pluginmanager.register(WorkerCPU(), "runctl-worker-cpu")


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
    cpu: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    starts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for nodeid, row in data["tests"].items():
        name = nodeid.split("::")[0]
        seconds[name] += float(row["duration_s"])
        cpu[name] += float(row.get("cpu_s", 0))
        counts[name] += 1
        for kind, n in row["starts"].items():
            starts[name][kind] += int(n)
    lines = ["| file | tests | time (s) | CPU (s) | starts |", "|---|---:|---:|---:|---|"]
    for name in sorted(seconds, key=lambda n: (-cpu[n], -seconds[n])):
        listed = ", ".join(f"{k} {n}" for k, n in sorted(starts[name].items()))
        lines.append(f"| `{name}` | {counts[name]} | {seconds[name]:.0f} | {cpu[name]:.0f} | {listed} |")
    lines.append(
        f"| **all** | {sum(counts.values())} | {sum(seconds.values()):.0f} | {sum(cpu.values()):.0f} "
        f"| wall {data['wall_s']:.0f} s |"
    )
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
