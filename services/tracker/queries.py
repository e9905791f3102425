"""What the run pages ask of the database: metrics downsampled in SQL, the lifecycle timeline, the validation
report, checkpoints joined with their eval runs, pass rates per task."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from sqlalchemy import Float, case, cast, func, select
from sqlalchemy.orm import Session

from runctl.layout import PASS_THRESHOLD
from services.tracker.db import CheckpointRow, EventRow, MetricRow, RunRow, TrialRow, aware, iso

DEFAULT_KEYS = ("critic/score/mean", "actor/ppo_kl", "actor/entropy", "response_length/mean", "perf/mfu/actor")
# Lifecycle events that mark the timeline under these names (phases, steps and checkpoints are named below).
MARKS = {
    "config.submitted": "submitted",
    "config.validated": "validated",
    "config.rejected": "rejected",
    "run.queued": "queued",
    "run.admitted": "admitted",
    "cluster.ready": "cluster.ready",
    "replicas.ready": "replicas.ready",
    "eval.requested": "eval.requested",
    "run.succeeded": "succeeded",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
}


def metric_keys(session: Session, run_id: str) -> list[str]:
    return list(session.scalars(select(MetricRow.key).where(MetricRow.run_id == run_id).distinct().order_by("key")))


def metrics(session: Session, run_id: str, keys: list[str], max_points: int) -> dict[str, Any]:
    """Each key's series, at most ``max_points`` points: steps grouped into equal buckets, each drawn at its last
    step with the bucket's mean, min and max (a spike stays visible in the band)."""
    spans = session.execute(
        select(MetricRow.key, func.min(MetricRow.step), func.max(MetricRow.step), func.count())
        .where(MetricRow.run_id == run_id, MetricRow.key.in_(keys))
        .group_by(MetricRow.key)
    ).all()
    series: dict[str, dict[str, list[Any]]] = {}
    num_steps = 0
    downsampled = False
    for key, first, last, count in spans:
        num_steps = max(num_steps, count)
        width = max(1, math.ceil((last - first + 1) / max_points))
        downsampled |= width > 1
        bucket = (MetricRow.step - first) // width
        rows = session.execute(
            select(
                func.max(MetricRow.step),
                func.avg(MetricRow.value),
                func.min(MetricRow.value),
                func.max(MetricRow.value),
            )
            .where(MetricRow.run_id == run_id, MetricRow.key == key)
            .group_by(bucket)
            .order_by(bucket)
        ).all()
        series[key] = {
            "steps": [r[0] for r in rows],
            "values": [_num(r[1]) for r in rows],
            "min": [_num(r[2]) for r in rows],
            "max": [_num(r[3]) for r in rows],
        }
    return {"run_id": run_id, "num_steps": num_steps, "downsampled": downsampled, "series": series}


def _num(value: Any) -> float | None:
    return None if value is None else round(float(value), 9)


