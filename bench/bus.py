"""Benchmark of runctl's event bus: publish throughput against raw nats-py, and publish-to-persisted latency.

Run as ``python bench/bus.py`` from the repository root (with the project's virtualenv active). It starts its own
``nats-server`` with JetStream on a free loopback port, and later the real tracker service, and stops both (by PID)
before it exits. Every figure is measured in this run; targets are checked against ratios and percentiles, not
against absolute numbers from another machine.

1. Throughput. Equally sized ``trial.finished`` events (the high-rate event, TRIALS stream) are published in
   rounds of ``--events`` each, three ways, the order rotating every round so that none always goes first:

   - ``ours``       ``Bus.publish_many(events)``: serializes each event (``Event.to_json``) and publishes it with
                    a ``Nats-Msg-Id`` header, pipelined, its acks collected on one reply subscription.
   - ``raw``        ``js.publish_async(subject, payload, headers={"Nats-Msg-Id": id})`` with the payloads
                    serialized *before* the clock starts (the same bytes ``to_json`` gives), then awaits every
                    future in turn. This is the transport floor; the target ratio ours/raw >= 0.8 is against it.
   - ``raw+json``   as ``raw`` but calling ``Event.to_json()`` inside the timed loop, so that ours/raw+json is
                    what the wrapper alone costs over nats-py (serialization being the same on both sides).

   All three use the same connection; the raw variants use a JetStream context with
   ``publish_async_max_pending`` of 20,000. Every round uses fresh event ids (so JetStream's duplicate window
   never drops one) and the streams are purged before each timed publish, so each starts from an empty stream.

2. Latency. The streams are purged, then ``python -m services.tracker`` is started as a subprocess and awaited
   until it answers its health probe with both consumers registered. The benchmark subscribes to the tracker's
   core-NATS notice (``persisted_subject()``: ``{"ids": [...], "committed_at": unix time}``) and publishes
   ``trial.finished`` events (a ``step.done`` every 100th) with ``Bus.publish`` one at a time, awaiting each ack,
   as an SDK or engine publishes, paced at ``--rate`` events/s against a monotonic schedule for ``--duration``
   seconds, after a short unmeasured warm-up. Latency per event is ``committed_at - time.time()`` taken right
   before the publish (same machine, same clock). p50/p90/p99/max are reported; the target is p99 < 50 ms.

Nothing here changes the project; it only reads it. Exit status is 0 whether or not the targets are met, and
non-zero only when the benchmark itself fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/bus.py` puts bench/ on the path, not the repository root
    sys.path.insert(0, str(ROOT))

from runctl.bus import Bus  # noqa: E402
from runctl.events import Event, StepDone, TrialFinished, new_event  # noqa: E402
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM  # noqa: E402
from runctl.stack import nats_server_binary  # noqa: E402
from runctl.subjects import DEADLETTER_STREAM, health_subject, persisted_subject, team_stream  # noqa: E402

TEAM = "bench"
SOURCE = "/runctl/bench"
RATIO_TARGET = 0.8
P99_TARGET_MS = 50.0
MAX_PENDING = 20_000  # room for a whole round of raw async publishes


# --------------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    """SIGTERM the process we started, wait, SIGKILL if it does not go."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


async def wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(interval_s)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


async def start_nats(port: int, store: Path, log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("ab")
    proc = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()

    async def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}; see {log_path}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    await wait_for(listening, 10, f"nats-server on port {port}", 0.05)
    return proc


def start_tracker(nats_url: str, home: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNCTL_NATS_URL": nats_url,
        "RUNCTL_HOME": str(home),
        "RUNCTL_TRACKER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("RUNCTL_DB_URL", None)  # always the SQLite file in the temporary home
    log = log_path.open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "services.tracker"], cwd=ROOT, env=env, stdout=log, stderr=log)
    log.close()
    return proc


async def wait_tracker_ready(bus: Bus, proc: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    """Until the tracker answers its health probe with both of its consumers registered (health is answered
    before the consumers exist, so an answer alone is not enough)."""

    async def ready() -> bool:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"tracker exited with {proc.returncode}:\n{tail}")
        try:
            reply = await bus.nc.request(health_subject("tracker"), b"", timeout=0.5)
        except (nats.errors.Error, TimeoutError):
            return False
        info = json.loads(reply.data)
        return bool(info.get("pid") == proc.pid and {"tracker-runs", "tracker-trials"} <= set(info["consumers"]))

    await wait_for(ready, timeout_s, "the tracker to answer health probes with its consumers")


