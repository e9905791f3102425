"""What ``/api/usage`` costs on a tracker that holds many trials: its query (held time from the events that start
and end it, tokens from the hourly sums) against reading every trial event of the window, as it did before.

Run as ``python bench/usage.py [--runs 8] [--trials 20000]`` from the repository root. It projects ``--runs`` runs
of ``--trials`` trials each, spread over two days, into a fresh SQLite database (the tracker's own projection), then
times, median of 5, ``services.tracker.queries.usage`` for all time and for the last six hours, and the baseline:
selecting and parsing every ``trial.finished`` event of the same window and summing its tokens. Prints both and the
ratio, measured in this run; checks that both count the same tokens. Nothing of the project changes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(action: Callable[[], object], repeat: int = 5) -> tuple[float, object]:
    took, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = action()
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--trials", type=int, default=20_000)
    args = parser.parse_args()

    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from runctl.events import Event, RunAdmitted, RunSucceeded, TrialFinished, new_event, parse_event
    from runctl.events.payloads import Payload
    from services.tracker import queries
    from services.tracker.db import EventRow, make_engine
    from services.tracker.projection import project

    start = datetime(2026, 12, 1, tzinfo=UTC)
    now = start + timedelta(days=2)
    with tempfile.TemporaryDirectory() as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'tracker.db'}")
        seq = 0
        for r in range(args.runs):
            run_id, team = f"bench-{r}", f"team-{r % 3}"

            def event(payload: Payload, key: str, at: datetime, run_id: str = run_id, team: str = team) -> Event:
                made = new_event(payload, team=team, run_id=run_id, source="/bench", event_id=f"{run_id}.{key}")
                return made.model_copy(update={"time": at})

            batch = [event(RunAdmitted(resources={"gpus": 8.0}, quota_decision="bench"), "admitted", start)]
            step = timedelta(days=2) / args.trials
            for i in range(args.trials):
                finished = TrialFinished(
                    task=f"task-{i % 50}", trial=i, reward=float(i % 2), termination_reason="agent_completed",
                    durations_s={"total": 1.0}, tokens={"prompt": 100, "completion": 1 + i % 7},
                )  # fmt: skip
                batch.append(event(finished, f"trial.{i}", start + step * i))
            batch.append(event(RunSucceeded(summary={}, score=0.5, num_trials=args.trials), "end", now))
            for begin in range(0, len(batch), 2000):
                with engine.begin() as conn:
                    chunk = batch[begin : begin + 2000]
                    project(conn, [(e, seq + k) for k, e in enumerate(chunk, 1)])
                    seq += len(chunk)

        def baseline(since: datetime | None) -> int:
            with Session(engine) as session:
                query = select(EventRow).where(EventRow.name == "trial.finished")
                if since is not None:
                    query = query.where(EventRow.time >= since)
                total = 0
                for row in session.scalars(query):
                    data = parse_event(
                        {"id": row.id, "source": row.source, "type": row.type, "time": row.time,
                         "subject": row.run_id, "team": row.team, "runid": row.run_id, "data": row.data}
                    ).data  # fmt: skip
                    assert isinstance(data, TrialFinished)
                    total += int(data.tokens.get("completion", 0))
                return total

        def ours(since: datetime | None) -> int:
            with Session(engine) as session:
                body = queries.usage(session, None, since, now)
                return sum(int(t["tokens_generated"]) for t in body["teams"])

        print(f"== /api/usage over {args.runs} runs x {args.trials} trials (SQLite)")
        for label, since in (("all time", None), ("last 6 hours", now - timedelta(hours=6) + timedelta(minutes=17))):
            base_ms, base_tokens = timed(partial(baseline, since))
            our_ms, our_tokens = timed(partial(ours, since))
            assert base_tokens == our_tokens, (label, base_tokens, our_tokens)
            print(
                f"{label}: every trial read {base_ms:.0f} ms, hourly sums {our_ms:.0f} ms "
                f"({base_ms / our_ms:.1f}x less), {our_tokens} tokens both"
            )
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
