"""The dashboard in headless Chromium (Debian's, driven by Playwright; no browser is downloaded), served by the
real tracker app over HTTP and fed the recorded event stream (``tests/data/tracker``). Screenshots are saved under
``test-artifacts/dashboard/``."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright
from sqlalchemy.engine import Engine

from runctl.config import load_config
from runctl.events import Event, PhaseStarted, StepDone, new_event
from runctl.sdk import submission_event
from services.tracker.api import make_app
from services.tracker.auth import COOKIE, TokenAuth
from services.tracker.db import make_engine
from services.tracker.live import Notifier
from tests.conftest import ADMIN_TOKEN, ROOT, wait_until
from tests.integration.test_tracker_api import DATA, INFER, TRAIN, load, recorded, team_of

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
# The notifier's: (run watched or None, team whose runs it hears of or None, queue).
LiveClient = tuple[str | None, str | None, asyncio.Queue[dict[str, Any]]]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class Tracker:
    url: str
    engine: Engine
    notifier: Notifier
    loop: asyncio.AbstractEventLoop

    def store(self, events: list[Event]) -> None:
        """Project events and announce them, as the tracker service does after a commit."""
        load(self.engine, events)
        runs = {e.runid: e.team for e in events}
        names = sorted({e.name for e in events})
        self.loop.call_soon_threadsafe(self.notifier.publish, runs, names, len(events))

    def subscribers(self, run_id: str) -> set[LiveClient]:
        """The live-stream clients a notice about ``run_id`` reaches (those watching it, and those watching every
        run). Read on the server's loop, which changes the set; the entries are kept, so none is mistaken for a
        later one."""

        async def read() -> set[LiveClient]:
            return {c for c in self.notifier._clients if c[0] in (None, run_id)}

        return asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)

    def wait_subscribed(self, run_id: str, before: set[LiveClient]) -> None:
        """Wait until a page opened after ``before`` was taken has its live stream on ``run_id`` open: a notice
        published sooner reaches nobody, and the page would wait for an update that never comes."""
        wait_until(lambda: bool(self.subscribers(run_id) - before), 30, f"a page's live stream on {run_id}")


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tracker]:
    mp = pytest.MonkeyPatch()
    mp.setenv("RUNCTL_HOME", str(DATA / "home"))
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('dash') / 'tracker.db'}")
    load(engine, recorded())
    notifier = Notifier()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = make_app(engine, notifier, keepalive_s=1.0, auth=TokenAuth(ADMIN_TOKEN, team_of))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    loops: list[asyncio.AbstractEventLoop] = []

    def serve() -> None:
        loop = asyncio.new_event_loop()
        loops.append(loop)
        loop.run_until_complete(server.serve())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 15, "the tracker's HTTP server")
    yield Tracker(f"http://127.0.0.1:{port}", engine, notifier, loops[0])
    server.should_exit = True
    thread.join(15)
    engine.dispose()
    mp.undo()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, tracker: Tracker) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies([{"name": COOKIE, "value": ADMIN_TOKEN, "url": tracker.url}])  # signed in as the admin
    page = context.new_page()
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], errors


def shot(page: Page, name: str) -> None:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one


def test_the_runs_table_shows_every_run_with_state_progress_and_score(tracker: Tracker, page: Page) -> None:
    page.goto(tracker.url + "/")
    # Only the recorded runs: later tests store more runs in this module's database, and may run first.
    ids = sorted({e.runid for e in recorded()})
    assert len(ids) == 8
    rows = page.locator(", ".join(f'table#runs tbody tr[data-run-id="{run_id}"]' for run_id in ids))
    expect(rows).to_have_count(8)
    train = page.locator(f'tr[data-run-id="{TRAIN}"]')
    expect(train.locator("td.state")).to_have_text("succeeded")
    expect(train.locator("td.type")).to_have_text("train")
    expect(train.locator("td.progress")).to_contain_text("40 / 40 steps")
    expect(train.locator("td.score")).to_have_text("0.375")
    expect(train.locator("td.team")).to_have_text("demo")
    infer = page.locator(f'tr[data-run-id="{INFER}"]')
    expect(infer.locator("td.progress")).to_contain_text("12 / 12 trials")
    expect(infer.locator("td.score")).to_have_text("0.583")
    expect(page.locator('tr[data-run-id="grpo-tp3-20261130-0410"] td.state')).to_have_text("rejected")
    shot(page, "runs")
    page.select_option("#filter-type", "eval")
    expect(rows).to_have_count(5)


def test_a_run_page_draws_the_timeline_curves_checkpoints_and_tasks(tracker: Tracker, page: Page) -> None:
    page.goto(f"{tracker.url}/runs/{TRAIN}")
    marks = page.locator("ol#timeline li[data-mark]")
    expect(marks.first).to_have_attribute("data-mark", "submitted")
    expect(marks.last).to_have_attribute("data-mark", "succeeded")
    for mark in ("validated", "admitted", "cluster.ready", "replicas.ready", "step 1", "checkpoint 10", "step 40"):
        expect(page.locator(f'ol#timeline li[data-mark="{mark}"]')).to_have_count(1)
    entropy = {e.data.step: e.data.metrics["actor/entropy"] for e in recorded() if e.name == "step.done"}  # type: ignore[union-attr]
    for key in ("critic/score/mean", "actor/ppo_kl", "actor/entropy", "response_length/mean", "perf/mfu/actor"):
        series = page.locator(f'#metrics div.chart[data-key="{key}"] path.series')
        expect(series).to_have_count(1)
        expect(series).to_have_attribute("data-points", "40")
    last = page.locator('#metrics div.chart[data-key="actor/entropy"] path.series').get_attribute("data-last")
    assert last is not None and float(last) == pytest.approx(entropy[40])
    expect(page.locator("#checkpoints tr[data-step]")).to_have_count(4)
    expect(page.locator('#checkpoints tr[data-step="40"] td.eval-score')).to_have_text("0.375")
    expect(page.locator("#eval-chart path.series")).to_have_attribute("data-points", "4")
    expect(page.locator("#task-grid div.cell[data-task]")).to_have_count(4)
    expect(page.locator("#validation tr[data-check-id]").first).to_be_visible()
    page.fill("input#metric-key", "actor/ppo_kl")
    page.click("button#add-metric")
    expect(page.locator('#metrics div.chart[data-key="actor/ppo_kl"]')).to_have_count(2)
    shot(page, "run-train")


def test_the_trial_browser_tells_a_trajectory_turn_by_turn(tracker: Tracker, page: Page) -> None:
    page.goto(f"{tracker.url}/runs/{INFER}")
    grid = page.locator("#task-grid div.cell[data-task]")
    expect(grid).to_have_count(3)
    rates = {grid.nth(i).get_attribute("data-task"): grid.nth(i).get_attribute("data-pass-rate") for i in range(3)}
    assert {task: float(rate or "nan") for task, rate in rates.items()} == {
        "count-files": 0.0,
        "say-yes": 0.75,
        "write-done": 1.0,
    }
    colours = {grid.nth(i).evaluate("e => getComputedStyle(e).backgroundColor") for i in range(3)}
    assert len(colours) == 3  # red, amber and green are told apart
    expect(page.locator("#trials tr[data-task][data-trial]")).to_have_count(12)
    page.locator('#trials tr[data-task="write-done"][data-trial="1"]').click()
    turns = page.locator("#trajectory div.turn[data-turn]")
    expect(turns).to_have_count(2)
    expect(page.locator("#trajectory .reward")).to_contain_text("1")
    first = turns.nth(0)
    expect(first.locator('.message[data-role="user"]')).to_contain_text("Write done into answer.txt.")
    expect(first.locator(".tool-call")).to_contain_text("echo done > answer.txt")
    expect(first.locator(".tool-call")).to_contain_text("bash")
    expect(turns.nth(1).locator(".response")).to_contain_text("Done.")
    shot(page, "run-infer-trajectory")


def test_two_runs_are_compared_on_one_chart(tracker: Tracker, page: Page) -> None:
    other = "grpo-live-20261130-0001"
    start = datetime.now(UTC) - timedelta(minutes=5)
    steps = [
        new_event(
            StepDone(step=s, metrics={"critic/score/mean": s / 10}),
            team="demo",
            run_id=other,
            source="/t",
            time=start + timedelta(seconds=s),
        )
        for s in range(1, 11)
    ]
    tracker.store(steps)
    page.goto(f"{tracker.url}/compare?runs={TRAIN},{other}&keys=critic/score/mean")
    chart = page.locator('div.chart[data-key="critic/score/mean"]')
    expect(chart.locator("path.series")).to_have_count(2)
    expect(chart.locator(f'path.series[data-run-id="{TRAIN}"]')).to_have_attribute("data-points", "40")
    expect(chart.locator(f'path.series[data-run-id="{other}"]')).to_have_attribute("data-points", "10")
    shot(page, "compare")


def test_pages_update_live_while_a_run_is_in_flight(tracker: Tracker, page: Page) -> None:
    run_id = "grpo-running-20261130-0002"
    start = datetime.now(UTC)

    def event(payload: Any, seconds: float) -> Event:
        return new_event(payload, team="demo", run_id=run_id, source="/t", time=start + timedelta(seconds=seconds))

    submitted = submission_event(load_config(ROOT / "configs" / "examples" / "preview.env", environ={}))
    tracker.store([event(submitted.data, -1), event(PhaseStarted(phase="loop", total=20), 0)])
    before = tracker.subscribers(run_id)
    page.goto(f"{tracker.url}/runs/{run_id}")
    expect(page.locator("#run-header .state")).to_have_text("running")
    tracker.wait_subscribed(run_id, before)
    tracker.store([event(StepDone(step=s, metrics={"critic/score/mean": s / 20}), s) for s in range(1, 6)])
    series = page.locator('#metrics div.chart[data-key="critic/score/mean"] path.series')
    expect(series).to_have_attribute("data-points", "5", timeout=10_000)
    tracker.store([event(StepDone(step=s, metrics={"critic/score/mean": s / 20}), s) for s in range(6, 13)])
    expect(series).to_have_attribute("data-points", "12", timeout=10_000)
    before = tracker.subscribers(run_id)
    page.goto(tracker.url + "/")
    row = page.locator(f'tr[data-run-id="{run_id}"] td.progress')
    expect(row).to_contain_text("12 / 20 steps")
    tracker.wait_subscribed(run_id, before)
    tracker.store([event(StepDone(step=13, metrics={"critic/score/mean": 0.65}), 13)])
    expect(row).to_contain_text("13 / 20 steps", timeout=10_000)
    shot(page, "runs-live")


def test_the_usage_page_shows_what_each_team_and_run_used(tracker: Tracker, page: Page) -> None:
    from tests.unit.test_usage import EVENTS

    tracker.store(EVENTS)
    page.goto(tracker.url + "/")
    page.click("nav >> text=Usage")
    nlp = page.locator('#usage-teams tr[data-team="nlp"]')
    expect(nlp.locator("td.gpu-rollout")).to_have_text("22.00")
    expect(nlp.locator("td.gpu-training")).to_have_text("16.00")
    expect(nlp.locator("td.sandbox")).to_have_text("40.0")
    expect(nlp.locator("td.tokens")).to_have_text("150")
    expect(page.locator('#usage-runs tr[data-run-id="cpu"] td.cpu')).to_have_text("2.00")
    shot(page, "usage")
    page.fill("#filter-team", "vision")
    page.dispatch_event("#filter-team", "change")
    expect(page.locator("#usage-teams tbody tr")).to_have_count(1)
    expect(page.locator('#usage-teams tr[data-team="vision"] td.cpu')).to_have_text("2.00")
    assert "team=vision" in page.url
    page.goto(tracker.url + "/usage?team=nlp&since=2030-01-01")  # nothing used since then
    expect(page.locator("#usage-teams tbody")).to_contain_text("Nothing used yet.")


def test_the_dashboard_asks_for_a_token_once_and_a_team_sees_only_its_runs(tracker: Tracker, browser: Browser) -> None:
    from tests.unit.test_usage import EVENTS

    tracker.store(EVENTS)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(tracker.url + "/")  # no token yet: the page asks for one
        expect(page.locator("#token-form")).to_be_visible()
        page.fill("#token-input", "rct_nlp.wrong")
        page.click("#token-form button")
        expect(page.locator("#token-note")).to_contain_text("no team's")
        page.fill("#token-input", "rct_nlp.n1p")
        page.click("#token-form button")
        expect(page.locator('table#runs tbody tr[data-run-id="inf"]')).to_be_visible()
        expect(page.locator(f'table#runs tbody tr[data-run-id="{TRAIN}"]')).to_have_count(0)  # team demo's
        expect(page.locator("#token-form")).to_have_count(0)
        page.goto(f"{tracker.url}/runs/{TRAIN}")  # another team's run: as if it did not exist
        expect(page.locator("#error")).to_contain_text("404")
    finally:
        context.close()
    # `runctl dashboard --open` hands the token over in the link's fragment: signed in at once, then it is gone
    # from the address bar.
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(f"{tracker.url}/#token={ADMIN_TOKEN}")
        expect(page.locator(f'table#runs tbody tr[data-run-id="{TRAIN}"]')).to_be_visible()
        expect(page.locator('table#runs tbody tr[data-run-id="inf"]')).to_be_visible()
        assert "token" not in page.url
        assert [c["httpOnly"] for c in context.cookies() if c["name"] == COOKIE] == [True]
    finally:
        context.close()