# --------------------------------------------------------------------------------------------------- events


def make_event(run_id: str, i: int) -> Event:
    """One event of a steady size: ``trial.finished`` (a ``step.done`` every 100th in the latency phase)."""
    payload = TrialFinished(
        task=f"task-{i % 1000:04d}",
        trial=i,
        reward=0.5,
        termination_reason="agent_completed",
        durations_s={"env_setup": 1.25, "agent": 12.5, "verify": 0.75},
        tokens={"prompt": 1234, "completion": 567},
        synthetic=True,
    )
    return new_event(payload, team=TEAM, run_id=run_id, source=SOURCE)


def make_step(run_id: str, step: int) -> Event:
    metrics = {"reward_mean": 0.5, "loss": 0.1, "kl": 0.01, "lr": 1e-6}
    return new_event(StepDone(step=step, metrics=metrics, synthetic=True), team=TEAM, run_id=run_id, source=SOURCE)


async def purge(js: JetStreamContext) -> None:
    for stream in (team_stream(RUNS_STREAM, TEAM), team_stream(TRIALS_STREAM, TEAM), DEADLETTER_STREAM):
        await js.purge_stream(stream)


# --------------------------------------------------------------------------------------------------- throughput


async def run_ours(bus: Bus, events: list[Event]) -> float:
    start = time.perf_counter()
    acks = await bus.publish_many(events)
    elapsed = time.perf_counter() - start
    assert len(acks) == len(events) and not any(a.duplicate for a in acks)
    return elapsed


async def run_raw(js: JetStreamContext, events: list[Event]) -> float:
    prepared = [(e.nats_subject, e.to_json(), e.id) for e in events]  # before the clock starts
    start = time.perf_counter()
    futures = [await js.publish_async(subject, data, headers={"Nats-Msg-Id": eid}) for subject, data, eid in prepared]
    acks = [await f for f in futures]
    elapsed = time.perf_counter() - start
    assert len(acks) == len(events) and not any(a.duplicate for a in acks)
    return elapsed


async def run_raw_json(js: JetStreamContext, events: list[Event]) -> float:
    start = time.perf_counter()
    futures = [await js.publish_async(e.nats_subject, e.to_json(), headers={"Nats-Msg-Id": e.id}) for e in events]
    acks = [await f for f in futures]
    elapsed = time.perf_counter() - start
    assert len(acks) == len(events) and not any(a.duplicate for a in acks)
    return elapsed


@dataclass
class Throughput:
    events: int
    payload_bytes: int
    rates: dict[str, list[float]] = field(default_factory=dict)  # events/s per round
    serialize_us: float = 0.0

    def median(self, variant: str) -> float:
        return statistics.median(self.rates[variant])

    def paired_ratio(self, a: str, b: str) -> float:
        """Median over rounds of the ratio a/b measured in the same round."""
        return statistics.median(x / y for x, y in zip(self.rates[a], self.rates[b], strict=True))


async def bench_throughput(bus: Bus, rounds: int, n: int) -> Throughput:
    js = bus.nc.jetstream(publish_async_max_pending=MAX_PENDING)
    variants: dict[str, Callable[[list[Event]], Awaitable[float]]] = {
        "ours": lambda events: run_ours(bus, events),
        "raw": lambda events: run_raw(js, events),
        "raw+json": lambda events: run_raw_json(js, events),
    }
    names = list(variants)
    sample = make_event("bench-throughput-0", 0)
    result = Throughput(events=n, payload_bytes=len(sample.to_json()), rates={name: [] for name in names})

    # warm-up, untimed: the JetStream async-reply inbox, pydantic's serializers, the server's stream files
    await variants["ours"]([make_event("bench-warmup", i) for i in range(500)])
    await variants["raw"]([make_event("bench-warmup", i) for i in range(500)])

    print(f"\n== throughput: {rounds} rounds x {n:,} events of {result.payload_bytes} bytes (trial.finished)")
    print("   ours     = Bus.publish_many(events)            (serializes each event inside the timed section)")
    print("   raw      = js.publish_async + await futures      (payloads pre-serialized with Event.to_json)")
    print("   raw+json = js.publish_async + await futures      (Event.to_json inside the timed section)")
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        cells = []
        for name in order:
            events = [make_event(f"bench-throughput-{r}", i) for i in range(n)]
            await purge(js)
            await bus.nc.flush()
            gc.collect()
            elapsed = await variants[name](events)
            rate = n / elapsed
            result.rates[name].append(rate)
            cells.append(f"{name} {rate:>9,.0f}/s")
        print(f"   round {r + 1}: " + "   ".join(cells) + f"   (order: {' > '.join(order)})")

    events = [make_event("bench-serialize", i) for i in range(n)]
    start = time.perf_counter()
    for e in events:
        e.to_json()
    result.serialize_us = (time.perf_counter() - start) / n * 1e6
    await purge(js)
    return result


