"""The tracker service fed over the bus: a rebuild from the streams equals the live projection, and every service
serves Prometheus metrics."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, inspect, text

from runctl.bus import Bus
from runctl.subjects import health_subject
from tests.conftest import Services, admin_headers, wait_until
from tests.infra.postgres import new_database
from tests.integration.test_tracker_api import recorded

pytestmark = pytest.mark.integration
# Per-process bookkeeping that differs between two projections of the same log by design.
VOLATILE = {"pk", "ingested_at"}


def publish_recorded(services: Services, twice: bool = False, stream: str | None = None) -> int:
    events = [e for e in recorded() if stream is None or e.stream == stream]

    async def go() -> None:
        bus = await Bus.connect(services.nats_url)
        try:
            await bus.publish_many(events)
            if twice:  # a publisher retrying: JetStream drops the repeats by id
                await bus.publish_many(events[:50])
        finally:
            await bus.close()

    asyncio.run(go())
    return len(events)


def stored(services: Services) -> int:
    try:
        return int(httpx.get(f"{services.tracker_url}/healthz", headers=admin_headers(), timeout=2).json()["events"])
    except httpx.HTTPError:
        return -1


def snapshot(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, without the columns that differ by design, in a stable order and normal form."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    tables: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            if table == "alembic_version":
                continue
            columns = [c["name"] for c in inspect(conn).get_columns(table) if c["name"] not in VOLATILE]
            rows = conn.execute(text(f"SELECT {', '.join(columns)} FROM {table}")).all()
            tables[table] = sorted((tuple(_normal(v) for v in row) for row in rows), key=repr)
    engine.dispose()
    return tables


def _normal(value: Any) -> Any:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.dumps(json.loads(value), sort_keys=True)  # SQLite returns JSON columns as text
        except ValueError:
            return value
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def rebuild_cli(services: Services, db_url: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "runctl.cli.main", "tracker", "rebuild", "--db", db_url]
    return subprocess.run(argv, env=services.env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_rebuild_from_the_streams_equals_the_live_projection(
    services: Services, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        live_url, rebuilt_url = f"sqlite:///{services.home / 'tracker.db'}", f"sqlite:///{tmp_path / 'rebuilt.db'}"
    else:
        admin = request.getfixturevalue("postgres")
        live_url, rebuilt_url = new_database(admin, "live"), new_database(admin, "rebuilt")
        os.environ["RUNCTL_DB_URL"] = live_url
    try:
        services.start("tracker")
    finally:
        os.environ.pop("RUNCTL_DB_URL", None)
    total = publish_recorded(services, twice=True)
    wait_until(lambda: stored(services) == total, 60, f"the tracker to store {total} events")
    result = rebuild_cli(services, rebuilt_url)
    assert result.returncode == 0, result.stderr
    assert f"{total} events stored" in result.stdout
    live, rebuilt = snapshot(live_url), snapshot(rebuilt_url)
    assert set(live) == {"runs", "events", "metrics", "checkpoints", "trials", "task_stats", "token_usage"}
    for table in live:
        assert live[table] == rebuilt[table], table
    assert len(live["trials"]) == 370 and len(live["metrics"]) == 200
    again = rebuild_cli(services, rebuilt_url)
    assert again.returncode == 1 and "already holds" in again.stderr + again.stdout


def health(services: Services, name: str) -> dict[str, Any]:
    async def ask() -> dict[str, Any]:
        bus = await Bus.connect(services.nats_url)
        try:
            reply = await bus.nc.request(health_subject(name), b"", timeout=2)
            return dict(json.loads(reply.data))
        finally:
            await bus.close()

    return asyncio.run(ask())


def scrape(url: str) -> dict[str, float]:
    """Prometheus text → {series with labels: value}."""
    response = httpx.get(url, headers=admin_headers(), timeout=5)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    series = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            series[name] = float(value)
    return series


def test_every_service_serves_prometheus_metrics_of_its_consumers(services: Services) -> None:
    for name in ("validator", "launcher", "tracker", "sandbox"):
        services.start(name)
    # Trials only: the validator and the launcher would act on the recorded submissions and add events.
    total = publish_recorded(services, stream="TRIALS")
    wait_until(lambda: stored(services) == total, 60, "the tracker to store the recorded trials")

    def settled() -> bool:
        series = scrape(health(services, "tracker")["metrics_url"])
        return series.get('runctl_events_consumed_total{service="tracker",consumer="tracker-trials"}') == total

    wait_until(settled, 30, "the tracker's metrics to count every event")
    series = scrape(health(services, "tracker")["metrics_url"])
    for consumer in ("tracker-runs", "tracker-trials"):
        labels = f'{{service="tracker",consumer="{consumer}"}}'
        assert series[f"runctl_handler_errors_total{labels}"] == 0
        assert series[f"runctl_redeliveries_total{labels}"] == 0
        assert series[f"runctl_consumer_lag{labels}"] == 0
    assert series["runctl_tracker_events_stored_total"] == total
    assert scrape(f"{services.tracker_url}/metrics")["runctl_tracker_events_stored_total"] == total
    for name in ("validator", "launcher", "sandbox"):
        info = health(services, name)
        metrics = scrape(info["metrics_url"])
        assert metrics[f'runctl_service_uptime_seconds{{service="{name}"}}'] > 0
        for consumer in info["consumers"]:
            assert f'runctl_events_consumed_total{{service="{name}",consumer="{consumer}"}}' in metrics
    assert httpx.get(info["metrics_url"].replace("/metrics", "/other"), timeout=5).status_code == 404