def timeline(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's lifecycle marks in order, with the time since the first and since the previous one. Steps show as
    the first and the last; trials are left out (the trial browser has them)."""
    rows = session.execute(
        select(EventRow.name, EventRow.time, EventRow.data)
        .where(EventRow.run_id == run_id, EventRow.name.not_in(("step.done", "trial.finished")))
        .order_by(EventRow.time, EventRow.pk)
    ).all()
    marks: list[tuple[str, datetime, str]] = []
    for name, time, data in rows:
        if name == "phase.started":
            marks.append((f"phase:{data['phase']}", time, ""))
        elif name == "checkpoint.saved":
            marks.append((f"checkpoint {data['step']}", time, str(data.get("path", ""))))
        elif name in MARKS:
            marks.append((MARKS[name], time, _detail(name, data)))
    steps = select(EventRow.time, EventRow.data).where(EventRow.run_id == run_id, EventRow.name == "step.done")
    first = session.execute(steps.order_by(EventRow.time, EventRow.pk).limit(1)).first()
    last = session.execute(steps.order_by(EventRow.time.desc(), EventRow.pk.desc()).limit(1)).first()
    ends = [row for row in (first, last) if row is not None]
    if len(ends) == 2 and ends[0].data["step"] == ends[1].data["step"]:
        ends = ends[:1]
    marks += [(f"step {row.data['step']}", row.time, "") for row in ends]
    marks.sort(key=lambda m: aware(m[1]))
    out: list[dict[str, Any]] = []
    start = aware(marks[0][1]) if marks else None
    previous: datetime | None = None
    for name, time, detail in marks:
        moment = aware(time)
        out.append(
            {
                "name": name,
                "time": iso(moment),
                "since_start_s": round((moment - start).total_seconds(), 3) if start else 0.0,
                "since_prev_s": round((moment - previous).total_seconds(), 3) if previous else None,
                "detail": detail,
            }
        )
        previous = moment
    return out


def _detail(name: str, data: dict[str, Any]) -> str:
    if name == "config.submitted":
        return f"{data.get('via')}:{data.get('submitter')}"
    if name == "run.queued":
        return f"position {data.get('position')}: {data.get('reason')}"
    if name == "run.admitted":
        return str(data.get("quota_decision", ""))
    if name == "cluster.ready":
        return f"{data.get('num_nodes')} node(s), {data.get('num_gpus')} GPU, {data.get('num_cpus')} CPU"
    if name == "replicas.ready":
        return f"{data.get('dp')} × TP {data.get('tp')}: {data.get('model')}"
    if name == "run.failed":
        return f"{data.get('phase')}: {data.get('error_type')}: {data.get('message')}"
    if name == "run.cancelled":
        return f"by {data.get('requested_by')}"
    if name == "eval.requested":
        return f"step {data.get('checkpoint_step')} → {data.get('eval_run_id')}"
    if name == "run.succeeded" and data.get("score") is not None:
        return f"score {data['score']:.3f}"
    return ""


def validation(session: Session, run_id: str) -> dict[str, Any]:
    """The latest validation report of the run (the validator's verdict and every check)."""
    row = session.execute(
        select(EventRow.name, EventRow.data)
        .where(EventRow.run_id == run_id, EventRow.name.in_(("config.validated", "config.rejected")))
        .order_by(EventRow.time.desc(), EventRow.pk.desc())
        .limit(1)
    ).first()
    if row is None:
        return {"verdict": None, "checks": []}
    verdict = "validated" if row.name == "config.validated" else "rejected"
    return {"verdict": verdict, "checks": row.data.get("checks", [])}


def checkpoints(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The run's checkpoints by step, each with its eval run's state and score when one was requested."""
    rows = session.execute(
        select(CheckpointRow, RunRow.state, RunRow.score)
        .outerjoin(RunRow, RunRow.run_id == CheckpointRow.eval_run_id)
        .where(CheckpointRow.run_id == run_id)
        .order_by(CheckpointRow.step)
    ).all()
    return [
        {
            "step": c.step,
            "path": c.path,
            "format": c.format,
            "num_bytes": c.num_bytes,
            "time": iso(c.time),
            "eval_run_id": c.eval_run_id,
            "eval_state": state,
            "eval_score": score,
        }
        for c, state, score in rows
    ]


def _rates() -> tuple[Any, ...]:
    scored = func.count(TrialRow.reward)  # trials with a valid reward: errors count for neither side
    passes = func.sum(case((TrialRow.reward >= PASS_THRESHOLD, 1), else_=0))
    return func.count(), scored, passes, func.avg(cast(TrialRow.reward, Float))


def _rate(num_trials: int, scored: int, passes: int | None, mean: float | None) -> dict[str, Any]:
    passes = int(passes or 0)
    return {
        "num_trials": num_trials,
        "passes": passes,
        "pass_rate": round(passes / scored, 6) if scored else None,
        "mean_reward": _num(mean),
    }


def task_rates(session: Session, run_id: str) -> list[dict[str, Any]]:
    rows = session.execute(
        select(TrialRow.task, *_rates())
        .where(TrialRow.run_id == run_id)
        .group_by(TrialRow.task)
        .order_by(TrialRow.task)
    ).all()
    return [{"task": task, **_rate(n, scored, passes, mean)} for task, n, scored, passes, mean in rows]


def pass_rates_across(session: Session, run_ids: list[str], task: str | None) -> list[dict[str, Any]]:
    """Pass rate of each task in each of the runs (the same held-out task over checkpoints, say)."""
    query = select(TrialRow.task, TrialRow.run_id, *_rates()).where(TrialRow.run_id.in_(run_ids))
    if task is not None:
        query = query.where(TrialRow.task == task)
    rows = session.execute(query.group_by(TrialRow.task, TrialRow.run_id).order_by(TrialRow.task)).all()
    tasks: dict[str, dict[str, Any]] = {}
    for name, run_id, n, scored, passes, mean in rows:
        tasks.setdefault(name, {})[run_id] = _rate(n, scored, passes, mean)
    return [{"task": name, "runs": runs} for name, runs in tasks.items()]