# --------------------------------------------------------------------------------------------------- latency


@dataclass
class Latency:
    rate: float
    published: int
    persisted: int
    achieved_rate: float
    max_behind_ms: float
    latencies_ms: list[float]
    ack_ms: list[float]
    notices: int
    ids_per_notice: float


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


async def paced_publish(
    bus: Bus, run_id: str, count: int, rate: float, first: int, sent: dict[str, float], ack_ms: list[float]
) -> tuple[float, float]:
    """Publish ``count`` events at ``rate`` per second, each awaited; returns (wall seconds, max lag behind
    schedule in seconds). Late events are sent at once, so the schedule (not the sleep) sets the rate."""
    period = 1.0 / rate
    start = time.monotonic()
    max_behind = 0.0
    for k in range(count):
        target = start + k * period
        delay = target - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            max_behind = max(max_behind, -delay)
        i = first + k
        event = make_step(run_id, i // 100) if i % 100 == 99 else make_event(run_id, i)
        before = time.time()
        sent[event.id] = before
        await bus.publish(event)
        ack_ms.append((time.time() - before) * 1000)
    return time.monotonic() - start, max_behind


async def bench_latency(bus: Bus, rate: float, duration_s: float, warmup_s: float) -> Latency:
    committed: dict[str, float] = {}
    notices = 0
    arrived = asyncio.Event()

    async def on_persisted(msg: Msg) -> None:
        nonlocal notices
        body: dict[str, Any] = json.loads(msg.data)
        notices += 1
        for eid in body["ids"]:
            committed[eid] = float(body["committed_at"])
        arrived.set()

    sub = await bus.nc.subscribe(persisted_subject(), cb=on_persisted)
    await bus.nc.flush()

    async def all_persisted(ids: dict[str, float], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ids.keys() <= committed.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), left)

    run_id = f"bench-latency-{int(time.time())}"
    warm_sent: dict[str, float] = {}
    await paced_publish(bus, run_id, max(1, int(rate * warmup_s)), rate, 0, warm_sent, [])
    await all_persisted(warm_sent, 15)
    missing_warm = len(warm_sent.keys() - committed.keys())
    if missing_warm:
        raise RuntimeError(f"{missing_warm} warm-up events were never reported persisted by the tracker")
    notices_before = notices

    sent: dict[str, float] = {}
    ack_ms: list[float] = []
    count = int(rate * duration_s)
    print(f"\n== latency: {count:,} events at {rate:,.0f}/s for {duration_s:.0f} s (after {warmup_s:.0f} s warm-up)")
    print("   publisher = Bus.publish (one event at a time, each ack awaited), paced on a monotonic schedule")
    wall, behind = await paced_publish(bus, run_id, count, rate, len(warm_sent), sent, ack_ms)
    await all_persisted(sent, 20)
    await sub.unsubscribe()

    latencies = [(committed[eid] - t) * 1000 for eid, t in sent.items() if eid in committed]
    batches = notices - notices_before
    return Latency(
        rate=rate,
        published=count,
        persisted=len(latencies),
        achieved_rate=count / wall,
        max_behind_ms=behind * 1000,
        latencies_ms=latencies,
        ack_ms=ack_ms,
        notices=batches,
        ids_per_notice=len(latencies) / batches if batches else 0.0,
    )


# --------------------------------------------------------------------------------------------------- main


