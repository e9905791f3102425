"""Benchmark of the tracker: sustained ingest into SQLite and PostgreSQL, and the run page of a 10,000-step run.

Run as ``python bench/tracker.py`` from the repository root (the project's virtualenv active; PostgreSQL from
Debian's ``postgresql`` package for the second database, skipped with a note when it is not installed). It starts
its own ``nats-server`` (JetStream), PostgreSQL server and tracker services on loopback ports and stops them by PID.

1. Ingest. For each database, the real tracker service (``python -m services.tracker``) consumes a train run's
   events published on the bus: ``step.done`` with 20 metrics each and ``trial.finished`` (16 per step), in the
   ratio a train run has them.
   - ``drain``: a backlog of ``--backlog`` events is published before the tracker starts; events/s is the backlog
     over the time from the tracker's start to its last stored event (its top speed).
   - ``sustained``: with the tracker caught up, events are published at ``--rate`` events/s for ``--duration``
     seconds. Reported: the rate stored, the consumer lag (events published, not yet stored) when publishing
     stops, and the seconds until it is zero again. Target: ≥ 2,000 events/s into SQLite, lag back to zero.
   Baseline in the same run: a bare JetStream pull consumer that only acknowledges, over the same backlog (the
   bus's own ceiling); the ratio says what the projection costs.
2. Run page. A 10,000-step run (20 metrics a step, 16 trials a step, a checkpoint every 500) is projected into each
   database; then each request the run page makes (run, timeline, validation, metrics for the five default curves
   at 600 points, checkpoints, tasks, the first page of trials) is timed through the API, median of 7. The page
   data time is their sum (the page makes them concurrently: the sum is an upper bound). Target ≤ 300 ms.
   Baseline: the same page of a 100-step run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runctl.bus import Bus  # noqa: E402
from runctl.events import CheckpointSaved, Event, PhaseStarted, StepDone, TrialFinished, new_event  # noqa: E402
from runctl.events.payloads import RUNS_STREAM, TRIALS_STREAM  # noqa: E402
from runctl.stack import nats_server_binary  # noqa: E402
from runctl.subjects import health_subject, team_stream  # noqa: E402

TEAM = "bench"
METRICS = [
    "critic/score/mean",
    "actor/ppo_kl",
    "actor/entropy",
    "response_length/mean",
    "perf/mfu/actor",
    *[f"timing_s/stage_{i}" for i in range(15)],
]
TRIALS_PER_STEP = 16
INGEST_TARGET = 2000.0
PAGE_TARGET_MS = 300.0


def run_events(run_id: str, num_steps: int, start: datetime, first_step: int = 1) -> Iterator[Event]:
    """A train run's events, in the order a run publishes them."""
    if first_step == 1:
        yield new_event(PhaseStarted(phase="loop", total=num_steps), team=TEAM, run_id=run_id, source="/bench")
    for step in range(first_step, first_step + num_steps):
        at = start + timedelta(seconds=step)
        for k in range(TRIALS_PER_STEP):
            trial = TrialFinished(
                task=f"task-{(step * TRIALS_PER_STEP + k) % 200}",
                trial=step * TRIALS_PER_STEP + k,
                reward=float((step + k) % 3 == 0),
                termination_reason="agent_completed",
                durations_s={"wall": 1.5},
                tokens={"prompt": 900, "completion": 120},
            )
            yield new_event(trial, team=TEAM, run_id=run_id, source="/bench", time=at)
        metrics = {key: (step % 97) / 97 + i for i, key in enumerate(METRICS)}
        yield new_event(StepDone(step=step, metrics=metrics), team=TEAM, run_id=run_id, source="/bench", time=at)
        if step % 500 == 0:
            saved = CheckpointSaved(step=step, path=f"/ckpt/global_step_{step}", format="hf", num_bytes=1 << 30)
            yield new_event(saved, team=TEAM, run_id=run_id, source="/bench", time=at)