def report_throughput(t: Throughput) -> float:
    ours, raw, raw_json = t.median("ours"), t.median("raw"), t.median("raw+json")
    ratio = t.paired_ratio("ours", "raw")
    print(f"   median events/s: ours {ours:,.0f}   raw {raw:,.0f}   raw+json {raw_json:,.0f}")
    print(f"   ours/raw      = {ratio:.3f} (median of per-round ratios; ratio of medians {ours / raw:.3f})")
    print(f"   ours/raw+json = {t.paired_ratio('ours', 'raw+json'):.3f} (the wrapper alone, serialization equal)")
    print(f"   Event.to_json alone: {t.serialize_us:.1f} us/event")
    return ratio


def report_latency(lat: Latency) -> float:
    print(f"   achieved {lat.achieved_rate:,.0f} events/s; worst lag behind schedule {lat.max_behind_ms:.1f} ms")
    print(
        f"   publish->ack (ms):        p50 {percentile(lat.ack_ms, 50):.2f}  p99 {percentile(lat.ack_ms, 99):.2f}"
        f"  max {max(lat.ack_ms):.2f}"
    )
    if not lat.latencies_ms:
        print("   no event was reported persisted")
        return math.inf
    values = lat.latencies_ms
    p50, p90, p99 = (percentile(values, p) for p in (50, 90, 99))
    print(
        f"   publish->persisted (ms): p50 {p50:.2f}  p90 {p90:.2f}  p99 {p99:.2f}  max {max(values):.2f}"
        f"  (n = {len(values):,} of {lat.published:,} published)"
    )
    print(f"   tracker commits: {lat.notices:,} batches, {lat.ids_per_notice:.1f} events per batch")
    if lat.persisted < lat.published:
        print(f"   WARNING: {lat.published - lat.persisted:,} events were never reported persisted (counted as misses)")
        return math.inf
    return p99


async def amain(args: argparse.Namespace, workdir: Path, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    procs["nats-server"] = await start_nats(port, workdir / "jetstream", workdir / "nats-server.log")
    print(
        f"nats-server pid {procs['nats-server'].pid} on {url}; {os.cpu_count()} CPUs; Python {sys.version.split()[0]}"
    )
    bus = await Bus.connect(url, name="runctl-bench")
    try:
        await bus.ensure_streams(teams=[TEAM])
        throughput = await bench_throughput(bus, args.rounds, args.events)
        ratio = report_throughput(throughput)

        await purge(bus.js)  # the tracker's consumers deliver everything in the streams: start it on empty ones
        home = workdir / "home"
        home.mkdir()
        tracker_log = workdir / "tracker.log"
        procs["tracker"] = start_tracker(url, home, tracker_log)
        await wait_tracker_ready(bus, procs["tracker"], tracker_log, 30)
        print(f"\ntracker pid {procs['tracker'].pid} is healthy (SQLite in a temporary RUNCTL_HOME)")
        latency = await bench_latency(bus, args.rate, args.duration, args.warmup)
        p99 = report_latency(latency)
    finally:
        await bus.close()

    ratio_ok = ratio >= RATIO_TARGET
    p99_ok = p99 < P99_TARGET_MS
    print("\n== summary")
    print(
        f"   throughput ours/raw       {ratio:6.3f}    target >= {RATIO_TARGET}    {'MET' if ratio_ok else 'NOT MET'}"
    )
    print(
        f"   publish->persisted p99    {p99:6.1f} ms target < {P99_TARGET_MS:.0f} ms  {'MET' if p99_ok else 'NOT MET'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="throughput rounds (default 5)")
    parser.add_argument("--events", type=int, default=5000, help="events per throughput round and variant")
    parser.add_argument("--rate", type=float, default=500.0, help="latency phase: events per second")
    parser.add_argument("--duration", type=float, default=10.0, help="latency phase: seconds measured")
    parser.add_argument("--warmup", type=float, default=1.0, help="latency phase: seconds of unmeasured warm-up")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, store, database)")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="runctl-bench-bus-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    started = time.monotonic()
    try:
        asyncio.run(amain(args, workdir, procs))
    finally:
        for name in ("tracker", "nats-server"):  # the tracker first, while its server is still there
            stop_process(procs.get(name))
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"   total time {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