def events_for(count: int, run_id: str, first_step: int = 1) -> list[Event]:
    per_step = TRIALS_PER_STEP + 1
    return list(run_events(run_id, count // per_step + 1, datetime.now(UTC), first_step))[:count]


# ------------------------------------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def postgres_helpers() -> Any:
    """The tests' PostgreSQL helper, loaded by path (a package named ``tests`` elsewhere may shadow ours)."""
    spec = importlib.util.spec_from_file_location("runctl_bench_postgres", ROOT / "tests" / "infra" / "postgres.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Procs:
    """Processes this benchmark started, stopped by PID."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)


async def tracker_health(nats_url: str) -> dict[str, Any] | None:
    bus = await Bus.connect(nats_url)
    try:
        reply = await bus.nc.request(health_subject("tracker"), b"", timeout=0.5)
        return dict(json.loads(reply.data))
    except Exception:
        return None
    finally:
        await bus.close()


BENCH_ADMIN = "rca_bench-" + secrets.token_urlsafe(16)  # the admin token of the trackers this script starts


def stored_count(api: str) -> int:
    import httpx

    try:
        headers = {"Authorization": f"Bearer {BENCH_ADMIN}"}
        return int(httpx.get(f"{api}/healthz", headers=headers, timeout=5).json()["events"])
    except httpx.HTTPError:
        return -1


async def purge(nats_url: str) -> None:
    bus = await Bus.connect(nats_url)
    try:
        await bus.ensure_streams(teams=[TEAM])
        for stream in (team_stream(RUNS_STREAM, TEAM), team_stream(TRIALS_STREAM, TEAM)):
            await bus.js.purge_stream(stream)
        for durable, stream in (("tracker-runs", RUNS_STREAM), ("tracker-trials", TRIALS_STREAM)):
            stream = team_stream(stream, TEAM)
            try:
                await bus.js.delete_consumer(stream, durable)
            except Exception:
                pass
    finally:
        await bus.close()


async def publish(nats_url: str, events: list[Event]) -> None:
    bus = await Bus.connect(nats_url)
    try:
        for start in range(0, len(events), 5000):
            await bus.publish_many(events[start : start + 5000], timeout_s=60)
    finally:
        await bus.close()


async def bare_consumer_rate(nats_url: str, count: int) -> float:
    """The bus's ceiling: a pull consumer over both streams that only acknowledges."""
    import nats
    from nats.js import api

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    started = time.perf_counter()
    seen = 0
    for stream in (team_stream(RUNS_STREAM, TEAM), team_stream(TRIALS_STREAM, TEAM)):
        config = api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, deliver_policy=api.DeliverPolicy.ALL)
        sub = await js.pull_subscribe("", durable=f"bare-{stream.lower()}", stream=stream, config=config)
        while True:
            try:
                msgs = await sub.fetch(256, timeout=0.5)
            except Exception:
                break
            for msg in msgs:
                json.loads(msg.data)  # an event is at least parsed by any real consumer
                await msg.ack()
            seen += len(msgs)
        await js.delete_consumer(stream, f"bare-{stream.lower()}")
    elapsed = time.perf_counter() - started - 0.5 * 2  # the final empty fetch of each stream waited 0.5 s
    await nc.close()
    assert seen == count, f"bare consumer saw {seen} of {count}"
    return count / elapsed


def ingest(procs: Procs, nats_url: str, db_url: str, backlog: int, rate: float, duration_s: float) -> dict[str, Any]:
    asyncio.run(purge(nats_url))
    asyncio.run(publish(nats_url, events_for(backlog, "ingest-drain")))
    bare = asyncio.run(bare_consumer_rate(nats_url, backlog))
    port = free_port()
    env = {**os.environ, "RUNCTL_NATS_URL": nats_url, "RUNCTL_DB_URL": db_url, "RUNCTL_TRACKER_PORT": str(port)}
    env["RUNCTL_ADMIN_TOKEN"] = BENCH_ADMIN
    api = f"http://127.0.0.1:{port}"
    tracker = procs.start([sys.executable, "-m", "services.tracker"], env)
    wait_until(lambda: stored_count(api) > 0, 60, "the tracker to store its first event", interval_s=0.01)
    started, first = time.perf_counter(), stored_count(api)  # from its first commit: not its start-up
    wait_until(lambda: stored_count(api) >= backlog, 300, "the tracker to drain the backlog", interval_s=0.02)
    drain_rate = (backlog - first) / (time.perf_counter() - started)
    # Sustained: publish at `rate` against a schedule while the tracker keeps up.
    live = events_for(int(rate * duration_s), "ingest-live")
    chunk = max(1, int(rate / 20))

    async def paced() -> float:
        bus = await Bus.connect(nats_url)
        begin = time.perf_counter()
        for i in range(0, len(live), chunk):
            due = begin + i / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await bus.publish_many(live[i : i + chunk])
        elapsed = time.perf_counter() - begin
        await bus.close()
        return elapsed

    before = stored_count(api)
    publish_s = asyncio.run(paced())
    lag_at_end = before + len(live) - stored_count(api)
    stop_publishing = time.perf_counter()
    wait_until(lambda: stored_count(api) >= before + len(live), 120, "the lag to return to zero", interval_s=0.02)
    catch_up_s = time.perf_counter() - stop_publishing
    health = asyncio.run(tracker_health(nats_url)) or {}
    lags = {name: c.get("lag") for name, c in health.get("consumers", {}).items()}
    procs.stop(tracker)
    return {
        "drain_events_per_s": drain_rate,
        "bare_consumer_events_per_s": bare,
        "sustained_offered_per_s": len(live) / publish_s,
        "sustained_stored_per_s": len(live) / (publish_s + catch_up_s),
        "lag_when_publishing_stopped": lag_at_end,
        "seconds_to_zero_lag": catch_up_s,
        "consumer_lag_reported": lags,
    }


# ------------------------------------------------------------------------------------------------ run page
def page_ms(db_url: str, num_steps: int) -> dict[str, float]:
    from fastapi.testclient import TestClient
    from sqlalchemy import delete

    from services.tracker.api import make_app
    from services.tracker.auth import TokenAuth
    from services.tracker.db import Base, make_engine
    from services.tracker.projection import project

    engine = make_engine(db_url)
    run_id = f"page-{num_steps}"
    with engine.begin() as conn:
        for table in reversed(Base.metadata.sorted_tables):
            conn.execute(delete(table))
    batch: list[tuple[Event, int]] = []
    for seq, event in enumerate(run_events(run_id, num_steps, datetime.now(UTC) - timedelta(days=1)), 1):
        batch.append((event, seq))
        if len(batch) == 2000:
            with engine.begin() as conn:
                project(conn, batch)
            batch = []
    with engine.begin() as conn:
        project(conn, batch)
    paths = {
        "run": f"/api/runs/{run_id}",
        "timeline": f"/api/runs/{run_id}/timeline",
        "validation": f"/api/runs/{run_id}/validation",
        "metrics": f"/api/runs/{run_id}/metrics?max_points=600",
        "checkpoints": f"/api/runs/{run_id}/checkpoints",
        "tasks": f"/api/runs/{run_id}/tasks",
        "trials": f"/api/runs/{run_id}/trials?limit=200",
    }
    times: dict[str, float] = {}
    app = make_app(engine, auth=TokenAuth(BENCH_ADMIN))
    with TestClient(app, headers={"Authorization": f"Bearer {BENCH_ADMIN}"}) as client:
        for name, path in paths.items():
            samples = []
            for _ in range(7):
                begin = time.perf_counter()
                response = client.get(path)
                samples.append((time.perf_counter() - begin) * 1000)
                assert response.status_code == 200, response.text
            times[name] = statistics.median(samples)
        points = client.get(paths["metrics"]).json()["series"]["critic/score/mean"]["steps"]
        assert len(points) <= 600 and points[-1] == num_steps
    engine.dispose()
    times["page"] = sum(times.values())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=2500.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    procs = Procs()
    work = Path(tempfile.mkdtemp(prefix="runctl-bench-tracker-"))
    databases: dict[str, str] = {"sqlite": f"sqlite:///{work / 'ingest.db'}"}
    from contextlib import ExitStack

    with ExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)  # last, once every process using it has stopped
        stack.callback(procs.stop_all)
        port = free_port()
        procs.start([nats_server_binary(), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(work / "js")])
        nats_url = f"nats://127.0.0.1:{port}"
        wait_until(lambda: asyncio.run(_connects(nats_url)), 10, "nats-server")
        pg = postgres_helpers()
        try:
            admin = stack.enter_context(pg.postgres_server(free_port()))
            databases["postgresql"] = pg.new_database(admin, "ingest")
        except RuntimeError as e:
            print(f"PostgreSQL skipped: {e}")
        results: dict[str, Any] = {}
        for name, url in databases.items():
            results[name] = ingest(procs, nats_url, url, args.backlog, args.rate, args.duration)
            page_url = f"sqlite:///{work / 'page.db'}" if name == "sqlite" else pg.new_database(admin, "page")
            results[name]["page_ms"] = page_ms(page_url, args.steps)
            results[name]["page_ms_baseline_100_steps"] = page_ms(page_url, 100)
    report(results, args)


async def _connects(url: str) -> bool:
    try:
        bus = await Bus.connect(url)
    except Exception:
        return False
    await bus.close()
    return True


def report(results: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n== summary: tracker (backlog {args.backlog}, sustained {args.rate:.0f} ev/s for {args.duration:g} s)")
    for name, r in results.items():
        print(f"\n{name}")
        ratio = r["drain_events_per_s"] / r["bare_consumer_events_per_s"]
        bare = r["bare_consumer_events_per_s"]
        print(
            f"  drain: {r['drain_events_per_s']:.0f} events/s (bare JetStream consumer {bare:.0f}; ratio {ratio:.2f})"
        )
        offered, kept = r["sustained_offered_per_s"], r["sustained_stored_per_s"]
        print(
            f"  sustained: offered {offered:.0f} events/s, stored {kept:.0f} events/s; lag when publishing stopped"
            f" {r['lag_when_publishing_stopped']}, zero again after {r['seconds_to_zero_lag']:.2f} s;"
            f" consumer lag reported {r['consumer_lag_reported']}"
        )
        page, base = r["page_ms"], r["page_ms_baseline_100_steps"]
        parts = ", ".join(f"{k} {v:.1f}" for k, v in page.items() if k != "page")
        print(f"  run page of a {args.steps}-step run: {page['page']:.1f} ms ({parts})")
        print(f"  baseline (100-step run): {base['page']:.1f} ms; ratio {page['page'] / base['page']:.1f}x")
        if name == "sqlite":
            ok = r["drain_events_per_s"] >= INGEST_TARGET and r["sustained_stored_per_s"] >= INGEST_TARGET * 0.95
            print(f"  ingest target ≥ {INGEST_TARGET:.0f} events/s with lag back to zero: {'met' if ok else 'NOT met'}")
        print(f"  page target ≤ {PAGE_TARGET_MS:.0f} ms: {'met' if page['page'] <= PAGE_TARGET_MS else 'NOT met'}")


if __name__ == "__main__":
    main()
